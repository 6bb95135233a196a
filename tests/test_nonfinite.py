"""NaN, inf and subnormal numbers as torch treats them, in all three forms.

Every optimizer (option sets from tests/cases.py, Muon's own) gets gradients with a NaN
in one entry, +inf in one, -inf in one, each in a parameter of its own, all three
together in another, a NaN and a -inf at the very first step, and parameters that hold
NaN and inf themselves; the functional transform, the eager class and the compiled step
must put NaN and +-inf where torch 2.13 (its default CPU path) puts them, and the finite
values within float32 rounding (two option sets per optimizer; one for the compiled step,
which runs the eager step's rule). Also sparse gradients, L-BFGS with and without a
closure, infinite options torch accepts and NaN ones it lets through. Subnormal
hyper-parameters: the guards (``eps``) give torch's numbers, the others warn at
construction; docs/bad_input.md says which is which.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from cases import CASES, case_id, functional
from jax.experimental import sparse

import lucid
from lucid.functional import lbfgs

STEPS = 4
NAN, INF = float("nan"), float("inf")
# float32, 4 steps: torch and lucid part by a few ulps (rsqrt, fused multiply-adds)
RTOL, ATOL = 2e-5, 2e-6

# parameter name -> (shape, {step: [(index, value), ...]}) of gradient entries made bad
BAD_GRADS = {
    "nan": ((5, 3), {1: [((1, 2), NAN)]}),
    "pinf": ((5, 3), {1: [((3, 0), INF)]}),
    "ninf": ((4,), {1: [((1,), -INF)]}),  # a vector: Adafactor's unfactored path
    "together": ((5, 3), {2: [((1, 2), NAN), ((3, 0), INF), ((0, 1), -INF)], 3: [((4, 2), NAN)]}),
    "first": ((4,), {0: [((0,), NAN), ((3,), -INF)]}),
    "params": ((3, 2), {}),  # NaN and inf in the parameter, finite gradients
}
BAD_PARAMS = {"params": [((0, 1), NAN), ((2, 1), INF), ((0, 0), -INF)]}
# Muon: matrices only, and a NaN or inf anywhere spoils a whole matrix's iteration
MUON_KEYS = ("nan", "pinf", "together", "params")


def _keys(name: str) -> list[str]:
    return sorted(MUON_KEYS if name == "Muon" else BAD_GRADS)


def _shape(name: str, key: str) -> tuple[int, ...]:
    # Muon: one shape for all, so its iteration compiles once
    return (5, 4) if name == "Muon" else BAD_GRADS[key][0]


def _at(shape: tuple[int, ...], index: tuple[int, ...]) -> tuple[int, ...]:
    return (0, *index) if len(shape) > len(index) else index


def initial(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    params = {}
    for key in _keys(name):
        shape = _shape(name, key)
        value = rng.normal(size=shape).astype(np.float32)
        for index, bad in BAD_PARAMS.get(key, []):
            value[_at(shape, index)] = bad
        params[key] = value
    return params


def gradients(name: str) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    steps = []
    for step in range(STEPS):
        grads = {}
        for key in _keys(name):
            shape, bad = _shape(name, key), BAD_GRADS[key][1]
            value = rng.normal(size=shape).astype(np.float32)
            for index, entry in bad.get(step, []):
                value[_at(shape, index)] = entry
            grads[key] = value
        steps.append(grads)
    return steps


def _first_and_last(name: str) -> list[tuple[str, dict]]:
    cases = [case for case in CASES if case[0] == name]
    return cases[:1] + cases[-1:] if len(cases) > 1 else cases


# two option sets per optimizer (its first and last in tests/cases.py), and Muon's
SELECTED = [case for name in dict.fromkeys(n for n, _ in CASES) for case in _first_and_last(name)]
SELECTED += [("Muon", {"lr": 0.02, "nesterov": False, "weight_decay": 0.1})]
# the compiled step runs the eager step's rule on flat buffers: one option set each
FIRST = [case for i, case in enumerate(SELECTED) if i == 0 or case[0] != SELECTED[i - 1][0]]
CLASS_CASES = [(case, False) for case in SELECTED] + [(case, True) for case in FIRST]


def _tolerance(name: str, options: dict) -> tuple[float, float]:
    if name == "Muon":  # two bfloat16 Newton-Schulz iterations part by bfloat16 ulps
        return 0.0, STEPS * options["lr"] * 2 * 8 * 2.0**-7
    return RTOL, ATOL


def run_torch(name: str, options: dict, init: dict, grads: list) -> tuple[dict, dict]:
    """torch's default path on the CPU (single-tensor), gradients set by hand."""
    params = {k: torch.tensor(v, requires_grad=True) for k, v in sorted(init.items())}
    opt = getattr(torch.optim, name)(list(params.values()), **options)
    for step in grads:
        for key, p in params.items():
            p.grad = torch.tensor(step[key])
        opt.step()
    return {k: p.detach().numpy().copy() for k, p in params.items()}, opt.state_dict()


def run_functional(name: str, options: dict, init: dict, grads: list) -> dict:
    tx = functional(name)(**options)
    params = {k: jnp.asarray(v, jnp.float32) for k, v in init.items()}
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for g in grads:
        params, state = step(params, state, {k: jnp.asarray(v, jnp.float32) for k, v in g.items()})
    return {k: np.asarray(v) for k, v in params.items()}


def run_class(name: str, options: dict, init: dict, grads: list, compiled: bool) -> tuple:
    params = {k: lucid.Parameter(jnp.asarray(v, jnp.float32)) for k, v in sorted(init.items())}
    opt = getattr(lucid.optim, name)(list(params.values()), **options)
    if compiled:
        opt = lucid.compile_optimizer(opt)
    for step in grads:
        for key, p in params.items():
            p.grad = jnp.asarray(step[key], jnp.float32)
        opt.step()
    return {k: np.asarray(p.data) for k, p in params.items()}, opt


def assert_like_torch(actual, expected, rtol: float, atol: float, what: str) -> None:
    """NaN, +inf and -inf at torch's positions; the finite values within tolerance."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    for kind, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        ours, theirs = np.argwhere(test(actual)).tolist(), np.argwhere(test(expected)).tolist()
        assert ours == theirs, f"{what}: {kind} at {ours}, torch: at {theirs}"
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=rtol, atol=atol, err_msg=what)


def assert_params_like_torch(actual: dict, expected: dict, rtol: float, atol: float) -> None:
    for key in expected:
        assert actual[key].dtype == np.float32, key
        assert_like_torch(actual[key], expected[key], rtol, atol, f"parameter {key!r}")


def assert_state_like_torch(ours: dict, theirs: dict, rtol: float, atol: float) -> None:
    assert set(ours["state"]) == set(theirs["state"])
    for index, torch_state in theirs["state"].items():
        assert set(ours["state"][index]) == set(torch_state), index
        for field, value in torch_state.items():
            what = f"state {field!r} of parameter {index}"
            expected = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            assert_like_torch(ours["state"][index][field], expected, rtol, atol, what)


def _torch_has_nonfinite(expected: dict) -> bool:
    return any(not np.isfinite(v).all() for v in expected.values())


@pytest.mark.parametrize("case", SELECTED, ids=case_id)
def test_functional_puts_nan_and_inf_where_torch_does(case):
    name, options = case
    init, grads = initial(name), gradients(name)
    expected, _ = run_torch(name, options, init, grads)
    assert _torch_has_nonfinite(expected)  # the inputs reach torch's parameters
    actual = run_functional(name, options, init, grads)
    assert_params_like_torch(actual, expected, *_tolerance(name, options))


@pytest.mark.parametrize(
    ("case", "compiled"),
    CLASS_CASES,
    ids=[f"{case_id(c)}-{'compiled' if k else 'eager'}" for c, k in CLASS_CASES],
)
def test_class_puts_nan_and_inf_where_torch_does_in_params_and_state(case, compiled):
    name, options = case
    init, grads = initial(name), gradients(name)
    expected, torch_sd = run_torch(name, options, init, grads)
    actual, opt = run_class(name, options, init, grads, compiled)
    rtol, atol = _tolerance(name, options)
    assert_params_like_torch(actual, expected, rtol, atol)
    # the state (Muon's buffer too: it averages the given gradients) to float32 rounding
    assert_state_like_torch(opt.state_dict(), torch_sd, RTOL, ATOL)


# ------------------------------------------------------------------- sparse gradients

SPARSE_INDICES = np.array([[0, 2, 2, 4, 1], [1, 0, 1, 1, 0]])  # (row, column) of 5 entries
SPARSE_BAD = {1: [(0, NAN)], 2: [(2, INF), (3, -INF)]}  # step -> (stored entry, value)
# the optimizers torch gives sparse gradients; eps=1e-40 is a guard (no warning)
SPARSE_CASES = [
    ("SparseAdam", {"lr": 0.1}),
    ("SparseAdam", {"lr": 0.1, "eps": 1e-40}),
    ("Adagrad", {"lr": 0.1, "eps": 1e-40}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
]


def _sparse_values(step: int, rng: np.random.Generator) -> np.ndarray:
    values = rng.normal(size=SPARSE_INDICES.shape[1]).astype(np.float32)
    for entry, bad in SPARSE_BAD.get(step, []):
        values[entry] = bad
    values[4] = 0.0  # a stored zero: only eps keeps its 0 / sqrt(0) finite
    return values


def _run_sparse_torch(name: str, options: dict, init: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(5)
    param = torch.tensor(init, requires_grad=True)
    opt = getattr(torch.optim, name)([param], **options)
    with torch.sparse.check_sparse_tensor_invariants():  # torch's own sparse tensors too
        for step in range(STEPS):
            values = torch.tensor(_sparse_values(step, rng))
            indices = torch.tensor(SPARSE_INDICES)
            param.grad = torch.sparse_coo_tensor(indices, values, init.shape)
            opt.step()
    return param.detach().numpy().copy()


def _bcoo(step: int, rng: np.random.Generator, shape: tuple) -> sparse.BCOO:
    values = jnp.asarray(_sparse_values(step, rng))
    return sparse.BCOO((values, jnp.asarray(SPARSE_INDICES.T)), shape=shape)


@pytest.mark.parametrize("form", ["functional", "eager", "compiled"])
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_sparse_gradients_put_nan_and_inf_where_torch_does(case, form):
    name, options = case
    init = np.random.default_rng(4).normal(size=(5, 2)).astype(np.float32)
    expected = _run_sparse_torch(name, options, init)
    assert np.isnan(expected).any() and not np.isnan(expected[1, 0])  # the stored zero
    rng = np.random.default_rng(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if form == "functional":
            tx = functional(name)(**options)
            params = jnp.asarray(init)
            state = tx.init(params)
            for step in range(STEPS):
                updates, state = tx.update(_bcoo(step, rng, init.shape), state, params)
                params = optax.apply_updates(params, updates)
            actual = np.asarray(params)
        else:
            param = lucid.Parameter(jnp.asarray(init))
            opt = getattr(lucid.optim, name)([param], **options)
            if form == "compiled":
                opt = lucid.compile_optimizer(opt)
            for step in range(STEPS):
                param.grad = _bcoo(step, rng, init.shape)
                opt.step()
            actual = np.asarray(param.data)
    assert_like_torch(actual, expected, RTOL, ATOL, f"{name}'s parameter")


# ------------------------------------------------------------------------------- LBFGS

LBFGS_INIT = np.array([-1.2, 1.0, -0.5, 0.8])
LBFGS_WEIGHTS = np.arange(1.0, 5.0)


def _run_lbfgs(options: dict, bad: float, library: str) -> tuple[np.ndarray, list[float]]:
    """Three ``step(closure)`` calls on a smooth loss whose third gradient evaluation has
    ``bad`` in one entry (torch's closure sets it on ``.grad``, lucid's too); float64."""
    evaluations = []

    def spoil() -> bool:
        evaluations.append(None)
        return len(evaluations) == 3

    if library == "torch":
        x = torch.tensor(LBFGS_INIT, requires_grad=True)
        opt = torch.optim.LBFGS([x], **options)

        def closure():
            opt.zero_grad()
            loss = ((x - 0.3) ** 2 * torch.tensor(LBFGS_WEIGHTS)).sum() + (x**4).sum()
            loss.backward()
            if spoil():
                x.grad[2] = bad
            return loss

        losses = [float(opt.step(closure).detach()) for _ in range(3)]
        return x.detach().numpy().copy(), losses
    x = lucid.Parameter(jnp.asarray(LBFGS_INIT, jnp.float64))
    opt = lucid.optim.LBFGS([x], **options)

    def loss_fn(p):
        return (((p["x"] - 0.3) ** 2) * jnp.asarray(LBFGS_WEIGHTS)).sum() + (p["x"] ** 4).sum()

    def closure():
        opt.zero_grad()
        loss = lucid.backward(loss_fn, {"x": x})
        if spoil():
            x.grad = x.grad.at[2].set(bad)
        return loss

    losses = [float(opt.step(closure)) for _ in range(3)]
    return np.asarray(x.data), losses


@pytest.mark.parametrize("bad", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    "options",
    [{}, {"line_search_fn": "strong_wolfe"}, {"max_iter": 3, "history_size": 2}],
    ids=["defaults", "strong_wolfe", "max_iter=3"],
)
def test_lbfgs_with_a_nonfinite_gradient_follows_torch(options, bad):
    """torch's L-BFGS compares NaN in its convergence tests (``max|g| <= tol``: false)
    and takes Python's ``min`` of a NaN step; lucid's full algorithm does the same."""
    expected, torch_losses = _run_lbfgs(options, bad, "torch")
    actual, losses = _run_lbfgs(options, bad, "lucid")
    assert_like_torch(actual, expected, 1e-10, 1e-13, "LBFGS's parameter")
    assert_like_torch(losses, torch_losses, 1e-10, 1e-13, "LBFGS's losses")


def _bb_step_in_torch(params: torch.Tensor, grads: list, lr: float) -> torch.Tensor:
    """The closure-less Barzilai-Borwein step of ``lucid.functional.lbfgs`` (DESIGN.md's
    formula) in torch's operations, for torch's NaN and inf semantics of each."""
    prev_p = prev_g = torch.zeros_like(params)
    for step, g in enumerate(grads):
        g = torch.tensor(g)
        if step == 0:
            direction = -g
        else:
            ratio = (params - prev_p).abs() / ((g - prev_g).abs() + 1e-10)
            direction = -torch.clamp(ratio, 0.0, 10.0) * g
        prev_p, prev_g = params, g
        params = params + lr * direction
    return params


@pytest.mark.parametrize("form", ["functional", "compiled"])
def test_lbfgs_step_without_closure_has_torchs_nan_and_inf(form):
    """The functional (and compiled) L-BFGS step against its formula in torch ops:
    ``clamp`` keeps a NaN ratio NaN, ``|inf - x|`` is inf, ``x / inf`` is 0."""
    rng = np.random.default_rng(6)
    init = rng.normal(size=(6,)).astype(np.float32)
    grads = [rng.normal(size=(6,)).astype(np.float32) for _ in range(STEPS)]
    grads[1][0], grads[1][1], grads[2][2], grads[0][3] = NAN, INF, -INF, INF
    expected = _bb_step_in_torch(torch.tensor(init), grads, 0.1).numpy()
    if form == "functional":
        tx, params = lbfgs(lr=0.1), jnp.asarray(init)
        state = tx.init(params)
        for g in grads:
            updates, state = tx.update(jnp.asarray(g), state, params)
            params = optax.apply_updates(params, updates)
        actual = np.asarray(params)
    else:
        param = lucid.Parameter(jnp.asarray(init))
        opt = lucid.compile_optimizer(lucid.optim.LBFGS([param], lr=0.1))
        for g in grads:
            param.grad = jnp.asarray(g)
            opt.step()
        actual = np.asarray(param.data)
    assert not np.isfinite(expected).all() and np.isfinite(expected).any()
    assert_like_torch(actual, expected, RTOL, ATOL, "LBFGS's parameter")


# --------------------------------------------------------------------------- subnormals

SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)  # 1.1754944e-38

# a guard XLA would flush (eps below float32's smallest normal), where a zero gradient
# entry makes torch divide 0 by it; lucid keeps the guard at the smallest normal
GUARDED = [
    ("Adam", {"lr": 0.01, "eps": 1e-40}),
    ("AdamW", {"lr": 0.01, "eps": 1e-40, "amsgrad": True}),
    ("Adamax", {"lr": 0.01, "eps": 1e-40}),
    ("NAdam", {"lr": 0.01, "eps": 1e-40}),
    ("RAdam", {"lr": 0.01, "eps": 1e-40}),
    ("RMSprop", {"lr": 0.01, "eps": 1e-40, "centered": True}),
    ("Adagrad", {"lr": 0.1, "eps": 1e-40}),
    ("Adadelta", {"eps": 1e-40}),
    # eps1 normal, its square (torch squares it in double) subnormal; a subnormal eps1
    # itself squares to 0 on both sides, and torch's rsqrt(0) * 0 is NaN there too
    ("Adafactor", {"lr": 0.05, "eps": (1e-20, 1e-3)}),
    ("Muon", {"lr": 0.02, "eps": 1e-40}),
]


def _zero_gradient_problem(name: str) -> tuple[dict, list]:
    """``z``: a gradient of zeros throughout; ``w``: one column of zeros; ``b``: one zero
    entry (Muon: matrices only)."""
    rng = np.random.default_rng(7)
    shapes = {"b": (3,), "w": (5, 3), "z": (5, 3)}
    if name == "Muon":
        shapes = {"w": (5, 3), "z": (5, 3)}
    init = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = []
    for _ in range(STEPS):
        g = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        g["z"][:] = 0.0
        g["w"][:, 1] = 0.0
        if "b" in g:
            g["b"][2] = 0.0
        grads.append(g)
    return init, grads


@pytest.mark.parametrize("form", ["functional", "eager", "compiled"])
@pytest.mark.parametrize("case", GUARDED, ids=case_id)
def test_a_subnormal_eps_gives_torchs_numbers_where_gradients_are_zero(case, form):
    name, options = case
    init, grads = _zero_gradient_problem(name)
    expected, _ = run_torch(name, options, init, grads)
    assert all(np.isfinite(v).all() for v in expected.values())  # torch: 0 / eps = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a guard needs no warning: it gives torch's numbers
        if form == "functional":
            actual = run_functional(name, options, init, grads)
        else:
            actual, _ = run_class(name, options, init, grads, compiled=form == "compiled")
    assert_params_like_torch(actual, expected, *_tolerance(name, options))


# (optimizer, options, the option's name in the warning): values XLA flushes to zero
FLUSHED = [
    ("SGD", {"lr": 1e-40}, "lr"),
    ("SGD", {"lr": 0.1, "momentum": 1e-39}, "momentum"),
    ("SGD", {"lr": 0.1, "dampening": -1e-40}, "dampening"),
    ("Adam", {"lr": jnp.asarray(1e-40, jnp.float32)}, "lr"),
    ("Adam", {"betas": (1e-40, 0.999)}, "betas[0]"),
    ("AdamW", {"weight_decay": 1e-45}, "weight_decay"),
    ("RMSprop", {"alpha": 1e-40}, "alpha"),
    ("Adagrad", {"lr_decay": 1e-40}, "lr_decay"),
    ("Adagrad", {"initial_accumulator_value": 1e-40}, "initial_accumulator_value"),
    ("Adadelta", {"rho": 1e-40}, "rho"),
    ("NAdam", {"momentum_decay": 1e-40}, "momentum_decay"),
    ("Adamax", {"betas": (0.9, 1e-40)}, "betas[1]"),
    ("RAdam", {"weight_decay": 1e-40}, "weight_decay"),
    ("ASGD", {"lambd": 1e-40}, "lambd"),
    ("Rprop", {"step_sizes": (1e-40, 50)}, "step_sizes[0]"),
    ("Adafactor", {"eps": (None, 1e-40)}, "eps[1]"),
    ("Muon", {"weight_decay": 1e-40}, "weight_decay"),
    ("SparseAdam", {"lr": 1e-40}, "lr"),
    ("LBFGS", {"lr": 1e-40}, "lr"),
]


def _flush_message(label: str, value: float) -> str:
    shown = f"{label}={value!r} is below float32's smallest normal number (1.1754944e-38)"
    return re.escape(shown)


def _value_of(options: dict, label: str) -> float:
    key, _, index = label.partition("[")
    value = options[key]
    return float(value[int(index[:-1])] if index else value)


@pytest.mark.parametrize("case", FLUSHED, ids=lambda c: f"{c[0]}-{c[2]}")
def test_a_value_xla_flushes_warns_at_construction_in_both_forms(case):
    name, options, label = case
    message = _flush_message(label, _value_of(options, label))
    with pytest.warns(UserWarning, match=message):
        functional(name)(**options)
    shape = (2, 2)
    param = lucid.Parameter(jnp.ones(shape, jnp.float32))
    with pytest.warns(UserWarning, match=message):
        opt = getattr(lucid.optim, name)([param], **options)
    if name == "LBFGS":  # one group only, as torch's
        return
    # a group added with the value warns too; the steps do not warn again
    with pytest.warns(UserWarning, match=message):
        opt.add_param_group({"params": [lucid.Parameter(jnp.ones(shape))], **options})
    if name == "SparseAdam":  # takes sparse gradients
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p in opt.param_groups[0]["params"]:
            p.grad = jnp.ones(shape, jnp.float32)
        opt.step()


def test_no_warning_for_zero_normal_values_or_guards():
    """Every option set of tests/cases.py (zeros and normal numbers), and each guard."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guards = [*GUARDED, ("Adafactor", {"eps": (1e-40, 1e-3)}), ("SparseAdam", {"eps": 1e-40})]
        for name, options in CASES + guards:
            functional(name)(**options)
            getattr(lucid.optim, name)([lucid.Parameter(jnp.ones((2, 2)))], **options)
        functional("SGD")(lr=SMALLEST_NORMAL)


def test_a_flushed_value_acts_as_zero_and_gives_torchs_numbers_to_rounding():
    """``SGD(lr=1e-40)``: lucid computes with 0 (the parameters stay exactly as they
    were); torch's ``p - 1e-40 * g`` rounds to ``p`` for every normal ``p``."""
    init = {"w": np.random.default_rng(8).normal(size=(5, 3)).astype(np.float32)}
    grads = [{"w": np.ones((5, 3), np.float32)}] * 2
    expected, _ = run_torch("SGD", {"lr": 1e-40}, init, grads)
    with pytest.warns(UserWarning, match="lr=1e-40"):
        actual, _ = run_class("SGD", {"lr": 1e-40}, init, grads, compiled=False)
    np.testing.assert_array_equal(actual["w"], init["w"])
    np.testing.assert_array_equal(actual["w"], expected["w"])


@pytest.mark.parametrize("form", ["functional", "eager", "compiled"])
def test_a_subnormal_parameter_is_flushed_to_zero_by_a_step(form):
    """XLA's arithmetic flushes subnormal numbers: a float32 parameter entry of 1e-39
    with a zero gradient becomes 0 at a step, where torch keeps 1e-39
    (docs/bad_input.md). Normal entries are torch's."""
    init = {"w": np.array([1e-39, -1e-39, 1.0, 0.5], np.float32)}
    grads = [{"w": np.array([0.0, 0.0, 1.0, -1.0], np.float32)}]
    expected, _ = run_torch("SGD", {"lr": 0.1}, init, grads)
    if form == "functional":
        actual = run_functional("SGD", {"lr": 0.1}, init, grads)
    else:
        actual, _ = run_class("SGD", {"lr": 0.1}, init, grads, compiled=form == "compiled")
    np.testing.assert_array_equal(expected["w"][:2], init["w"][:2])  # torch keeps them
    np.testing.assert_array_equal(actual["w"][:2], [0.0, 0.0])
    np.testing.assert_allclose(actual["w"][2:], expected["w"][2:], rtol=1e-6)


@pytest.mark.parametrize("form", ["functional", "eager", "compiled"])
def test_rprop_reads_a_subnormal_gradient_or_product_as_zero_where_torch_does_not(form):
    """The documented limit of the flush for a rule that reads signs (docs/bad_input.md):
    entry 0's gradient is subnormal, torch moves it by its step size and lucid does not;
    entry 1's gradients (1e-20) are normal but their product is subnormal, so torch's
    step size grows by etaplus and lucid's stays; entry 2 is normal throughout."""
    init = {"w": np.ones(3, np.float32)}
    grads = [{"w": np.array([1e-39, 1e-20, 1.0], np.float32)}] * 3
    expected, torch_state = run_torch("Rprop", {"lr": 0.01}, init, grads)
    if form == "functional":
        actual = run_functional("Rprop", {"lr": 0.01}, init, grads)
    else:
        actual, opt = run_class("Rprop", {"lr": 0.01}, init, grads, compiled=form == "compiled")
        step_size = np.asarray(opt.state_dict()["state"][0]["step_size"])
        np.testing.assert_allclose(step_size[1], 0.01, rtol=1e-6)  # torch: 0.01 * 1.2**2
        np.testing.assert_allclose(
            torch_state["state"][0]["step_size"].numpy()[1], 0.0144, rtol=1e-6
        )
    np.testing.assert_allclose(expected["w"][:2], [0.97, 1 - 0.01 - 0.012 - 0.0144], rtol=1e-6)
    np.testing.assert_array_equal(actual["w"][0], 1.0)
    np.testing.assert_allclose(actual["w"][1], 0.97, rtol=1e-6)
    np.testing.assert_allclose(actual["w"][2], expected["w"][2], rtol=1e-6)


# ------------------------------------------------------------ NaN and inf hyper-parameters

# infinite values torch's constructors accept, with finite gradients; all three forms
INFINITE_OPTIONS = [
    ("SGD", {"lr": INF}),
    ("SGD", {"lr": 0.05, "momentum": INF}),
    ("Adam", {"lr": 0.01, "eps": INF}),
    ("RMSprop", {"lr": 0.01, "alpha": INF}),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": INF}),
    ("ASGD", {"lr": 0.05, "t0": INF, "lambd": INF}),
    ("Rprop", {"lr": 0.01, "etas": (0.5, INF), "step_sizes": (1e-6, INF)}),
    ("Adafactor", {"lr": 0.05, "d": INF, "eps": (None, INF)}),
]


def _finite_problem() -> tuple[dict, list]:
    rng = np.random.default_rng(9)
    init = {"b": rng.normal(size=(3,)).astype(np.float32), "w": rng.normal(size=(5, 3))}
    init["w"] = init["w"].astype(np.float32)
    grads = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in init.items()}]
    return init, grads * 3


@pytest.mark.parametrize("form", ["functional", "eager", "compiled"])
@pytest.mark.parametrize("case", INFINITE_OPTIONS, ids=case_id)
def test_infinite_options_torch_accepts_give_torchs_numbers(case, form):
    name, options = case
    init, grads = _finite_problem()
    expected, _ = run_torch(name, options, init, grads)
    if form == "functional":
        actual = run_functional(name, options, init, grads)
    else:
        actual, _ = run_class(name, options, init, grads, compiled=form == "compiled")
    assert_params_like_torch(actual, expected, RTOL, ATOL)


@pytest.mark.parametrize("option", ["lr", "momentum", "weight_decay"])
def test_a_nan_option_torchs_sgd_accepts_is_refused(option):
    """torch's SGD checks ``lr < 0`` (false for NaN) and steps every parameter to NaN;
    lucid refuses a NaN wherever torch range-checks the option (docs/bad_input.md)."""
    options = {"lr": 0.1, option: NAN}
    torch.optim.SGD([torch.zeros(2, requires_grad=True)], **options)  # accepted
    with pytest.raises(ValueError, match="nan"):
        lucid.optim.SGD([lucid.Parameter(jnp.zeros(2))], **options)
    with pytest.raises(ValueError, match="nan"):
        functional("SGD")(**options)


def test_the_functional_form_cannot_move_an_infinite_parameter_across_zero():
    """An optax update is added to the parameter: ``-inf + u`` is ``-inf`` or NaN, so a
    parameter torch sends from ``-inf`` to ``+inf`` (decoupled weight decay with
    ``1 - lr * wd < 0``) is NaN in the functional form; the classes give torch's ``+inf``
    (docs/bad_input.md)."""
    options = {"lr": 0.01, "weight_decay": INF}
    init = {"w": np.array([-INF, 1.0], np.float32)}
    grads = [{"w": np.array([1.0, 1.0], np.float32)}]
    expected, _ = run_torch("AdamW", options, init, grads)
    assert np.isposinf(expected["w"][0])
    eager, _ = run_class("AdamW", options, init, grads, compiled=False)
    assert_params_like_torch(eager, expected, RTOL, ATOL)
    assert np.isnan(run_functional("AdamW", options, init, grads)["w"][0])


def test_a_loaded_group_with_a_flushed_value_warns():
    param = lucid.Parameter(jnp.ones(2, jnp.float32))
    opt = lucid.optim.Adam([param], lr=0.01)
    saved = opt.state_dict()
    saved["param_groups"][0]["weight_decay"] = 1e-41
    with pytest.warns(UserWarning, match=_flush_message("weight_decay", 1e-41)):
        opt.load_state_dict(saved)
