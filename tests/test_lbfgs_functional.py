"""lucid.functional.lbfgs: the closure-less per-element Barzilai-Borwein step.

torch has no closure-less L-BFGS, so there is no torch oracle for this subset:
the reference is an independent NumPy implementation of DESIGN.md's formula,
driven by a hand-written NumPy gradient of the same loss (lucid's side uses
jax.grad). torch is the oracle for the constructor (signature, validation).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from oracle import F32_RTOL_FLOOR, relative_error, torch_215_parameters

import lucid
from lucid.functional.lbfgs import LBFGSState, lbfgs

STEPS = 8
SHAPES = {"b": (3,), "w": (4, 3)}  # flattened in this order: b, then w
SIZE = 15

_RNG = np.random.default_rng(11)
_INIT = {k: _RNG.normal(size=shape) for k, shape in SHAPES.items()}
_Q = _RNG.normal(size=(SIZE, SIZE))
# Symmetric positive definite and coupled, with curvatures from ~0.002 to ~3 so that the
# secant ratio |s|/|y| exceeds the clip bound 10 on some elements.
_SCALE = np.sqrt(np.geomspace(0.01, 3.0, SIZE))
_HESSIAN = _SCALE[:, None] * (_Q @ _Q.T / SIZE + 0.2 * np.eye(SIZE)) * _SCALE[None, :]
_LINEAR = _RNG.normal(size=SIZE)


def _flat(params: dict) -> list:
    return [params["b"].reshape(-1), params["w"].reshape(-1)]


def _unflat(x: np.ndarray) -> dict:
    return {"b": x[:3].reshape(SHAPES["b"]), "w": x[3:].reshape(SHAPES["w"])}


def loss_jax(params: dict) -> jax.Array:
    """``0.5 x'Hx + 0.05 sum(x^4) - c'x`` with ``x`` the flattened parameters."""
    x = jnp.concatenate(_flat(params))
    hessian = jnp.asarray(_HESSIAN, x.dtype)
    return 0.5 * x @ hessian @ x + 0.05 * jnp.sum(x**4) - jnp.asarray(_LINEAR, x.dtype) @ x


def grad_numpy(x: np.ndarray) -> np.ndarray:
    """The gradient of ``loss_jax`` by hand: ``Hx + 0.2 x^3 - c``."""
    return _HESSIAN.astype(x.dtype) @ x + 0.2 * x**3 - _LINEAR.astype(x.dtype)


def reference(lr: float, steps: int, dtype: type = np.float64) -> list[dict]:
    """DESIGN.md's rule in NumPy; the parameters after each step."""
    p = np.concatenate(_flat(_INIT)).astype(dtype)
    prev_p, prev_g = np.zeros_like(p), np.zeros_like(p)
    out = []
    for step in range(steps):
        g = grad_numpy(p)
        if step == 0:
            direction = -g
        else:
            alpha = np.clip(np.abs(p - prev_p) / (np.abs(g - prev_g) + dtype(1e-10)), 0, 10)
            direction = -alpha * g
        prev_p, prev_g = p, g
        p = p + dtype(lr) * direction
        out.append(_unflat(p))
    return out


def run_lucid(
    tx: optax.GradientTransformation,
    steps: int,
    dtype: str = "float64",
    jit: bool = True,
    loss: Callable = loss_jax,
) -> tuple[list[dict], LBFGSState]:
    def step(params, state):
        updates, state = tx.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    if jit:
        step = jax.jit(step)
    params = {k: jnp.asarray(v, dtype) for k, v in _INIT.items()}
    state = tx.init(params)
    out = []
    for _ in range(steps):
        params, state = step(params, state)
        out.append({k: np.asarray(v) for k, v in params.items()})
    return out, state


@pytest.mark.parametrize("lr", [1.0, 0.3])
def test_float64_matches_the_numpy_reference_at_every_step(lr):
    expected = reference(lr, STEPS)
    actual, state = run_lucid(lbfgs(lr=lr), STEPS)
    for step, (ours, theirs) in enumerate(zip(actual, expected, strict=True)):
        for key in SHAPES:
            err = relative_error(ours[key], theirs[key])
            assert err <= 1e-10, f"step {step + 1}, {key}: relative error {err:.3g}"
    assert float(state.step["w"]) == STEPS
    # the state holds the parameters and gradient the last update started from
    chex.assert_trees_all_close(state.prev_param, actual[-2], rtol=1e-12)
    last_grad = _unflat(grad_numpy(np.concatenate(_flat(actual[-2]))))
    chex.assert_trees_all_close(state.prev_grad, last_grad, rtol=1e-10)


def test_maximize_ascends_the_negated_loss_along_the_references_iterates():
    """torch 2.15's ``maximize`` (the keyword lucid's LBFGS takes): the gradient negated
    first, so maximizing ``-f`` is the reference's minimization of ``f``; the state holds
    the negated gradient, as torch's ``prev_flat_grad`` does."""
    expected = reference(1.0, STEPS)
    actual, state = run_lucid(lbfgs(maximize=True), STEPS, loss=lambda p: -loss_jax(p))
    for step, (ours, theirs) in enumerate(zip(actual, expected, strict=True)):
        for key in SHAPES:
            assert relative_error(ours[key], theirs[key]) <= 1e-10, (step, key)
    last_grad = _unflat(grad_numpy(np.concatenate(_flat(actual[-2]))))
    chex.assert_trees_all_close(state.prev_grad, last_grad, rtol=1e-10)


def test_the_compiled_lbfgs_step_maximizes_as_the_transform():
    """The compiled LBFGS (the closure-less step) reads ``maximize`` from its group."""
    grads = [jnp.asarray(v) * 0.5 for v in _INIT.values()]
    out = {}
    for maximize in (False, True):
        params = [lucid.Parameter(jnp.asarray(v)) for v in _INIT.values()]
        opt = lucid.optim.LBFGS(params, lr=0.5, maximize=maximize)
        compiled = lucid.compile_optimizer(opt)
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = -g if maximize else g
            compiled.step()
        out[maximize] = [np.asarray(p.data) for p in params]
    tx, params = lbfgs(lr=0.5), {k: jnp.asarray(v) for k, v in _INIT.items()}
    state = tx.init(params)
    for _ in range(3):
        updates, state = tx.update(dict(zip(_INIT, grads)), state, params)
        params = optax.apply_updates(params, updates)
    for ours, theirs, expected in zip(out[True], out[False], params.values()):
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_allclose(ours, np.asarray(expected), rtol=1e-12)


def test_the_problem_reaches_the_clip_bound():
    """The reference's secant ratio exceeds 10 on some elements (and is well below it on
    others), so a wrong or missing clip would show in the comparison above."""
    p = np.concatenate(_flat(_INIT))
    prev_p, prev_g = np.zeros_like(p), np.zeros_like(p)
    ratios = []
    for step in range(STEPS):
        g = grad_numpy(p)
        ratio = np.abs(p - prev_p) / (np.abs(g - prev_g) + 1e-10)
        if step:
            ratios.append(ratio)
        prev_p, prev_g = p, g
        p = p - (g if step == 0 else np.clip(ratio, 0, 10) * g)
    ratios = np.concatenate(ratios)
    assert np.sum(ratios > 10) >= 2 and np.any(ratios < 1)


def test_first_update_is_minus_lr_times_the_gradient():
    tx = lbfgs(lr=0.25)
    params = {k: jnp.asarray(v) for k, v in _INIT.items()}
    grads = jax.grad(loss_jax)(params)
    updates, state = tx.update(grads, tx.init(params), params)
    chex.assert_trees_all_close(updates, jax.tree_util.tree_map(lambda g: -0.25 * g, grads))
    chex.assert_trees_all_equal(state.prev_param, params)
    chex.assert_trees_all_equal(state.prev_grad, grads)


def test_jit_and_eager_agree():
    jitted, jitted_state = run_lucid(lbfgs(lr=0.5), 5)
    eager, eager_state = run_lucid(lbfgs(lr=0.5), 5, jit=False)
    chex.assert_trees_all_close(jitted, eager, rtol=1e-12)
    chex.assert_trees_all_close(jitted_state, eager_state, rtol=1e-12)


def test_float32_keeps_its_dtype_and_follows_the_reference_within_its_drift():
    """float32 against the same NumPy rule in float32 and float64: the tolerance is the
    reference's own float32-vs-float64 drift (x4; both sides round the gradient
    differently, and the secant ratio amplifies rounding), floored at 2e-6."""
    steps = 5
    exact = reference(1.0, steps)[-1]
    expected = reference(1.0, steps, np.float32)[-1]
    actual, state = run_lucid(lbfgs(), steps, "float32")
    for key in SHAPES:
        assert actual[-1][key].dtype == np.float32
        assert state.prev_param[key].dtype == jnp.float32
        assert state.prev_grad[key].dtype == jnp.float32
        drift = relative_error(expected[key], exact[key])
        tolerance = max(4 * drift, F32_RTOL_FLOOR)
        err = relative_error(actual[-1][key], expected[key])
        assert err <= tolerance, f"{key}: error {err:.3g} vs the reference's drift {drift:.3g}"


def test_float32_step_has_no_float64():
    tx = lbfgs()
    params = {k: jnp.asarray(v, jnp.float32) for k, v in _INIT.items()}

    def step(params, state):
        return tx.update(jax.grad(loss_jax)(params), state, params)

    assert "f64" not in str(jax.make_jaxpr(step)(params, tx.init(params)))


def test_bfloat16_parameters_keep_their_dtype():
    tx = lbfgs(lr=0.1)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in _INIT.items()}
    grads = jax.tree_util.tree_map(lambda p: p * 2, params)
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    for key in SHAPES:
        assert updates[key].dtype == jnp.bfloat16
        assert params[key].dtype == jnp.bfloat16
        assert state.prev_param[key].dtype == jnp.bfloat16
    assert state.step["w"].dtype == jnp.float32


def test_the_full_algorithms_options_are_accepted_and_ignored():
    options = {
        "max_iter": 3,
        "max_eval": 4,
        "tolerance_grad": 1.0,
        "tolerance_change": 1.0,
        "history_size": 2,
        "line_search_fn": "strong_wolfe",
    }
    default, _ = run_lucid(lbfgs(lr=0.5), 4)
    tuned, _ = run_lucid(lbfgs(lr=0.5, **options), 4)
    chex.assert_trees_all_equal(tuned, default)


# --- construction --------------------------------------------------------------------------------


def test_signature_is_torchs():
    """torch 2.13's keywords, and torch 2.15's keyword-only ``maximize``."""
    ours = inspect.signature(lbfgs).parameters
    theirs = torch_215_parameters("LBFGS", inspect.signature(torch.optim.LBFGS.__init__).parameters)
    assert list(theirs)[-1] == "maximize"
    del theirs["self"], theirs["params"]
    assert list(ours) == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default, name
        assert ours[name].kind == parameter.kind, name


@pytest.mark.parametrize("lr", [-1, -1e-3])
def test_negative_lr_raises_torchs_error(lr):
    with pytest.raises(ValueError) as torch_error:
        torch.optim.LBFGS([torch.zeros(2, requires_grad=True)], lr=lr)
    with pytest.raises(ValueError) as our_error:
        lbfgs(lr=lr)
    assert str(our_error.value) == str(torch_error.value)


def test_zero_lr_is_accepted_as_torch_does():
    torch.optim.LBFGS([torch.zeros(2, requires_grad=True)], lr=0.0)
    tx = lbfgs(lr=0.0)
    params = {k: jnp.asarray(v) for k, v in _INIT.items()}
    updates, _ = tx.update(jax.grad(loss_jax)(params), tx.init(params), params)
    chex.assert_trees_all_equal(updates, jax.tree_util.tree_map(jnp.zeros_like, params))


def test_unknown_line_search_is_refused_with_torchs_words():
    """torch accepts any ``line_search_fn`` at construction and raises at the first
    ``step``; the transform never line-searches, so it refuses at construction."""
    param = torch.ones(2, requires_grad=True)
    opt = torch.optim.LBFGS([param], line_search_fn="armijo")

    def closure():
        opt.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported") as torch_error:
        opt.step(closure)
    with pytest.raises(ValueError, match=str(torch_error.value)):
        lbfgs(line_search_fn="armijo")


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError):
        lbfgs(momentum=0.9)
