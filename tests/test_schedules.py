"""lucid.functional.schedules under jax.jit against torch.optim.lr_scheduler's sequences.

A schedule evaluated at ``count`` must equal the lr torch's scheduler shows
after ``count`` steps: to 1e-12 relative with x64 enabled (float64) and to
1e-6 without (float32), for every configuration in ``schedule_cases``.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from schedule_cases import CASES, case_id, quiet, run, torch_optimizer, torch_rows, x64

import lucid.functional as LF
import lucid.functional.schedules as S

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)

TL = torch.optim.lr_scheduler
PRECISION = {True: (jnp.float64, 1e-12), False: (jnp.float32, 1e-6)}
FUNCTIONAL_CASES = [case for case in CASES if case.functional is not None]
MOMENTUM_CASES = [case for case in CASES if case.momentum is not None]


@functools.cache
def torch_curves(case_index: int) -> tuple[np.ndarray, np.ndarray]:
    """Group 0's (lr, momentum) after construction and each step, from torch."""
    rows, _ = torch_rows(CASES[case_index])
    lrs = np.array([row[0][0] for row in rows], np.float64)
    momenta = np.array([np.nan if row[0][1] is None else row[0][1] for row in rows])
    return lrs, momenta


def evaluate(schedule: S.Schedule, steps: int, enabled: bool) -> np.ndarray:
    """The jitted schedule at counts 0..steps, in the dtype x64 ``enabled`` implies."""
    dtype, _ = PRECISION[enabled]
    with x64(enabled):
        values = jax.jit(schedule)(jnp.arange(steps + 1))
        assert values.dtype == dtype
        return np.asarray(values, np.float64)


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    chex.assert_trees_all_close(actual, expected, rtol=rtol, atol=0.0)


@pytest.mark.parametrize("enabled", [True, False], ids=["float64", "float32"])
@pytest.mark.parametrize("case", FUNCTIONAL_CASES, ids=case_id)
def test_schedule_matches_torch_under_jit(case, enabled):
    expected, _ = torch_curves(CASES.index(case))
    schedule = case.functional(case.lrs[0])
    assert_close(evaluate(schedule, case.steps, enabled), expected, PRECISION[enabled][1])


@pytest.mark.parametrize("enabled", [True, False], ids=["float64", "float32"])
@pytest.mark.parametrize("case", MOMENTUM_CASES, ids=case_id)
def test_momentum_curve_matches_torch(case, enabled):
    _, expected = torch_curves(CASES.index(case))
    actual = evaluate(case.momentum, case.steps, enabled)
    assert_close(actual, expected, PRECISION[enabled][1])


@pytest.mark.parametrize("case", FUNCTIONAL_CASES[::4], ids=case_id)
def test_scalar_counts_trace_once_and_agree_with_arrays(case):
    schedule = case.functional(case.lrs[0])
    traces = []

    def traced(count):
        traces.append(None)
        return schedule(count)

    jitted = jax.jit(traced)
    with x64(True):
        vector = np.asarray(jax.jit(schedule)(jnp.arange(case.steps + 1)))
        for count_dtype in (jnp.int32, jnp.int64):
            scalars = [float(jitted(jnp.asarray(t, count_dtype))) for t in range(case.steps + 1)]
            assert_close(np.array(scalars), vector, 1e-13)
    assert len(traces) == 2  # one trace per count dtype, none per value
    assert float(schedule(3)) == pytest.approx(vector[3], rel=1e-13)  # plain Python counts


@pytest.mark.parametrize("T_max", [300, 1000])
def test_cosine_reproduces_torch_recursion_for_long_periods(T_max):
    """Near each trough torch's recursion carries rounding that grows like T_max**2
    relative to the true cosine; the float64 closed form reproduces it."""
    steps = 2 * T_max + T_max // 3

    def build(lib, opt):
        return lib.CosineAnnealingLR(opt, T_max)

    rows, _ = run(build, TL, torch_optimizer(lrs=(0.1,)), steps)
    expected = np.array([row[0][0] for row in rows])
    actual = evaluate(S.cosine_annealing_lr(0.1, T_max), steps, True)
    assert_close(actual, expected, 1e-12)
    assert_close(evaluate(S.cosine_annealing_lr(0.1, T_max), steps, False), expected, 1e-6)


def test_noam_follows_its_formula():
    d_model, warmup, factor = 256, 25, 1.7
    expected = [
        factor * d_model**-0.5 * min(max(1, t) ** -0.5, max(1, t) * warmup**-1.5)
        for t in range(120)
    ]
    for enabled in (True, False):
        actual = evaluate(S.noam(d_model, warmup, factor), 119, enabled)
        assert_close(actual, np.array(expected), PRECISION[enabled][1])


# -- ReduceLROnPlateau as a state machine ------------------------------------------------------

METRICS = [1.0, 0.9, 0.95, 0.95, 0.94, 0.96, 0.8, 0.8, 0.81, 0.85, 0.7, 0.7, 0.9, 0.9, 0.9] * 2
PLATEAU_OPTIONS = [
    {},
    {"patience": 1},
    {"mode": "max", "patience": 1, "factor": 0.5},
    {"threshold_mode": "abs", "threshold": 0.05, "patience": 0},
    {"mode": "max", "threshold_mode": "abs", "threshold": 0.01, "patience": 0},
    {"patience": 0, "cooldown": 3, "factor": 0.5},
    {"patience": 0, "min_lr": [0.02, 0.001], "factor": 0.3},
    {"patience": 0, "factor": 0.999, "eps": 1e-4},
]


@pytest.mark.parametrize("enabled", [True, False], ids=["float64", "float32"])
@pytest.mark.parametrize("options", PLATEAU_OPTIONS, ids=str)
def test_reduce_lr_on_plateau_state_machine_matches_torch(options, enabled):
    lrs = (0.1, 0.05)

    def build(lib, opt):
        return lib.ReduceLROnPlateau(opt, **options)

    rows, torch_scheduler = run(build, TL, torch_optimizer(lrs=lrs), len(METRICS), metrics=METRICS)
    expected = np.array([[group[0] for group in row] for row in rows[1:]])
    dtype, rtol = PRECISION[enabled]
    with x64(enabled):
        plateau = S.reduce_lr_on_plateau(jnp.asarray(lrs), **options)

        @jax.jit
        def trajectory(metrics):
            def body(state, metric):
                state = plateau.update(state, metric)
                return state, (state.lr, plateau.scale(state))

            return jax.lax.scan(body, plateau.init(), metrics)

        final, (lr_path, scale_path) = trajectory(jnp.asarray(METRICS, dtype))
        assert lr_path.dtype == dtype
    assert_close(np.asarray(lr_path, np.float64), expected, rtol)
    assert_close(np.asarray(scale_path, np.float64), expected / np.array(lrs), rtol * 10)
    assert int(final.num_bad_epochs) == torch_scheduler.num_bad_epochs
    assert int(final.cooldown_counter) == torch_scheduler.cooldown_counter
    assert int(final.last_epoch) == torch_scheduler.last_epoch
    np.testing.assert_allclose(float(final.best), torch_scheduler.best, rtol=rtol)


# -- a schedule as a functional optimizer's lr ------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "build"),
    [
        (S.step_lr(0.1, 3, 0.5), lambda opt: TL.StepLR(opt, 3, 0.5)),
        (S.one_cycle_lr(0.1, 12), lambda opt: TL.OneCycleLR(opt, 0.1, 12, cycle_momentum=False)),
        (
            S.cyclic_lr(0.01, 0.1, 2),
            lambda opt: TL.CyclicLR(opt, 0.01, 0.1, 2, cycle_momentum=False),
        ),
    ],
    ids=["step", "one-cycle", "cyclic"],
)
def test_schedule_as_lr_gives_torchs_trajectory(schedule, build):
    """optimizer.step(); scheduler.step() in torch == the transform evaluating the
    schedule at the number of updates done so far."""
    target = np.array([1.0, -2.0, 0.5])
    weight = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    with quiet():
        scheduler = build(optimizer)
        expected = []
        for _ in range(12):
            optimizer.zero_grad()
            ((weight - torch.as_tensor(target)) ** 2).sum().backward()
            optimizer.step()
            scheduler.step()
            expected.append(weight.detach().numpy().copy())

    tx = LF.sgd(lr=schedule, momentum=0.9)
    with x64(True):
        params = jnp.zeros(3, jnp.float64)
        state = tx.init(params)

        @jax.jit
        def step(params, state):
            grads = 2 * (params - target)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        actual = []
        for _ in range(12):
            params, state = step(params, state)
            actual.append(np.asarray(params))
    assert_close(np.array(actual), np.array(expected), 1e-12)


# -- validation --------------------------------------------------------------------------------

INVALID = [
    (lambda: S.constant_lr(0.1, factor=1.5), "Constant multiplicative factor expected"),
    (lambda: S.linear_lr(0.1, start_factor=0.0), "Starting multiplicative factor expected"),
    (lambda: S.linear_lr(0.1, end_factor=-1.0), "Ending multiplicative factor expected"),
    (lambda: S.cosine_annealing_warm_restarts(0.1, 0), "Expected positive integer T_0, but got 0"),
    (lambda: S.cosine_annealing_warm_restarts(0.1, 3, 0), "Expected integer T_mult >= 1"),
    (lambda: S.cyclic_lr(0.1, 1.0, mode="saw"), "mode is invalid and scale_fn is None"),
    (lambda: S.cyclic_momentum(mode="saw"), "mode is invalid and scale_fn is None"),
    (lambda: S.one_cycle_lr(0.1), "You must define either total_steps OR"),
    (lambda: S.one_cycle_lr(0.1, 10, pct_start=2.0), "Expected float between 0 and 1 pct_start"),
    (lambda: S.one_cycle_lr(0.1, 10, anneal_strategy="exp"), "anneal_strategy must be one of"),
    (lambda: S.one_cycle_momentum(epochs=0, steps_per_epoch=2), "positive integer epochs"),
    (lambda: S.reduce_lr_on_plateau(factor=1.0), "Factor should be < 1.0."),
    (lambda: S.reduce_lr_on_plateau(mode="up"), "mode up is unknown!"),
    (lambda: S.reduce_lr_on_plateau(threshold_mode="x"), "threshold mode x is unknown!"),
    (lambda: S.noam(0, 10), "Expected positive d_model, but got 0"),
    (lambda: S.step_lr(0.1, 0), "step_size must be nonzero"),
    (lambda: S.cosine_annealing_lr(0.1, 0), "T_max must be nonzero"),
    (lambda: S.sequential([], []), "expects at least one scheduler"),
    (lambda: S.sequential([S.step_lr(0.1, 2)], [3]), "one more than the number of milestone"),
    (lambda: S.chained(0.1, []), "at least one schedule"),
]


@pytest.mark.parametrize(("make", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_arguments_raise_torchs_value_errors(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_schedules_compute_in_the_default_float_dtype():
    schedule = S.exponential_lr(0.1, 0.9)
    with x64(False):
        assert schedule(3).dtype == jnp.float32
        assert jax.jit(schedule)(jnp.asarray(3, jnp.int32)).dtype == jnp.float32
    with x64(True):
        assert schedule(3).dtype == jnp.float64
