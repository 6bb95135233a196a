"""The eager step plans once per structure and then calls its compiled executables
directly (issue: eager lucid at torch's speed). The planned step must give the
checking step's numbers bit for bit, take the checking path again at every change
of structure, and keep torch's errors and numbers."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import CASES as ALL_CASES
from cases import case_id

import lucid
from lucid.optim._engine import eager, policy
from lucid.optim._engine.eager import EagerBackend

SHAPES = [(3, 2), (4,), (2, 2, 2), (5,)]
RNG = np.random.default_rng(0)
START = [RNG.normal(size=s) for s in SHAPES]
GRADS = [[RNG.normal(size=s) for s in SHAPES] for _ in range(5)]
CASES = [
    ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01}),
]


@pytest.fixture
def plans(monkeypatch):
    """Counts the checking path's runs (EagerBackend._plan)."""
    calls = []
    original = EagerBackend._plan

    def counted(self, groups):
        calls.append(self)
        return original(self, groups)

    monkeypatch.setattr(EagerBackend, "_plan", counted)
    return calls


def _lucid(name, options, dtype):
    params = [lucid.Parameter(jnp.asarray(v, dtype)) for v in START]
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": options["lr"] / 2}]
    return params, getattr(lucid.optim, name)(groups, **options)


def _set_grads(params, k, dtype, missing=None):
    for i, (p, g) in enumerate(zip(params, GRADS[k % len(GRADS)])):
        p.grad = None if i == missing else jnp.asarray(g, dtype)


def _snapshot(params, opt):
    values = [np.asarray(p.data) for p in params]
    states = {i: {k: np.asarray(v) for k, v in s.items()} for i, s in enumerate(opt.state.values())}
    return values, states


@pytest.mark.parametrize("name,options", CASES, ids=[c[0] for c in CASES])
def test_planned_steps_equal_checked_steps_bit_for_bit(name, options, plans):
    planned_params, planned = _lucid(name, options, np.float32)
    checked_params, checked = _lucid(name, options, np.float32)
    for k in range(5):
        missing = 1 if k == 3 else None  # a step with one gradient missing
        for params, opt in ((planned_params, planned), (checked_params, checked)):
            _set_grads(params, k, np.float32, missing)
            if k == 2:
                opt.param_groups[0]["lr"] *= 0.5  # a new value, the same structure
            if opt is checked:  # loading states forgets the plans: the checking path
                opt.backend.load(opt.backend.states())
            opt.step()
    ours, theirs = _snapshot(planned_params, planned), _snapshot(checked_params, checked)
    for a, b in zip(ours[0], theirs[0]):
        np.testing.assert_array_equal(a, b, strict=True)
    assert ours[1].keys() == theirs[1].keys()
    for i in ours[1]:
        assert ours[1][i].keys() == theirs[1][i].keys()
        for key in ours[1][i]:
            np.testing.assert_array_equal(ours[1][i][key], theirs[1][i][key], strict=True)
    # planned: its first step, then the step whose gradient went missing and the one after
    assert sum(b is planned.backend for b in plans) == 3
    assert sum(b is checked.backend for b in plans) == 5


@pytest.mark.parametrize(
    "bad,message",
    [
        (jnp.zeros((4, 1)), "a gradient of shape \\(4, 1\\) was given for a parameter of shape"),
        (jnp.zeros((4,), jnp.int32), "a gradient of dtype int32 was given"),
    ],
    ids=["shape", "dtype"],
)
def test_a_wrong_gradient_after_planned_steps_raises_and_changes_nothing(bad, message, plans):
    params, opt = _lucid("Adam", {"lr": 0.01}, np.float64)
    for k in range(2):
        _set_grads(params, k, np.float64)
        opt.step()
    before = _snapshot(params, opt)
    params[1].grad = bad
    with pytest.raises(ValueError, match=message):
        opt.step()
    after = _snapshot(params, opt)
    for a, b in zip(before[0], after[0]):
        np.testing.assert_array_equal(a, b, strict=True)
    for i in before[1]:
        for key in before[1][i]:
            np.testing.assert_array_equal(before[1][i][key], after[1][i][key], strict=True)
    _set_grads(params, 2, np.float64)
    opt.step()  # the right gradient again: the step goes on
    assert len(plans) == 3  # the first step, the refused one, the one after


def test_planned_steps_follow_torch_through_changes_of_structure():
    tparams = [torch.tensor(v, requires_grad=True) for v in START]
    topt = torch.optim.AdamW(
        [{"params": tparams[:2]}, {"params": tparams[2:3], "lr": 0.005}], lr=0.01
    )
    params, _ = _lucid("AdamW", {"lr": 0.01}, np.float64)
    opt = lucid.optim.AdamW([{"params": params[:2]}, {"params": params[2:3], "lr": 0.005}], lr=0.01)

    def step(k, missing=None):
        for i, (p, tp, g) in enumerate(zip(params, tparams, GRADS[k % len(GRADS)])):
            p.grad = None if i == missing else jnp.asarray(g)
            tp.grad = None if i == missing else torch.tensor(g)
        opt.step()
        topt.step()
        for p, tp in zip(params, tparams):
            chex.assert_trees_all_close(
                np.asarray(p.data), tp.detach().numpy(), rtol=1e-10, atol=1e-12
            )

    step(0)
    step(1)
    step(2, missing=0)  # a gradient missing
    step(3)
    opt.param_groups[1]["params"].append(params[3])  # a parameter appended
    topt.param_groups[1]["params"].append(tparams[3])
    step(4)
    opt.param_groups[0]["amsgrad"] = True  # a flag turned on: torch's KeyError
    topt.param_groups[0]["amsgrad"] = True
    for p, tp, g in zip(params, tparams, GRADS[0]):
        p.grad, tp.grad = jnp.asarray(g), torch.tensor(g)
    with pytest.raises(KeyError):
        topt.step()
    with pytest.raises(KeyError, match="max_exp_avg_sq"):
        opt.step()
    opt.param_groups[0]["amsgrad"] = False
    topt.param_groups[0]["amsgrad"] = False
    step(5)
    opt.param_groups[0]["weight_decay"] = 0.2  # a new value only
    topt.param_groups[0]["weight_decay"] = 0.2
    step(6)


def _tune(monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    """The eager backend's policy with ``changes`` for this test (thresholds crossed)."""
    monkeypatch.setattr(policy, "EAGER", dataclasses.replace(policy.EAGER, **changes))


FLAT_ONLY = pytest.mark.skipif(
    not policy.EAGER.flat,
    reason="flat calls are off with this jax (numbers differ in the last bit)",
)


def test_flat_calls_are_on_with_jax_0_10_and_later():
    """The flat path runs where its numbers were checked bit for bit (jax 0.10 and
    later); with an older jax every parameter keeps its own program."""
    params, opt = _lucid("Adam", {"lr": 0.01}, np.float32)
    _set_grads(params, 0, np.float32)
    opt.step()
    flat = any(b.layout is not None for plan in opt.backend._plans for b in plan.batches)
    major_minor = tuple(int(x) for x in jax.__version__.split(".")[:2])
    assert flat == (major_minor >= (0, 10))


def _family_cases():
    """One option set per elementwise rule family of tests/cases.py (its last: the
    most options), and Adam with amsgrad."""
    last = {}
    for name, options in ALL_CASES:
        if getattr(lucid.optim, name).rule.execution.elementwise:
            last[name] = options
    return [(name, options) for name, options in last.items()] + [
        ("Adam", {"lr": 0.01, "amsgrad": True})
    ]


@FLAT_ONLY
@pytest.mark.parametrize("name,options", _family_cases(), ids=[case_id(c) for c in _family_cases()])
def test_parameters_laid_end_to_end_equal_per_parameter_calls_bit_for_bit(
    name, options, monkeypatch
):
    """An elementwise rule's small parameters run laid end to end (in calls of at
    most `Policy.chunk`); the numbers are those of the per-parameter program (every parameter
    its own update), through a missing gradient (states whose steps then differ)."""
    runs = []
    # per parameter; flat, each group in calls of 2; flat, both groups in one call
    most, calls = policy.EAGER.small, policy.EAGER.chunk
    for small, chunk in ((-1, calls), (most, 2), (most, calls)):
        _tune(monkeypatch, small=small, chunk=chunk)
        params, opt = _lucid(name, options, np.float32)
        for k in range(4):
            _set_grads(params, k, np.float32, missing=0 if k == 1 else None)
            opt.step()
        flat = any(b.layout is not None for plan in opt.backend._plans for b in plan.batches)
        assert flat == (small > 0)  # the path this run promises to take
        runs.append(_snapshot(params, opt))
    (values_1, states_1), *flat_runs = runs
    for values_flat, states_flat in flat_runs:
        for a, b in zip(values_1, values_flat):
            np.testing.assert_array_equal(a, b, strict=True)
        assert states_1.keys() == states_flat.keys()
        for i in states_1:
            assert states_1[i].keys() == states_flat[i].keys()
            for key in states_1[i]:
                np.testing.assert_array_equal(states_1[i][key], states_flat[i][key], strict=True)


@FLAT_ONLY
@pytest.mark.parametrize(
    "name,options",
    [*_family_cases(), ("RAdam", {"lr": 0.01, "betas": (0.9, 0.9999)})],
    ids=[case_id(c) for c in _family_cases()] + ["RAdam-worst"],
)
def test_many_parameters_in_one_flat_call_equal_per_parameter_calls_bit_for_bit(
    name, options, monkeypatch
):
    """40 parameters of mixed shapes in two groups, laid end to end in one call, give
    the per-parameter program's numbers (XLA fuses a larger call otherwise)."""
    rng = np.random.default_rng(1)
    shapes = [(1 + i % 5, 1 + i % 3) if i % 2 else (1 + i % 7,) for i in range(40)]
    start = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(2)]
    runs = []
    for small in (-1, policy.EAGER.small):
        _tune(monkeypatch, small=small)
        params = [lucid.Parameter(jnp.asarray(v)) for v in start]
        groups = [{"params": params[:25]}, {"params": params[25:], "lr": options["lr"] / 3}]
        opt = getattr(lucid.optim, name)(groups, **options)
        for k in range(2):
            for p, g in zip(params, grads[k]):
                p.grad = jnp.asarray(g)
            opt.step()
        if small > 0:
            assert len(opt.backend._calls) == 1  # both groups in one flat call
        runs.append(_snapshot(params, opt))
    (values_1, states_1), (values_flat, states_flat) = runs
    for a, b in zip(values_1, values_flat):
        np.testing.assert_array_equal(a, b, strict=True)
    for i in states_1:
        for key in states_1[i]:
            np.testing.assert_array_equal(states_1[i][key], states_flat[i][key], strict=True)


@FLAT_ONLY
@pytest.mark.parametrize(
    "name,options", [("Adam", {"lr": 0.01}), ("SGD", {"lr": 0.05, "momentum": 0.9})]
)
def test_a_large_group_of_small_parameters_steps_in_few_calls(name, options, monkeypatch):
    """A group of n small parameters of an elementwise rule on one device runs in
    ceil(n / chunk) executable calls per step, planned once: no call per parameter."""
    _tune(monkeypatch, chunk=16)
    params = [lucid.Parameter(jnp.full((3,), i, jnp.float32)) for i in range(100)]
    opt = getattr(lucid.optim, name)([{"params": params[:60]}, {"params": params[60:]}], **options)
    for p in params:
        p.grad = jnp.ones((3,), jnp.float32)
    opt.step()
    before = opt.backend.calls
    for _ in range(3):
        opt.step()
    assert opt.backend.calls - before == 3 * (4 + 3)  # ceil(60 / 16) + ceil(40 / 16)
    assert all(len(b.params) <= 16 for plan in opt.backend._plans for b in plan.batches)


@FLAT_ONLY
def test_small_groups_share_one_call():
    """Several small groups of an elementwise rule on one device run in one call."""
    params = [lucid.Parameter(jnp.full((3,), i, jnp.float32)) for i in range(12)]
    groups = [{"params": params[i : i + 3], "lr": 0.01 * (i + 1)} for i in range(0, 12, 3)]
    opt = lucid.optim.SGD(groups, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = jnp.ones((3,), jnp.float32)
    opt.step()
    before = opt.backend.calls
    opt.step()
    assert opt.backend.calls - before == 1


def test_the_state_read_between_steps_is_the_state_stepped_on():
    """opt.state read after a step shows the flat state cut per parameter; a write into
    it reaches the next step (the flat state is rebuilt from it)."""
    params, opt = _lucid("SGD", {"lr": 0.05, "momentum": 0.9}, np.float32)
    _set_grads(params, 0, np.float32)
    opt.step()
    buffers = [np.asarray(opt.state[p]["momentum_buffer"]) for p in params]
    for p, g, b in zip(params, GRADS[0], buffers):
        np.testing.assert_array_equal(b, np.asarray(g, np.float32))  # torch's first buffer
        assert b.shape == p.shape
    opt.state[params[1]]["momentum_buffer"] = jnp.zeros(params[1].shape, jnp.float32)
    before = np.asarray(params[1].data)
    _set_grads(params, 1, np.float32)
    opt.step()
    # buffer 0.9 * 0 + g: the step moved by lr * g exactly as from a zero buffer
    expected = before - np.float32(0.05) * np.asarray(GRADS[1][1], np.float32)
    chex.assert_trees_all_close(np.asarray(params[1].data), expected, rtol=1e-6)


@pytest.mark.parametrize("name,options", _family_cases(), ids=[case_id(c) for c in _family_cases()])
def test_a_group_in_one_call_equals_calls_of_one_parameter_bit_for_bit(name, options):
    """Every parameter of a group in one call of its program (as a step runs a group
    whose parameters are not laid end to end) gives the numbers of one call per
    parameter (as a step split them before) bit for bit."""
    from lucid.functional._apply import hyper_values
    from lucid.optim._engine.state import begin, packed_hyper

    opt = getattr(lucid.optim, name)([lucid.Parameter(jnp.zeros(2))], **options)
    rule, group = opt.rule, opt.param_groups[0]
    names, values, flags = hyper_values(rule, group)
    program = eager.group_program(rule, tuple(sorted(flags.items())), names)
    vector = np.asarray(values, np.float32)
    params = [jnp.asarray(v, jnp.float32) for v in START]
    grads = [jnp.asarray(g, jnp.float32) for g in GRADS[0]]
    states = [begin(rule, flags, packed_hyper(rule, group), None, p) for p in params]
    together = program(vector, params, grads, states)
    for i in range(len(params)):
        alone = program(vector, [params[i]], [grads[i]], [states[i]])
        chex.assert_trees_all_equal(
            jax.tree_util.tree_map(np.asarray, (together[0][i], together[1][i])),
            jax.tree_util.tree_map(np.asarray, (alone[0][0], alone[1][0])),
        )


@FLAT_ONLY
@pytest.mark.parametrize(
    "name,options",
    [("SGD", {"lr": 0.05, "momentum": 0.9}), ("Adam", {"lr": 0.01, "amsgrad": True})],
)
@pytest.mark.parametrize("inline", [True, False], ids=["apart", "in_pieces"])
def test_flat_state_in_pieces_or_apart_equals_per_parameter_calls_bit_for_bit(
    name, options, inline, monkeypatch
):
    """A flat call keeps each state field in pieces of at most `Policy.piece_bytes` (here
    several pieces of several members), or, where XLA would run the call inline, every
    member's fields apart; either way the numbers are the per-parameter program's."""
    rng = np.random.default_rng(2)
    shapes = [(1 + i % 4, 5) if i % 3 else (7 + i % 5,) for i in range(18)]
    start = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(3)]
    runs = []
    for small in (-1, policy.EAGER.small):
        _tune(monkeypatch, small=small)
        _tune(monkeypatch, inline_flops=np.inf if inline else 0)
        params = [lucid.Parameter(jnp.asarray(v)) for v in start]
        opt = getattr(lucid.optim, name)([{"params": params}], **options)
        for k in range(3):
            for i, (p, g) in enumerate(zip(params, grads[k])):
                p.grad = None if (k == 1 and i == 4) else jnp.asarray(g)
            opt.step()
        if small > 0:
            batches = [b for plan in opt.backend._plans for b in plan.batches]
            for batch in batches:
                if inline:
                    assert batch.layout.starts == tuple(range(len(batch.params)))
                for a, b, _ in batch.layout.pieces:  # at most piece_bytes
                    assert sum(p.size * 4 for p in batch.params[a:b]) <= policy.EAGER.piece_bytes
            if not inline:  # somewhere several pieces of several members
                assert any(1 < len(b.layout.starts) < len(b.params) for b in batches)
        runs.append(
            [
                (np.asarray(p.data), {k: np.asarray(v) for k, v in opt.state[p].items()})
                for p in params
            ]
        )
    for (value_1, state_1), (value_flat, state_flat) in zip(*runs):
        np.testing.assert_array_equal(value_1, value_flat, strict=True)
        assert state_1.keys() == state_flat.keys()
        for key in state_1:
            np.testing.assert_array_equal(state_1[key], state_flat[key], strict=True)


@FLAT_ONLY
def test_a_small_sgd_step_runs_in_one_call_xla_runs_inline():
    """Ten SGD parameters of 16 floats: one call, every member's buffer apart, which
    XLA's cost analysis puts under its inline threshold (a call XLA:CPU hands to its
    thread pool instead costs a wake-up per step)."""
    params = [lucid.Parameter(jnp.full((16,), i, jnp.float32)) for i in range(10)]
    opt = lucid.optim.SGD(params, lr=0.01, momentum=0.9)
    for p in params:
        p.grad = jnp.ones((16,), jnp.float32)
    opt.step()
    (call,) = opt.backend._calls
    (batch,) = call.batches
    assert batch.layout.starts == tuple(range(10))
    analysis = call.run.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert analysis["flops"] < policy.EAGER.inline_flops


@FLAT_ONLY
def test_states_read_or_loaded_stay_readable_after_steps():
    """The flat state buffers are donated to the next step; a state read from the
    engine before it, or handed to it to load, stays an array of its own, unchanged."""
    params, opt = _lucid("Adam", {"lr": 0.01}, np.float32)
    _set_grads(params, 0, np.float32)
    opt.step()
    states = opt.backend.states()
    read = [states[p] for p in params]
    kept = jax.tree_util.tree_map(np.asarray, read)
    loaded_params, loaded = _lucid("Adam", {"lr": 0.01}, np.float32)
    loaded.backend.load(dict(zip(loaded_params, read)))
    for p, q in zip(params, loaded_params):
        q.data = p.data
    for _ in range(2):
        for ps, o in ((params, opt), (loaded_params, loaded)):
            _set_grads(ps, 1, np.float32)
            o.step()
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(read))
    chex.assert_trees_all_equal(jax.tree_util.tree_map(np.asarray, read), kept)
    for p, q in zip(params, loaded_params):  # the loaded optimizer stepped as the first
        np.testing.assert_array_equal(np.asarray(p.data), np.asarray(q.data), strict=True)


@FLAT_ONLY
def test_a_wrong_gradient_in_a_later_call_raises_and_changes_nothing(monkeypatch):
    """A step of several flat calls whose last refuses a gradient: torch's error, and
    the states and values of the calls before it as they were (the step's other calls
    donate nothing, so the checking path still has their inputs). Compared with a
    twin stepped alike, so that no state is read (and cached) before the refusal."""
    _tune(monkeypatch, chunk=1)  # a call per parameter
    (params, opt), (twin_params, twin) = (_lucid("Adam", {"lr": 0.01}, np.float32) for _ in "ab")
    for k in range(2):
        for ps, o in ((params, opt), (twin_params, twin)):
            _set_grads(ps, k, np.float32)
            o.step()
    assert len(opt.backend._calls) == len(params)
    params[-1].grad = jnp.zeros((5, 1), jnp.float32)
    with pytest.raises(ValueError, match="a gradient of shape \\(5, 1\\) was given"):
        opt.step()
    (values, states), (twin_values, twin_states) = (
        _snapshot(params, opt),
        _snapshot(twin_params, twin),
    )
    for a, b in zip(values, twin_values):
        np.testing.assert_array_equal(a, b, strict=True)
    assert states.keys() == twin_states.keys()
    for i in states:
        for key in states[i]:
            np.testing.assert_array_equal(states[i][key], twin_states[i][key], strict=True)
    _set_grads(params, 2, np.float32)
    opt.step()  # the right gradient again: the step goes on


@FLAT_ONLY
@pytest.mark.parametrize("name,options", [("SGD", {"lr": 0.1, "momentum": 0.9}), ("NAdam", {})])
def test_zero_dimensional_parameters_in_a_flat_call_equal_per_parameter_calls(
    name, options, monkeypatch
):
    """0-d parameters next to 1-d ones (the inline estimate tells a 0-d parameter's
    state fields from its rule's 0-d ``step``): the per-parameter program's numbers."""
    runs = []
    for small in (-1, policy.EAGER.small):
        _tune(monkeypatch, small=small)
        params = [lucid.Parameter(jnp.asarray(v, jnp.float32)) for v in (0.5, [1.0, -2.0], -1.5)]
        opt = getattr(lucid.optim, name)(params, **options)
        for k in range(3):
            for i, p in enumerate(params):
                p.grad = jnp.full(p.shape, 0.1 * (k + 1) - 0.2 * i, jnp.float32)
            opt.step()
        runs.append([np.asarray(p.data) for p in params])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b, strict=True)
