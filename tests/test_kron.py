"""PSGD Kron against kron-torch 0.3.3's ``Kron``, the live reference, in every form.

kron-torch draws two kinds of random numbers: the probe ``V`` of each preconditioner update
(``torch.randn_like``, torch's global generator) and the balancing draw
(``self.rng.random()``, a ``random.Random(42)``). The tests **replay its draws**: the
reference runs first with both wrapped to record what they return (``torch.randn_like``
patched for the duration of the run only; the optimizer's ``rng`` replaced by a recording
``random.Random``), then lucid runs with `lucid.functional.kron.with_draws` given a draw
function that returns, for each parameter (found by its key, `first_key` of its initial
value) and step, the recorded numbers, as constants of the compiled program. Whether the
preconditioner is updated is no draw in kron-torch (a counter against ``1/p``): lucid
computes it, and a wrong decision would move the numbers far beyond the bounds below.
kron-torch's ``torch.compile`` is off (``TORCHDYNAMO_DISABLE=1``): its functions run
eagerly, which is what the recording needs.

Bounds:

* **float64** (``precond_dtype=float64``): kron-torch solves its triangular systems in
  float32 whatever the dtype (``_solve_triangular_right``: ``.float()``). For the tight
  comparison both sides solve in float64 (kron-torch's function with the two ``.float()``
  removed, patched in for the test; lucid's rule with ``solve_dtype=float64``): every other
  operation is then float64 on both sides, and parameters and state agree to
  ``F64_RTOL = 1e-10`` relative (measured: about 1e-16).
* **float32** (kron-torch as shipped): the two sides round differently (LAPACK's ``strsm``
  and XLA's triangular solve, einsum orders, ``exp``, ``1 - b1**t`` computed in float32
  where kron-torch takes it in double). Derivation: one step's update ``P`` is clipped to
  RMS at most 1.1, so ``|lr P|_2 <= 1.1 lr sqrt(n)`` for a parameter of ``n`` entries. ``P``
  is a product of at most ``2k + 1 <= 5`` factors applied to the momentum, each entry a sum
  of at most ``N = 64`` products here; with unit roundoff ``u = 2**-24`` its relative error
  is at most ``gamma = 5 N u ~ 2e-5`` times the conditioning of the factors, which stay
  within ``kappa <= 10`` of the identity over these runs (``precond_lr`` steps of size at
  most 0.3 from ``Q = I``). So each step's update differs by at most
  ``eps_step = kappa * gamma = 2e-4`` of its size, and after ``T`` steps
  ``|p_lucid - p_torch|_2 <= T * 1.1 * lr * sqrt(n) * eps_step`` (the gradients' own
  difference feeds back at ``lr`` times the loss's curvature, below 1 here). Measured
  (the defaults and the no-momentum-into-update case): at most 1/800 of the bound; the same
  runs with lucid's preconditioner in bfloat16 instead of kron-torch's float32 are 8 to 34
  times over it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # kron-torch's torch.compile: eager

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

kron_torch = pytest.importorskip("kron_torch.kron")  # the test extra pins kron-torch

from _distributed import HOST_DEVICES, run_script  # noqa: E402

import lucid  # noqa: E402
from lucid.functional.kron import (  # noqa: E402
    KRON,
    KRON_SIGNATURE,
    ProbSchedule,
    diagonal_axes,
    einsum_expressions,
    first_key,
    kron,
    merged_shape,
    precond_update_prob_schedule,
    with_draws,
)
from lucid.functional.rule import transform  # noqa: E402
from lucid.optim.kron import to_kron_torch  # noqa: E402

TESTS = Path(__file__).resolve().parent

F64_RTOL = 1e-10
EPS_STEP = 2e-4  # the float32 bound's per-step relative error of the update (docstring)
STEPS = 20
BALANCE_SEED = 563  # a random.Random whose draws fall below 0.01 at steps 3 and 15

# a 2-D (6, 4), a vector, a 3-D tensor kron-torch merges to (6, 4), a wide matrix and a
# tensor with an axis of size 1 (a diagonal factor when it is not merged away)
SHAPES = {"a": (6, 4), "b": (5,), "c": (2, 3, 4), "d": (3, 7), "e": (4, 1, 3)}


def _problem() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.normal(size=s) for k, s in sorted(SHAPES.items())}


_TARGETS = {
    k: np.random.default_rng(100 + i).normal(size=s) for i, (k, s) in enumerate(SHAPES.items())
}


def _loss_jax(p: dict[str, jax.Array]) -> jax.Array:
    return sum(
        jnp.mean((jnp.tanh(p[k]) - jnp.asarray(_TARGETS[k], p[k].dtype)) ** 2)
        + 0.05 * jnp.sum(p[k] ** 4)
        for k in sorted(p)
    )


def _loss_torch(p: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(
        torch.mean((torch.tanh(p[k]) - torch.as_tensor(_TARGETS[k], dtype=p[k].dtype)) ** 2)
        + 0.05 * torch.sum(p[k] ** 4)
        for k in sorted(p)
    )


def _schedule(**kwargs: Any) -> Any:
    """kron-torch's schedule (the reference's options) and lucid's (the same numbers)."""
    return kron_torch.precond_update_prob_schedule(**kwargs)


# every option kron-torch reads, each away from its default in some case; the schedule
# cases cross both branches (updated at steps 1-4, 6, 8, 11 and 16 of 20)
FAST_SCHEDULE = {"flat_start": 3, "decay": 0.15, "min_prob": 0.2}
CASES: list[dict[str, Any]] = [
    {"lr": 0.01},
    {"lr": 0.01, "preconditioner_update_probability": FAST_SCHEDULE, "b1": 0.8},
    {"lr": 0.01, "preconditioner_update_probability": 0.5, "weight_decay": 0.1},
    {
        "lr": 0.02,
        "preconditioner_update_probability": FAST_SCHEDULE,
        "momentum_into_precond_update": False,
        "precond_lr": 0.3,
    },
    {"lr": 0.01, "max_size_triangular": 5, "precond_init_scale": 2.0},
    {"lr": 0.01, "min_ndim_triangular": 3, "merge_dims": False, "b1": 0.0},
    {"lr": 0.01, "merge_dims": False, "weight_decay": 0.05},
    {"lr": 0.01, "memory_save_mode": "smart_one_diag"},
    {"lr": 0.01, "memory_save_mode": "one_diag", "merge_dims": False},
    {"lr": 0.01, "memory_save_mode": "all_diag"},
]


def _case_id(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items() if k != "lr") or "defaults"


def _torch_options(options: dict[str, Any], dtype: str) -> dict[str, Any]:
    out = dict(options)
    if isinstance(out.get("preconditioner_update_probability"), dict):
        out["preconditioner_update_probability"] = _schedule(
            **out["preconditioner_update_probability"]
        )
    out["precond_dtype"] = getattr(torch, dtype)
    return out


def _lucid_options(options: dict[str, Any], dtype: str) -> dict[str, Any]:
    out = dict(options)
    if isinstance(out.get("preconditioner_update_probability"), dict):
        out["preconditioner_update_probability"] = precond_update_prob_schedule(
            **out["preconditioner_update_probability"]
        )
    out["precond_dtype"] = dtype
    return out


# ------------------------------------------------------------------ the reference


def _solve_in_float64(X: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """kron-torch's ``_solve_triangular_right`` without its two ``.float()``."""
    return torch.linalg.solve_triangular(
        A, X.reshape(-1, X.size(-1)), upper=True, left=False, unitriangular=False
    ).reshape_as(X)


class _RecordingRandom:
    """kron-torch's ``self.rng``, recording each draw."""

    def __init__(self, seed: int) -> None:
        self.inner = random.Random(seed)
        self.draws: list[float] = []

    def random(self) -> float:
        value = self.inner.random()
        self.draws.append(value)
        return value


class Recorded:
    """What a reference run drew: per step, the probes in parameter order (none when the
    preconditioner was not updated), and the balancing draws."""

    def __init__(self) -> None:
        self.probes: list[list[np.ndarray]] = []
        self.balance: list[float] = []

    def updated_at(self) -> list[int]:
        return [t for t, probes in enumerate(self.probes) if probes]


@contextlib.contextmanager
def _recording(opt: Any, recorded: Recorded, seed: int, float64_solve: bool):
    """kron-torch's draws recorded during the block (and its solves in float64)."""
    opt.rng = _RecordingRandom(seed)
    original = torch.randn_like

    def randn_like(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = original(t, *args, **kwargs)
        recorded.probes[-1].append(out.detach().numpy().copy())
        return out

    torch.randn_like = randn_like
    solve = kron_torch._solve_triangular_right
    if float64_solve:
        kron_torch._solve_triangular_right = _solve_in_float64
    try:
        yield
    finally:
        torch.randn_like = original
        kron_torch._solve_triangular_right = solve
        recorded.balance += opt.rng.draws


def _repair_exprs(opt: Any) -> None:
    """kron-torch 0.3.3 cannot resume from a state_dict under torch 2.13 without this: torch's
    ``load_state_dict`` rebuilds every iterable of the state with ``type(value)(...)``, and
    ``str(generator)`` turns each of kron-torch's ``exprs`` strings into the text
    ``'<generator object ...>'``, which its next ``einsum`` refuses. This post-load repair
    recomputes them with kron-torch's own ``_init_Q_exprs`` (what a kron-torch user has
    to do too; docs/optimizers/kron.md shows it)."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p)
            if state and "momentum_buffer" in state:
                _, state["exprs"] = kron_torch._init_Q_exprs(
                    state["momentum_buffer"],
                    1.0,
                    group["max_size_triangular"],
                    group["min_ndim_triangular"],
                    group["memory_save_mode"],
                )


def _load_into_kron_torch(opt: Any, state_dict: dict) -> None:
    opt.load_state_dict(state_dict)
    _repair_exprs(opt)


def _torch_steps(opt: Any, params: dict, steps: int, recorded: Recorded, **kw: Any) -> None:
    with _recording(opt, recorded, **kw):
        for _ in range(steps):
            recorded.probes.append([])
            opt.zero_grad()
            _loss_torch(params).backward()
            with contextlib.redirect_stdout(io.StringIO()):  # its memory report
                opt.step()


def _torch_params(init: dict[str, np.ndarray], dtype: str) -> dict[str, torch.Tensor]:
    return {
        k: torch.tensor(np.array(v), dtype=getattr(torch, dtype), requires_grad=True)
        for k, v in sorted(init.items())
    }


def _groups(params: dict, groups: list[dict] | None) -> Any:
    names = sorted(params)
    if groups is None:
        return [params[k] for k in names]
    return [{**g, "params": [params[k] for k in g["params"]]} for g in groups]


def run_torch(
    options: dict[str, Any],
    dtype: str,
    steps: int = STEPS,
    groups: list[dict] | None = None,
    seed: int = BALANCE_SEED,
) -> tuple[dict[str, np.ndarray], Any, Recorded]:
    torch.manual_seed(0)
    params = _torch_params(_problem(), dtype)
    opt = kron_torch.Kron(_groups(params, groups), **options)
    recorded = Recorded()
    _torch_steps(opt, params, steps, recorded, seed=seed, float64_solve=dtype == "float64")
    return {k: v.detach().numpy().copy() for k, v in params.items()}, opt, recorded


# ------------------------------------------------------------------ the replay


def replay(recorded: Recorded, values: dict[str, Any], first_step: int = 1) -> Callable:
    """A draw function for `with_draws` returning the recorded numbers: parameter ``j``
    (in sorted order; known by `first_key` of ``values[j]``, its value when its state was
    made) at its step ``t`` gets the ``t - first_step``-th recorded probe."""
    names = sorted(values)
    steps = len(recorded.probes)
    size = max(math.prod(np.shape(v)) for v in values.values())
    probes = np.zeros((len(names), steps, size))
    for t, drawn in enumerate(recorded.probes):
        if drawn:
            assert len(drawn) == len(names)
            for j, v in enumerate(drawn):
                probes[j, t, : v.size] = v.ravel()
    dtype = recorded.probes[recorded.updated_at()[0]][0].dtype
    probes = probes.astype(dtype)  # the recorded numbers, exactly
    balance = np.asarray(recorded.balance, np.float32)
    keys = np.stack([np.asarray(first_key(jnp.asarray(values[k]))) for k in names])
    assert len({k.tobytes() for k in keys}) == len(names), "two parameters share a key"

    def draw(key: jax.Array, step: jax.Array, shape: tuple[int, ...], dtype: Any) -> tuple:
        j = jnp.argmax(jnp.all(jnp.asarray(keys) == key, axis=1))
        t = step.astype(jnp.int32) - first_step
        row = jax.lax.dynamic_index_in_dim(jnp.asarray(probes, dtype), j, 0, keepdims=False)
        row = jax.lax.dynamic_index_in_dim(row, t, 0, keepdims=False)
        return row[: math.prod(shape)].reshape(shape), jnp.asarray(balance)[t]

    return draw


def _replaying_rule(recorded: Recorded, values: dict, dtype: str, first_step: int = 1) -> Any:
    solve = jnp.float64 if dtype == "float64" else jnp.float32
    return with_draws(replay(recorded, values, first_step), solve_dtype=solve)


@contextlib.contextmanager
def _replaying(rule: Any):
    """`lucid.optim.Kron` runs ``rule`` inside the block (an optimizer built there keeps it;
    `compile_optimizer` takes the class itself only, so no subclass)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lucid.optim.Kron, "rule", rule)
        yield


def run_transform(options: dict, dtype: str, rule: Any, steps: int = STEPS) -> dict:
    tx = transform(rule, KRON_SIGNATURE.bind("kron", (), options))
    params = {k: jnp.asarray(v, dtype) for k, v in _problem().items()}
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        updates, state = tx.update(jax.grad(_loss_jax)(params), state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(steps):
        params, state = step(params, state)
    return {k: np.asarray(v) for k, v in params.items()}


def run_shell(
    options: dict,
    dtype: str,
    rule: Any,
    form: str,
    steps: int = STEPS,
    groups: list[dict] | None = None,
) -> tuple[dict[str, np.ndarray], Any]:
    """``steps`` steps of `lucid.optim.Kron` (replaying ``rule``'s draws): ``eager``,
    ``compiled`` (from the start), ``compiled_late`` (compiled after 7 eager steps) or
    ``fused`` (`fused_step`)."""
    params = {k: lucid.Parameter(jnp.asarray(v, dtype)) for k, v in _problem().items()}
    with _replaying(rule):
        opt = lucid.optim.Kron(_groups(params, groups), **options)
        fused = lucid.optim.fused_step(_loss_jax, opt) if form == "fused" else None
        for t in range(steps):
            if (form, t) in (("compiled", 0), ("compiled_late", 7)):
                lucid.compile_optimizer(opt)
            if fused is not None:
                fused(params)
                continue
            opt.zero_grad()
            lucid.backward(_loss_jax, params)
            opt.step()
    return {k: np.asarray(p.data) for k, p in params.items()}, opt


def _relative(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(float(np.linalg.norm(expected)), 1e-300)
    return float(np.linalg.norm(np.asarray(actual, np.float64) - expected)) / scale


def assert_float64_close(actual: dict, expected: dict) -> None:
    for key in expected:
        error = _relative(actual[key], expected[key])
        assert error <= F64_RTOL, f"{key}: relative error {error:.3g} > {F64_RTOL:.0e}"


def float32_bound(options: dict, shape: tuple[int, ...], steps: int) -> float:
    """The docstring's bound on ``|p_lucid - p_torch|_2`` after ``steps`` steps."""
    return steps * 1.1 * options.get("lr", 0.0003) * math.sqrt(math.prod(shape)) * EPS_STEP


def assert_float32_within(actual: dict, expected: dict, options: dict, steps: int) -> None:
    for key in expected:
        error = float(np.linalg.norm(np.asarray(actual[key], np.float64) - expected[key]))
        bound = float32_bound(options, SHAPES[key], steps)
        assert error <= bound, f"{key}: |difference| {error:.3g} > bound {bound:.3g}"


_REFERENCE_RUNS: dict[Any, Any] = {}


def reference(index: int, dtype: str) -> tuple[dict, Any, Recorded]:
    """The reference run of case ``index`` (each run once, shared by the forms)."""
    key = (index, dtype)
    if key not in _REFERENCE_RUNS:
        _REFERENCE_RUNS[key] = run_torch(_torch_options(CASES[index], dtype), dtype)
    return _REFERENCE_RUNS[key]


# ------------------------------------------------------------------ the numbers


def test_the_reference_runs_cross_both_branches_and_balance():
    """The schedule cases update at some steps and not at others, and balance twice; the
    constant-probability case every second step; the default one at every step."""
    _, _, fast = reference(1, "float64")
    assert fast.updated_at() == [0, 1, 2, 3, 5, 7, 10, 15]
    assert [t for t, u in enumerate(fast.balance) if u < 0.01] == [3, 15]
    _, _, half = reference(2, "float64")
    assert half.updated_at() == list(range(1, STEPS, 2))
    _, _, every = reference(0, "float64")
    assert every.updated_at() == list(range(STEPS))


def _fast_at(indices: Any, fast: Any, ids: list[str]) -> list:
    """``indices`` as parameters, the one equal to ``fast`` in the README's fast subset."""
    marks = {fast: pytest.mark.fast}
    return [
        pytest.param(i, id=name, marks=[marks[i]] if i in marks else [])
        for i, name in zip(indices, ids)
    ]


@pytest.mark.parametrize("index", _fast_at(range(len(CASES)), 1, [_case_id(c) for c in CASES]))
def test_transform_float64_matches_kron_torch(index):
    expected, _, recorded = reference(index, "float64")
    init = {k: jnp.asarray(v) for k, v in _problem().items()}
    rule = _replaying_rule(recorded, init, "float64")
    actual = run_transform(_lucid_options(CASES[index], "float64"), "float64", rule)
    assert_float64_close(actual, expected)


FORMS = [
    (1, "eager"),
    (1, "compiled"),
    (1, "compiled_late"),
    (1, "fused"),
    (3, "compiled"),
    (4, "eager"),
    (8, "compiled"),
]


@pytest.mark.parametrize(
    "index, form",
    [
        pytest.param(i, f, id=f"{_case_id(CASES[i])}-{f}", marks=[pytest.mark.fast] * (k == 1))
        for k, (i, f) in enumerate(FORMS)
    ],
)
def test_optimizer_float64_matches_kron_torch_in_every_form(index, form):
    expected, topt, recorded = reference(index, "float64")
    init = {k: jnp.asarray(v) for k, v in _problem().items()}
    rule = _replaying_rule(recorded, init, "float64")
    actual, opt = run_shell(_lucid_options(CASES[index], "float64"), "float64", rule, form)
    assert_float64_close(actual, expected)
    _assert_state_is_kron_torchs(opt.state_dict(), topt.state_dict(), F64_RTOL)


F32_CASES = [0, 3, 4, 5]  # the float64 tests cover every case; these each dtype path


@pytest.mark.parametrize("index", F32_CASES, ids=[_case_id(CASES[i]) for i in F32_CASES])
def test_transform_float32_within_the_derived_bound(index):
    expected, _, recorded = reference(index, "float32")
    init = {k: jnp.asarray(v, jnp.float32) for k, v in _problem().items()}
    rule = _replaying_rule(recorded, init, "float32")
    actual = run_transform(_lucid_options(CASES[index], "float32"), "float32", rule)
    assert_float32_within(actual, expected, CASES[index], STEPS)


@pytest.mark.parametrize("form", ["eager", "compiled"])
def test_optimizer_float32_within_the_derived_bound(form):
    expected, _, recorded = reference(3, "float32")
    init = {k: jnp.asarray(v, jnp.float32) for k, v in _problem().items()}
    rule = _replaying_rule(recorded, init, "float32")
    actual, _ = run_shell(_lucid_options(CASES[3], "float32"), "float32", rule, form)
    assert_float32_within(actual, expected, CASES[3], STEPS)


def test_float64_parameters_with_kron_torchs_float32_preconditioner():
    """The defaults with float64 parameters: kron-torch keeps the preconditioner (and
    the debiased momentum it preconditions) in float32; lucid too, within the float32
    bound (a float64 preconditioner would be as far from it as float32 is from float64)."""
    options = {"lr": 0.01, "b1": 0.8}
    torch.manual_seed(0)
    params = _torch_params(_problem(), "float64")
    topt = kron_torch.Kron(list(params.values()), **options)
    recorded = Recorded()
    _torch_steps(topt, params, STEPS, recorded, seed=BALANCE_SEED, float64_solve=False)
    expected = {k: v.detach().numpy() for k, v in params.items()}
    init = {k: jnp.asarray(v) for k, v in _problem().items()}
    actual = run_transform(options, "float64", with_draws(replay(recorded, init)))
    assert_float32_within(actual, expected, options, STEPS)
    assert all(topt.state[p]["Q"][0].dtype == torch.float32 for p in params.values())


def test_bfloat16_momentum_rounds_where_kron_torch_rounds():
    """``mu_dtype=bfloat16``: the buffer is rounded after each of kron-torch's in-place
    operations (``mul_``, ``add_``) and the debiased momentum once more; float32 bound."""
    options = {"lr": 0.01, "preconditioner_update_probability": 0.5}
    torch.manual_seed(0)
    params = _torch_params(_problem(), "float32")
    topt = kron_torch.Kron(list(params.values()), mu_dtype=torch.bfloat16, **options)
    recorded = Recorded()
    _torch_steps(topt, params, STEPS, recorded, seed=BALANCE_SEED, float64_solve=False)
    expected = {k: v.detach().numpy() for k, v in params.items()}
    init = {k: jnp.asarray(v, jnp.float32) for k, v in _problem().items()}
    rule = with_draws(replay(recorded, init))
    actual, opt = run_shell({**options, "mu_dtype": jnp.bfloat16}, "float32", rule, "eager")
    assert_float32_within(actual, expected, options, STEPS)
    buffers = [s["momentum_buffer"] for s in opt.state.values()]
    assert all(b.dtype == jnp.bfloat16 for b in buffers)


def test_multiple_groups_match_kron_torch():
    """Groups with their own lr, b1, weight decay and preconditioner options (one update
    probability: kron-torch reads the first group's)."""
    groups = [
        {"params": ["a", "b"], "lr": 0.02, "b1": 0.7},
        {"params": ["c", "d"], "weight_decay": 0.1, "precond_lr": 0.2, "max_size_triangular": 5},
        {"params": ["e"], "memory_save_mode": "one_diag", "merge_dims": False},
    ]
    options = {"lr": 0.01, "preconditioner_update_probability": 0.5}
    steps = 12
    expected, _, recorded = run_torch(
        _torch_options(options, "float64"), "float64", steps=steps, groups=groups
    )
    init = {k: jnp.asarray(v) for k, v in _problem().items()}
    # kron-torch orders its draws by group; lucid's replay finds each parameter by its key
    order = [k for g in groups for k in g["params"]]
    recorded.probes = [
        [dict(zip(order, drawn))[k] for k in sorted(order)] if drawn else []
        for drawn in recorded.probes
    ]
    rule = _replaying_rule(recorded, init, "float64")
    for form in ("eager", "compiled"):
        actual, _ = run_shell(
            _lucid_options(options, "float64"), "float64", rule, form, steps, groups=groups
        )
        assert_float64_close(actual, expected)


# ------------------------------------------------------------------ the state_dict


def _assert_state_is_kron_torchs(ours: dict, theirs: dict, rtol: float) -> None:
    """lucid's state_dict, converted, has kron-torch's entries, shapes, dtypes and values."""
    ours = to_kron_torch(ours)
    assert set(ours["state"]) == set(theirs["state"])
    for index, entry in theirs["state"].items():
        mine = ours["state"][index]
        assert set(mine) == set(entry), index
        assert mine["step"] == entry["step"] and isinstance(mine["step"], int)
        assert mine["exprs"] == entry["exprs"]
        if "merged_shape" in entry:
            assert mine["merged_shape"] == [int(s) for s in entry["merged_shape"]]
        pairs = [(mine["momentum_buffer"], entry["momentum_buffer"])]
        pairs += list(zip(mine["Q"], entry["Q"], strict=True))
        for a, b in pairs:
            assert a.shape == b.shape and a.dtype == b.dtype, index
            assert _relative(a.double().numpy(), b.double().numpy()) <= rtol, index
    for mine, group in zip(ours["param_groups"], theirs["param_groups"]):
        assert set(mine) == set(group)
        for name, value in group.items():
            if name == "preconditioner_update_probability" and callable(value):
                n = torch.arange(0, 2000, 7, dtype=torch.float32)
                assert torch.equal(mine[name](n), value(n))
            else:
                assert mine[name] == value, name


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_checkpoints_move_both_ways(compiled):
    """kron-torch -> lucid: a kron-torch state_dict after 5 steps, loaded into lucid and into a
    fresh kron-torch optimizer (which, as lucid, starts its counters afresh), gives the same
    next 8 steps. lucid -> kron-torch: lucid's state_dict then, converted, loaded into
    kron-torch, gives the steps kron-torch's own state_dict gives."""
    options = _torch_options(CASES[1], "float64")
    first, topt, _ = run_torch(options, "float64", steps=5)
    # a copy: torch's state_dict holds the optimizer's own tensors, and a kron-torch
    # optimizer loading it keeps them (same dtype: no copy) and updates them in place
    saved = copy.deepcopy(topt.state_dict())
    # kron-torch -> kron-torch: the oracle of the next steps
    tparams = _torch_params(first, "float64")
    resumed = kron_torch.Kron(list(tparams.values()), **options)
    _load_into_kron_torch(resumed, copy.deepcopy(saved))
    recorded = Recorded()
    _torch_steps(resumed, tparams, 8, recorded, seed=BALANCE_SEED, float64_solve=True)
    # kron-torch -> lucid
    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in sorted(first.items())}
    values = {k: p.data for k, p in params.items()}
    rule = _replaying_rule(recorded, values, "float64", first_step=6)
    with _replaying(rule):
        opt = lucid.optim.Kron(list(params.values()), **_lucid_options(CASES[1], "float64"))
        if compiled:
            lucid.compile_optimizer(opt)
        opt.load_state_dict(saved)
        for _ in range(8):
            opt.zero_grad()
            lucid.backward(_loss_jax, params)
            opt.step()
    expected = {k: v.detach().numpy() for k, v in tparams.items()}
    assert_float64_close({k: np.asarray(p.data) for k, p in params.items()}, expected)
    _assert_state_is_kron_torchs(opt.state_dict(), resumed.state_dict(), F64_RTOL)
    # lucid -> kron-torch, against kron-torch's own state_dict at the same point
    ends = {}
    for name, state_dict in (("lucid", to_kron_torch(opt.state_dict())), ("torch", None)):
        torch.manual_seed(1)
        source = {k: np.asarray(p.data) for k, p in params.items()} if state_dict else expected
        tp = _torch_params(source, "float64")
        other = kron_torch.Kron(list(tp.values()), **options)
        _load_into_kron_torch(other, copy.deepcopy(state_dict or resumed.state_dict()))
        _torch_steps(other, tp, 4, Recorded(), seed=BALANCE_SEED, float64_solve=True)
        ends[name] = {k: v.detach().numpy() for k, v in tp.items()}
    assert_float64_close(ends["lucid"], ends["torch"])


def test_kron_torch_cannot_resume_from_its_own_state_dict_without_the_repair():
    """Why the tests repair kron-torch after a load (`_repair_exprs`): a reference bug."""
    _, topt, _ = run_torch(_torch_options(CASES[0], "float32"), "float32", steps=1)
    fresh = kron_torch.Kron(list(topt.param_groups[0]["params"]), lr=0.01)
    fresh.load_state_dict(topt.state_dict())
    exprs = fresh.state[fresh.param_groups[0]["params"][0]]["exprs"]
    assert exprs[0].startswith("<generator object")
    _repair_exprs(fresh)
    assert fresh.state[fresh.param_groups[0]["params"][0]]["exprs"] == einsum_expressions(
        (False, False)
    )


def test_a_lucid_state_dict_loads_back_unchanged():
    options = _lucid_options(CASES[4], "float32")
    params = {k: lucid.Parameter(jnp.asarray(v, jnp.float32)) for k, v in _problem().items()}
    opt = lucid.optim.Kron(list(params.values()), **options)
    for _ in range(3):
        opt.zero_grad()
        lucid.backward(_loss_jax, params)
        opt.step()
    saved = opt.state_dict()
    again = lucid.optim.Kron(list(params.values()), lr=0.5)
    again.load_state_dict(saved)
    reloaded = again.state_dict()
    assert reloaded["param_groups"] == saved["param_groups"]
    for index, entry in saved["state"].items():
        assert set(reloaded["state"][index]) == set(entry)
        for name, value in entry.items():
            if name == "Q":
                for a, b in zip(reloaded["state"][index][name], value, strict=True):
                    np.testing.assert_array_equal(a, b)
            elif name in ("exprs", "merged_shape"):
                assert reloaded["state"][index][name] == value
            else:
                np.testing.assert_array_equal(reloaded["state"][index][name], value)


def test_a_state_dict_that_does_not_fit_is_refused_and_changes_nothing():
    _, topt, _ = run_torch(_torch_options(CASES[0], "float32"), "float32", steps=2)
    saved = topt.state_dict()
    params = {k: lucid.Parameter(jnp.asarray(v, jnp.float32)) for k, v in _problem().items()}

    def with_entry(**entry: Any) -> dict:
        return {**saved, "state": {**saved["state"], 0: {**saved["state"][0], **entry}}}

    q = saved["state"][0]["Q"]
    bad = [
        (with_entry(Q=[q[0]]), "must be a list of 2 factors"),
        (with_entry(Q=[torch.ones(6), q[1]]), r"axis 0 has a triangular factor of shape \(6, 6\)"),
        (with_entry(momentum_buffer=torch.ones(4, 6)), "in the merged shape"),
        (with_entry(merged_shape=[4, 6]), "preconditions it as"),
    ]
    for state_dict, message in bad:
        opt = lucid.optim.Kron(list(params.values()), lr=0.5)
        with pytest.raises(ValueError, match=message):
            opt.load_state_dict(state_dict)
        assert not opt.state and opt.param_groups[0]["lr"] == 0.5


# ------------------------------------------------------------------ the pieces


def test_the_update_probability_schedule_is_kron_torchs():
    """lucid's schedule gives kron-torch's float32 probabilities (within two ulps: XLA's and
    torch's float32 ``exp`` may differ by one, and the product rounds once more), and
    the update decisions of 6000 steps are the same."""
    for kwargs in ({}, FAST_SCHEDULE, {"max_prob": 0.9, "min_prob": 0.1, "flat_start": 0}):
        theirs = kron_torch.precond_update_prob_schedule(**kwargs)
        ours = precond_update_prob_schedule(**kwargs)
        n = np.arange(6000, dtype=np.float32)
        expected = theirs(torch.as_tensor(n)).numpy()
        actual = np.asarray(jax.jit(jax.vmap(ours))(jnp.asarray(n)))
        np.testing.assert_array_max_ulp(actual, expected, maxulp=2)
        decisions = []
        for probabilities in (expected, actual):
            counter, made = np.int32(0), []
            for p in probabilities:
                counter += 1
                made.append(bool(np.float32(counter) >= np.float32(1) / p))
                counter = np.int32(0) if made[-1] else counter
            decisions.append(made)
        assert decisions[0] == decisions[1]


SHAPE_CASES = [(5,), (1,), (6, 4), (1, 5), (9000, 2), (2, 3, 4), (4, 1, 3), (64, 3, 3)]
LAYOUT_OPTIONS = [
    (8192, 2, None),
    (5, 2, None),
    (8192, 3, None),
    (8192, 1, "smart_one_diag"),
    (8192, 2, "one_diag"),
    (8192, 2, "all_diag"),
    (8192, 2, "smart_one_diag"),
]


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("layout", LAYOUT_OPTIONS, ids=str)
def test_layout_and_expressions_are_kron_torchs(layout, merge):
    """Merged shapes, which factors are diagonal, the initial factors and kron-torch's
    einsum strings, over shapes on both sides of ``max_size_triangular`` and
    ``min_ndim_triangular``."""
    max_size, min_ndim, mode = layout
    for shape in SHAPE_CASES:
        grad = torch.zeros(shape)
        if grad.dim() > 2 and merge:
            first = [math.prod(shape[:-1]), shape[-1]]
            second = [shape[0], math.prod(shape[1:])]
            grad = grad.view(*(first if np.diff(first) <= np.diff(second) else second))
        factors, exprs = kron_torch._init_Q_exprs(grad, 1.5, max_size, min_ndim, mode)
        shape_m = merged_shape(shape, merge)
        assert shape_m == tuple(grad.shape), shape
        diag = diagonal_axes(shape_m, max_size, min_ndim, mode)
        assert diag == tuple(q.dim() == 1 for q in factors), shape
        assert einsum_expressions(diag) == tuple(exprs), shape
        hyper, flags = KRON.split(
            KRON_SIGNATURE.bind(
                "kron",
                (),
                {
                    "max_size_triangular": max_size,
                    "min_ndim_triangular": min_ndim,
                    "memory_save_mode": mode,
                    "merge_dims": merge,
                    "precond_init_scale": 1.5,
                },
            )
        )
        if math.prod(shape) > 1000:
            continue
        state = KRON.init(jnp.zeros(shape), hyper, storage_dtype=np.float32, **flags)
        ours = np.asarray(state.Q)
        np.testing.assert_allclose(ours, np.concatenate([q.numpy().ravel() for q in factors]))


def test_signature_and_defaults_are_kron_torchs():
    theirs = inspect.signature(kron_torch.Kron.__init__)
    ours = inspect.signature(lucid.optim.Kron.__init__)
    assert list(ours.parameters) == list(theirs.parameters)
    for name, parameter in theirs.parameters.items():
        assert ours.parameters[name].default == parameter.default, name
        assert ours.parameters[name].kind == parameter.kind, name
    assert list(inspect.signature(kron).parameters) == list(theirs.parameters)[2:]
    w = lucid.Parameter(jnp.ones((2, 2)))
    group = lucid.optim.Kron([w]).param_groups[0]
    assert group["preconditioner_update_probability"] == ProbSchedule(1.0, 0.03, 0.001, 500)
    tgroup = kron_torch.Kron([torch.nn.Parameter(torch.ones(2, 2))]).param_groups[0]
    assert set(group) == set(tgroup)


def _torch_error(make: Callable[[], Any]) -> BaseException | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            make()
    except Exception as error:  # the reference's error, whatever it is
        return error
    return None


def _torch_step(shape: tuple[int, ...], **options: Any) -> Callable[[], Any]:
    def make() -> None:
        p = torch.nn.Parameter(torch.ones(shape))
        opt = kron_torch.Kron([p], **options)
        p.grad = torch.ones(shape)
        opt.step()

    return make


@pytest.mark.parametrize(
    "shape, options, message",
    [
        ((2, 2), {"memory_save_mode": "two_diag"}, "Invalid memory_save_mode: two_diag"),
        ((1,) * 14, {"merge_dims": False}, "Got tensor with dim 14; Einstein runs out"),
        ((), {}, "0-d parameters"),
    ],
    ids=["memory_save_mode", "too_many_axes", "scalar"],
)
def test_what_kron_torch_refuses_is_refused_with_its_exception_type(shape, options, message):
    """kron-torch fails at the first step; lucid refuses at the first step (the optimizer,
    nothing changed) or when the transform is made / initialised, with the same exception
    type and a message naming the mistake."""
    error = _torch_error(_torch_step(shape, **options))
    assert error is not None
    kind = type(error)
    w = lucid.Parameter(jnp.ones(shape))

    def lucid_step() -> None:
        opt = lucid.optim.Kron([w], **options)
        w.grad = jnp.ones(shape)
        opt.step()

    with pytest.raises(kind, match=message):
        lucid_step()
    np.testing.assert_array_equal(np.asarray(w.data), np.ones(shape))
    with pytest.raises(kind, match=message):
        kron(**options).init({"w": jnp.ones(shape)})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"mu_dtype": "int8"}, "mu_dtype must be None or a floating dtype"),
        ({"precond_dtype": 3}, "precond_dtype must be None or a floating dtype"),
        ({"preconditioner_update_probability": "often"}, "must be None"),
        ({"max_size_triangular": 5.0}, "max_size_triangular must be an int"),
    ],
)
def test_options_kron_torch_would_fail_on_are_type_errors_at_construction(options, message):
    w = lucid.Parameter(jnp.ones((2, 2)))
    with pytest.raises(TypeError, match=message):
        lucid.optim.Kron([w], **options)
    with pytest.raises(TypeError, match=message):
        kron(**options)


def test_default_draws_are_reproducible_and_differ_between_parameters():
    """Without a replay: a run is a function of the parameters' values (the keys come from
    them), two runs agree bit for bit, and parameters of different values draw differently."""
    params = {k: jnp.asarray(v, jnp.float32) for k, v in _problem().items()}
    tx = kron(lr=0.01)
    update = jax.jit(tx.update)
    ends = []
    for _ in range(2):
        state = tx.init(params)
        p = params
        for _ in range(3):
            updates, state = update(jax.grad(_loss_jax)(p), state, p)
            p = optax.apply_updates(p, updates)
        ends.append(p)
    chex_equal = all(np.array_equal(ends[0][k], ends[1][k]) for k in params)
    assert chex_equal
    keys = [np.asarray(first_key(v)).tobytes() for v in params.values()]
    assert len(set(keys)) == len(keys)


def test_the_compiled_step_holds_a_conditional_and_no_float64():
    """The preconditioner's update is a conditional inside the float32 program (not both
    branches computed and selected), and the program holds no float64 and no host callback."""
    params = {"w": jnp.ones((6, 4), jnp.float32), "b": jnp.ones(5, jnp.float32)}
    tx = kron(lr=0.01)
    state = tx.init(params)
    text = jax.jit(tx.update).lower(params, state, params).as_text()
    assert "stablehlo.case" in text or "stablehlo.if" in text
    assert "f64" not in text
    assert "callback" not in text.lower()


# ------------------------------------------------------------------ sharded state

_SHARDED_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
    " --xla_force_host_platform_device_count=8"
)
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_enable_async_dispatch", False)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import lucid
from _distributed import sharded_bound

mesh = Mesh(np.array(jax.devices()), ("data",))
replicated = NamedSharding(mesh, P())
rng = np.random.default_rng(0)
init = {"a": rng.normal(size=(16, 8)), "b": rng.normal(size=(8,)),
        "c": rng.normal(size=(2, 4, 8)), "d": rng.normal(size=(3, 7))}

def loss(p):
    return sum(jnp.sum(jnp.tanh(v) ** 2) + 0.05 * jnp.sum(v ** 4) for v in p.values())

ends, states = {}, {}
for over in (None, "data"):
    params = {k: lucid.Parameter(jax.device_put(jnp.asarray(v), replicated))
              for k, v in init.items()}
    opt = lucid.optim.Kron(list(params.values()), lr=0.01, precond_dtype="float64",
                           preconditioner_update_probability=0.5)
    compiled = lucid.compile_optimizer(opt, shard_state_over=over)
    for _ in range(6):
        opt.zero_grad()
        lucid.backward(loss, params)
        opt.step()
    ends[over] = {k: np.asarray(p.data) for k, p in params.items()}
    states[over] = opt.state_dict()["state"]
exact = jax.__version_info__ >= (0, 10)  # each device runs the one-device programs
for k in init:
    bound = 0 if exact else sharded_bound(
        np.abs(ends[None][k]).max() + 1, np.float64, 6, terms=init[k].size
    )
    assert np.abs(ends[None][k] - ends["data"][k]).max() <= bound, k
for i, entry in states[None].items():
    for a, b in zip(entry["Q"], states["data"][i]["Q"]):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= (0 if exact else 1e-12), i
print("OK")
"""


@HOST_DEVICES
def test_sharded_state_gives_the_one_device_numbers(tmp_path):
    """`shard_state_over` works with Kron (a rule over whole parameters: each state array
    kept cut along its first axis where it divides by the 8 devices, the parameters dealt
    out whole to the devices for the step): the one-device compiled step's numbers, bit
    for bit on the newest jax; on jax 0.4.35 within docs/distributed.md's bound for a rule
    that sums over a parameter's elements in another order."""
    script = tmp_path / "kron_sharded.py"
    run_script(script, f"import sys; sys.path.insert(0, {str(TESTS)!r})\n" + _SHARDED_SCRIPT)
