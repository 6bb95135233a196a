"""Muon with ``batched_matrices=True``: a ``(..., M, N)`` parameter as a stack of matrices.

The oracle is torch.optim.Muon run on each ``(M, N)`` slice alone, as its own 2-D
parameter: every slice of lucid's parameter (and of its momentum buffer) must equal
torch's. The loss couples the entries of a slice (``tanh(X_s @ P_s)``) but not the
slices, so each slice's gradient is the one torch computes for its own parameter.

As in ``test_muon.py``, float64 runs put the Newton-Schulz iteration in float64 on both
sides (torch's own function, one token changed), so momentum, Nesterov, weight decay,
the per-slice lr adjustment and the iteration agree to 1e-10; the real bfloat16
optimizer in float32 is held to the same bfloat16 ulp budget per step as the 2-D tests.
"""

from __future__ import annotations

import inspect
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.optim._muon as torch_muon
from oracle import F64_RTOL, error_of, relative_error, torch_default_dtype
from test_muon import MUON_F64, TORCH_NS_F64

import lucid
from lucid.functional._apply import transform
from lucid.functional.muon import lr_ratio, muon

STEPS = 5

# two parameters of one 3-D shape (the engine stacks same-shaped parameters: a vmap
# over parameters around the vmap over slices), 4-D, a single slice, a tall and a wide
# slice shape, and a plain 2-D matrix in the same group
SHAPES = {
    "a": (3, 8, 5),
    "a2": (3, 8, 5),
    "b": (2, 2, 6, 6),
    "c": (1, 4, 9),
    "m": (6, 4),
}
ROWS = 7  # rows of each slice's input X_s


def _problem() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {k: rng.normal(size=s) * 0.5 for k, s in SHAPES.items()}


def _data() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(4)
    return {
        k: (rng.normal(size=(*s[:-2], ROWS, s[-2])), rng.normal(size=(*s[:-2], ROWS, s[-1])))
        for k, s in SHAPES.items()
    }


DATA = _data()


def _loss_jax(params):
    total = 0.0
    for k, p in params.items():
        x, y = (jnp.asarray(v, p.dtype) for v in DATA[k])
        total = total + jnp.sum((jnp.tanh(x @ p) - y) ** 2) / ROWS + 0.05 * jnp.sum(p**4)
    return total


def _slices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The index of every (M, N) matrix of a parameter of ``shape``."""
    return list(itertools.product(*(range(n) for n in shape[:-2])))


def _loss_torch(slices):
    """The same loss over torch's per-slice parameters, ``{(key, index): tensor}``."""
    total = 0.0
    for (k, index), p in slices.items():
        x, y = (torch.as_tensor(v[index], dtype=p.dtype) for v in DATA[k])
        total = total + torch.sum((torch.tanh(x @ p) - y) ** 2) / ROWS + 0.05 * torch.sum(p**4)
    return total


def _has_spectral_unclamped() -> bool:
    return (
        error_of(lambda: torch.optim.Muon([torch.zeros(2, 2)], adjust_lr_fn="spectral_unclamped"))
        is None
    )


def _torch_groups(slices, options):
    """One group per slice: torch's options, or, for ``'spectral_unclamped'`` on a torch
    that lacks it (2.13), 2.13's ``'original'`` with the slice's ``lr`` scaled by
    ``sqrt(A/B) / sqrt(max(1, A/B))`` and ``weight_decay`` divided by it (the decay's lr
    stays unadjusted), as ``test_muon.py`` checks 2.15's option."""
    groups = []
    emulate = options.get("adjust_lr_fn") == "spectral_unclamped" and not _has_spectral_unclamped()
    for p in slices.values():
        group = {"params": [p]}
        if emulate:
            rows, cols = p.shape
            scale = math.sqrt(rows / cols) / math.sqrt(max(1, rows / cols))
            group.update(
                lr=options["lr"] * scale,
                weight_decay=options["weight_decay"] / scale,
                adjust_lr_fn="original",
            )
        groups.append(group)
    return groups


def _run_torch(options, dtype, steps=STEPS):
    """torch's Muon on every slice as its own 2-D parameter: the final slices and buffers."""
    tdtype = {"float64": torch.float64, "float32": torch.float32}[dtype]
    with torch_default_dtype(tdtype):
        slices = {
            (k, i): torch.tensor(v[i], dtype=tdtype, requires_grad=True)
            for k, v in _problem().items()
            for i in _slices(v.shape)
        }
        defaults = {**options}
        if defaults.get("adjust_lr_fn") == "spectral_unclamped" and not _has_spectral_unclamped():
            defaults["adjust_lr_fn"] = "original"  # each group says so (_torch_groups)
        opt = torch.optim.Muon(_torch_groups(slices, options), **defaults)
        for _ in range(steps):
            opt.zero_grad()
            _loss_torch(slices).backward()
            opt.step()
    values = {key: p.detach().numpy().copy() for key, p in slices.items()}
    buffers = {key: opt.state[p]["momentum_buffer"].numpy().copy() for key, p in slices.items()}
    return values, buffers


def _run_lucid(options, dtype, form, steps=STEPS):
    """lucid's Muon with ``batched_matrices=True`` in ``form``: final values and buffers."""
    options = {**options, "batched_matrices": True}
    init = {k: jnp.asarray(v, dtype) for k, v in _problem().items()}
    if form == "functional":
        rule = lucid.optim.Muon.rule  # MUON_F64 under the float64 fixture
        defaults = {k: v.default for k, v in inspect.signature(muon).parameters.items()}
        tx = transform(rule, {**defaults, **options})
        state = tx.init(init)

        @jax.jit
        def step(params, state):
            updates, state = tx.update(jax.grad(_loss_jax)(params), state, params)
            return optax.apply_updates(params, updates), state

        params = init
        for _ in range(steps):
            params, state = step(params, state)
        return {k: np.asarray(v) for k, v in params.items()}, {
            k: np.asarray(v) for k, v in state.momentum_buffer.items()
        }
    params = {k: lucid.Parameter(v) for k, v in init.items()}
    opt = lucid.optim.Muon(list(params.values()), **options)
    fused = None
    if form == "compiled":
        lucid.compile_optimizer(opt)
    elif form == "fused":
        fused = lucid.optim.fused_step(_loss_jax, opt)
    for _ in range(steps):
        if fused is not None:
            fused(params)
            continue
        opt.zero_grad()
        lucid.backward(_loss_jax, params)
        opt.step()
    return {k: np.asarray(p.data) for k, p in params.items()}, {
        k: np.asarray(opt.state[p]["momentum_buffer"]) for k, p in params.items()
    }


def _assert_slices(actual, expected, tolerance):
    """Every slice of lucid's arrays against torch's per-slice arrays; ``tolerance(key,
    index)`` is the relative (to the slice's largest entry) error allowed."""
    for (k, index), theirs in expected.items():
        ours = actual[k][index]
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (k, index)
        err = relative_error(ours, theirs)
        assert err <= tolerance(k, index), f"{k}{list(index)}: relative error {err:.3g}"


@pytest.fixture
def float64_ns(monkeypatch):
    """Both sides run the iteration in float64 for the duration of a test."""
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", TORCH_NS_F64)
    monkeypatch.setattr(lucid.optim.Muon, "rule", MUON_F64)


ADJUST = [None, "original", "match_rms_adamw", "spectral_unclamped"]
FORMS = ["functional", "eager", "compiled", "fused"]


@pytest.mark.parametrize("adjust_lr_fn", ADJUST, ids=str)
@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
def test_each_slice_float64_is_torchs_muon_on_that_slice_in_every_form(
    nesterov, adjust_lr_fn, float64_ns
):
    options = {
        "lr": 0.02,
        "weight_decay": 0.1,
        "momentum": 0.9,
        "nesterov": nesterov,
        "adjust_lr_fn": adjust_lr_fn,
    }
    values, buffers = _run_torch(options, "float64")
    for form in FORMS:
        ours, our_buffers = _run_lucid(options, "float64", form)
        assert {k: v.shape for k, v in ours.items()} == SHAPES
        assert {k: v.shape for k, v in our_buffers.items()} == SHAPES  # state: the param's
        try:
            _assert_slices(ours, values, lambda k, i: F64_RTOL)
            _assert_slices(our_buffers, buffers, lambda k, i: 1e-9)
        except AssertionError as error:
            raise AssertionError(f"{form}: {error}") from None


def test_checkpoints_of_batched_matrices_move_between_eager_and_compiled(float64_ns):
    """3 eager steps, the state_dict loaded into a fresh compiled optimizer, 2 more steps:
    torch's 5 steps per slice (the state_dict's buffer has the parameter's shape, and its
    group says ``batched_matrices``)."""
    options = {"lr": 0.02, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    values, buffers = _run_torch(options, "float64")
    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in _problem().items()}
    opt = lucid.optim.Muon(list(params.values()), **options, batched_matrices=True)
    for _ in range(3):
        opt.zero_grad()
        lucid.backward(_loss_jax, params)
        opt.step()
    saved = opt.state_dict()
    assert saved["param_groups"][0]["batched_matrices"] is True
    for index, key in enumerate(params):
        assert saved["state"][index]["momentum_buffer"].shape == SHAPES[key]
    fresh = lucid.optim.Muon(list(params.values()), **options, batched_matrices=True)
    lucid.compile_optimizer(fresh)
    fresh.load_state_dict(saved)
    for _ in range(2):
        fresh.zero_grad()
        lucid.backward(_loss_jax, params)
        fresh.step()
    _assert_slices(
        {k: np.asarray(p.data) for k, p in params.items()}, values, lambda k, i: F64_RTOL
    )
    our_buffers = {k: np.asarray(fresh.state[p]["momentum_buffer"]) for k, p in params.items()}
    _assert_slices(our_buffers, buffers, lambda k, i: 1e-9)


def test_the_option_off_is_torchs_2d_rule_and_its_state_dict_is_torchs():
    """Off (the default), a 3-D parameter is torch's ValueError in every form, at
    construction and at a step after ``add_param_group``; and a 2-D optimizer's state_dict
    groups are torch's key for key (the option is left out at its default)."""
    shape = (3, 8, 5)
    kind, message = error_of(lambda: torch.optim.Muon([torch.zeros(shape, requires_grad=True)]))
    # torch writes the size as torch.Size([3, 8, 5]), lucid as (3, 8, 5)
    expected = (kind, message.replace("torch.Size([3, 8, 5])", str(shape)))
    assert expected[1].endswith("size: (3, 8, 5)")
    assert error_of(lambda: lucid.optim.Muon([lucid.Parameter(jnp.zeros(shape))])) == expected
    assert error_of(lambda: muon().init({"w": jnp.zeros(shape)})) == expected
    assert error_of(lambda: muon(batched_matrices=False).init({"w": jnp.zeros(shape)})) == expected

    tw, tz = torch.ones(2, 2, requires_grad=True), torch.ones(shape, requires_grad=True)
    topt = torch.optim.Muon([tw])
    topt.add_param_group({"params": [tz]})
    tw.grad, tz.grad = torch.ones(2, 2), torch.ones(shape)
    step_error = error_of(topt.step)
    assert step_error is not None
    for compiled in (False, True):
        w, z = lucid.Parameter(jnp.ones((2, 2))), lucid.Parameter(jnp.ones(shape))
        opt = lucid.optim.Muon([w])
        opt.add_param_group({"params": [z]})
        if compiled:
            lucid.compile_optimizer(opt)
        w.grad, z.grad = jnp.ones((2, 2)), jnp.ones(shape)
        assert error_of(opt.step) == step_error
        assert not opt.state and np.all(np.asarray(w.data) == 1.0)

    w = lucid.Parameter(jnp.ones((2, 2)))
    opt = lucid.optim.Muon([w], lr=0.02)
    w.grad = jnp.eye(2)
    opt.step()
    tw = torch.ones(2, 2, requires_grad=True)
    topt = torch.optim.Muon([tw], lr=0.02)
    tw.grad = torch.eye(2)
    topt.step()
    assert opt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]
    assert opt.param_groups[0]["batched_matrices"] is False
    # a torch state_dict (no such key) loads, and the group takes the optimizer's default
    batched = lucid.optim.Muon([w], lr=0.02, batched_matrices=True)
    batched.load_state_dict(topt.state_dict())
    assert batched.param_groups[0]["batched_matrices"] is True


def test_the_option_on_refuses_what_is_not_a_matrix_in_words_and_changes_nothing():
    vector = lucid.Parameter(jnp.ones(3))
    with pytest.raises(ValueError, match=r"at least 2 dimensions .* size: \(3,\)"):
        lucid.optim.Muon([vector], batched_matrices=True)
    with pytest.raises(ValueError, match=r"at least 2 dimensions"):
        muon(batched_matrices=True).init({"w": jnp.ones(3)})
    w = lucid.Parameter(jnp.ones((2, 2, 2)))
    opt = lucid.optim.Muon([w], batched_matrices=True)
    opt.add_param_group({"params": [vector]})
    w.grad, vector.grad = jnp.ones((2, 2, 2)), jnp.ones(3)
    with pytest.raises(ValueError, match=r"at least 2 dimensions"):
        opt.step()
    assert not opt.state and np.all(np.asarray(w.data) == 1.0)
    with pytest.raises(TypeError, match="batched_matrices must be True or False"):
        lucid.optim.Muon([w], batched_matrices=1)


def test_bfloat16_iteration_float32_slices_within_the_ulp_budget():
    """The real optimizer (bfloat16 iteration) in float32, eager and compiled, against
    torch's per slice: each step may move an entry by 8 bfloat16 ulps of the iteration's
    output (at most ~1.5, so ulp 2**-7) times the slice's adjusted lr, the budget of
    ``test_muon.py``'s float32 test."""
    options = {"lr": 0.02, "adjust_lr_fn": "match_rms_adamw"}
    values, _ = _run_torch(options, "float32")

    def tolerance(k, index):
        allowed = STEPS * options["lr"] * lr_ratio("match_rms_adamw", SHAPES[k][-2:]) * 8 * 2.0**-7
        return allowed / np.abs(values[(k, index)]).max()

    for form in ("eager", "compiled"):
        ours, _ = _run_lucid(options, "float32", form)
        assert all(v.dtype == np.float32 for v in ours.values())
        _assert_slices(ours, values, tolerance)
