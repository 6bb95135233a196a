"""Properties every lucid.functional transform must have beyond parity:
no recompiles when values change, dtype preservation, optax composition, vmap,
and clear structure errors. (Metal safety of every program, the float32 step
included: tests/test_metal_lowering.py.)"""

from __future__ import annotations

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cases import CASES, case_id, functional
from oracle import count_compiles, loss_jax, problem

import lucid.functional as LF

ALL = [(name, options) for name, options in CASES]
ALL += [("SparseAdam", {"lr": 0.01}), ("LBFGS", {"lr": 0.1})]
ONE_PER_OPTIMIZER = list({name: (name, options) for name, options in reversed(ALL)}.values())


def _params(dtype):
    return {k: jnp.asarray(v, dtype) for k, v in problem().items()}


def _step(tx):
    def step(params, state):
        grads = jax.grad(lambda p: loss_jax(p).astype(jnp.float32))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
def test_changing_the_lr_every_step_compiles_once(case):
    name, options = case
    lr = jnp.asarray(options.get("lr", 0.01), jnp.float32)

    @jax.jit
    def step(params, state, lr):
        tx = functional(name)(**{**options, "lr": lr})
        return _step(tx)(params, state)

    params = _params(jnp.float32)
    state = functional(name)(**options).init(params)
    lrs = [jnp.asarray(float(lr) * (1.0 + 0.01 * i), jnp.float32) for i in range(20)]
    step(params, state, lr)  # warm-up: the one compilation
    with count_compiles() as compiled:
        for value in lrs:
            params, state = step(params, state, value)
    assert len(compiled) == 0


def test_a_schedule_as_lr_compiles_once_and_matches_manual_values():
    schedule = LF.schedules.step_lr(0.1, step_size=3, gamma=0.5)
    with_schedule = LF.sgd(lr=schedule, momentum=0.9)
    params = _params(jnp.float64)
    state = with_schedule.init(params)
    step = jax.jit(_step(with_schedule))
    manual = dict(params)
    manual_state = LF.sgd(lr=0.1, momentum=0.9).init(manual)
    for i in range(10):
        params, state = step(params, state)
        lr = jnp.asarray(0.1 * 0.5 ** (i // 3))
        manual, manual_state = _step(LF.sgd(lr=lr, momentum=0.9))(manual, manual_state)
    chex.assert_trees_all_close(params, manual, rtol=1e-12)
    assert step._cache_size() == 1


@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.float64])
def test_every_array_keeps_its_dtype(case, dtype):
    name, options = case
    tx = functional(name)(**options)
    params = _params(dtype)
    state = tx.init(params)
    new_params, new_state = jax.jit(_step(tx))(params, state)
    new_params, new_state = jax.jit(_step(tx))(new_params, new_state)
    chex.assert_trees_all_equal_dtypes(new_params, params)
    chex.assert_trees_all_equal_structs(new_state, state)
    for before, after in zip(
        jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(new_state)
    ):
        assert before.dtype == after.dtype
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(new_params))


@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
def test_composes_with_optax_chain(case):
    name, options = case
    chained = optax.chain(optax.clip_by_global_norm(0.5), functional(name)(**options))
    alone = functional(name)(**options)
    params = _params(jnp.float64)
    grads = jax.grad(loss_jax)(params)
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
    clipped = jax.tree_util.tree_map(lambda g: g * jnp.minimum(1.0, 0.5 / norm), grads)
    u_chained, _ = chained.update(grads, chained.init(params), params)
    u_alone, _ = alone.update(clipped, alone.init(params), params)
    chex.assert_trees_all_close(u_chained, u_alone, rtol=1e-12)


@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
def test_vmap_over_independent_problems_equals_separate_runs(case):
    name, options = case
    tx = functional(name)(**options)
    inits = [problem(seed) for seed in range(3)]
    batched = {k: jnp.stack([jnp.asarray(i[k]) for i in inits]) for k in inits[0]}
    step = _step(tx)

    def run(params):
        state = tx.init(params)
        for _ in range(3):
            params, state = step(params, state)
        return params

    together = jax.jit(jax.vmap(run))(batched)
    for index, init in enumerate(inits):
        alone = jax.jit(run)({k: jnp.asarray(v) for k, v in init.items()})
        mine = jax.tree_util.tree_map(lambda x, i=index: x[i], together)
        chex.assert_trees_all_close(mine, alone, rtol=1e-10)


def test_mismatched_grads_give_a_clear_error():
    tx = LF.adam()
    params = _params(jnp.float32)
    state = tx.init(params)
    with pytest.raises(ValueError, match="different structures"):
        tx.update({"w": params["w"]}, state, params)
    with pytest.raises(ValueError, match="shape"):
        tx.update({"b": params["b"], "w": params["w"][:2]}, state, params)
    with pytest.raises(ValueError, match="needs the current params"):
        tx.update(params, state)


def test_float64_transform_matches_numpy_for_one_hand_checked_step():
    """One Adam step, spelled out: guards the harness itself against a shared bug."""
    p, g = np.array([1.0, -2.0]), np.array([0.5, 0.25])
    tx = LF.adam(lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    update, _ = tx.update(jnp.asarray(g), tx.init(jnp.asarray(p)), jnp.asarray(p))
    m, v = 0.1 * g, 0.01 * g**2
    expected = -0.1 / 0.1 * m / (np.sqrt(v) / np.sqrt(0.01) + 1e-8)
    np.testing.assert_allclose(np.asarray(update), expected, rtol=1e-12)


@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
def test_state_can_be_donated_to_a_jitted_step(case):
    """No two state leaves may share a buffer, or XLA refuses the donation: every
    donated buffer is consumed, and the numbers are the same step's without donation
    (to float32 rounding)."""
    name, options = case
    tx = functional(name)(**options)
    params = _params(jnp.float32)
    kept = jax.jit(_step(tx))
    expected = kept(*kept(params, tx.init(params)))
    step = jax.jit(_step(tx), donate_argnums=(0, 1))
    state = tx.init(params)
    donated = [x for x in jax.tree_util.tree_leaves((params, state)) if isinstance(x, jax.Array)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Some donated buffers were not usable"
        params, state = step(params, state)
    assert all(x.is_deleted() for x in donated), "a donated buffer was not consumed"
    params, state = step(params, state)
    # the same math; older XLA fuses a donated program differently: an ulp of the largest value
    chex.assert_trees_all_close((params, state), expected, rtol=1e-6, atol=1e-7)
