"""Complex parameters, as torch treats them: the real rule on ``view_as_real`` of the
parameter, gradient and state (state kept complex), in functional, eager and compiled
form; refused with a clear error where torch's optimizer database says torch does not
support them (SparseAdam) or where lucid deliberately does not (the full LBFGS)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from cases import CASES, case_id
from oracle import torch_default_dtype

import lucid
import lucid.functional as LF

STEPS = 6
# every case whose optimizer torch runs on complex numbers (not SparseAdam, Adafactor)
COMPLEX_CASES = [case for case in CASES if getattr(lucid.optim, case[0]).rule.supports_complex][::2]


def _gradients():
    rng = np.random.default_rng(7)
    shape = (3, 2)
    return [rng.normal(size=shape) + 1j * rng.normal(size=shape) for _ in range(STEPS)]


def _start():
    rng = np.random.default_rng(3)
    return rng.normal(size=(3, 2)) + 1j * rng.normal(size=(3, 2))


def _torch_run(name, options):
    with torch_default_dtype(torch.float64):
        p = torch.tensor(_start(), dtype=torch.complex128, requires_grad=True)
        opt = getattr(torch.optim, name)([p], **options)
        for g in _gradients():
            p.grad = torch.tensor(g)
            opt.step()
        return p.detach().numpy(), opt.state_dict()["state"].get(0, {})


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("case", COMPLEX_CASES, ids=case_id)
def test_complex_parameters_follow_torch_in_the_shell(case, mode):
    name, options = case
    expected, torch_state = _torch_run(name, options)
    p = lucid.Parameter(jnp.asarray(_start(), jnp.complex128))
    opt = getattr(lucid.optim, name)([p], **options)
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    for g in _gradients():
        p.grad = jnp.asarray(g)
        opt.step()
    np.testing.assert_allclose(np.asarray(p.data), expected, rtol=1e-10, atol=1e-13)
    state = opt.state_dict()["state"].get(0, {})
    assert set(state) == set(torch_state)
    for key, value in torch_state.items():
        ours = np.asarray(state[key])
        if ours.ndim:  # complex state stays complex (0-d `step` is lucid's float32)
            assert ours.dtype == value.numpy().dtype, key
        np.testing.assert_allclose(ours, value.numpy(), rtol=1e-10, atol=1e-13, err_msg=key)


@pytest.mark.parametrize("case", COMPLEX_CASES, ids=case_id)
def test_complex_parameters_follow_torch_in_the_transforms(case):
    name, options = case
    expected, _ = _torch_run(name, options)
    tx = getattr(LF, name.lower())(**options)
    params = jnp.asarray(_start(), jnp.complex128)
    state = tx.init(params)
    for g in _gradients():
        updates, state = tx.update(jnp.asarray(g), state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(np.asarray(params), expected, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", ["Adafactor", "Muon"])
def test_complex_parameters_are_refused_at_the_step_where_torch_refuses_them(name, mode):
    z = jnp.ones((2, 2), jnp.complex128)
    tz = torch.ones(2, 2, dtype=torch.complex128, requires_grad=True)
    tz.grad = torch.ones(2, 2, dtype=torch.complex128)
    topt = getattr(torch.optim, name)([tz])
    with pytest.raises(RuntimeError, match="does not support complex") as theirs:
        topt.step()
    p = lucid.Parameter(z)
    opt = getattr(lucid.optim, name)([p])
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    p.grad = jnp.ones((2, 2), jnp.complex128)
    with pytest.raises(RuntimeError) as ours:
        opt.step()
    assert str(ours.value) == str(theirs.value)
    np.testing.assert_array_equal(np.asarray(p.data), np.ones((2, 2)))
    assert opt.state_dict()["state"] == {}
    with pytest.raises(RuntimeError, match="does not support complex"):
        getattr(LF, name.lower())().init(z)


def test_sparse_adam_refuses_complex_parameters_at_construction_as_torch():
    tz = torch.ones(3, dtype=torch.complex128, requires_grad=True)
    with pytest.raises(ValueError) as theirs:
        torch.optim.SparseAdam([tz])
    with pytest.raises(ValueError) as ours:
        lucid.optim.SparseAdam([lucid.Parameter(jnp.ones(3, jnp.complex128))])
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(RuntimeError, match="SparseAdam does not support complex"):
        LF.sparse_adam().init(jnp.ones(3, jnp.complex128))


def test_integer_parameters_and_a_complex_lbfgs_are_refused():
    z = jnp.ones(3, jnp.complex128)
    with pytest.raises(ValueError, match="LBFGS does not support complex"):
        lucid.optim.LBFGS([lucid.Parameter(z)])
    with pytest.raises(ValueError, match="floating-point"):
        lucid.optim.Adam([lucid.Parameter(jnp.ones(3, jnp.int32))])
