"""lucid.nn.utils' clipping against torch.nn.utils': total norms, clipped gradients and
errors, for gradients in the parameters' own arrays, in a compiled optimizer's flat buffer,
and for a subset of such a buffer."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

SHAPES = [(3, 4), (5,), (2, 2, 2), (1,)]


def _grads(scale):
    rng = np.random.default_rng(11)
    return [rng.normal(size=s) * scale for s in SHAPES]


def _setup(layout, grads):
    params = [lucid.Parameter(jnp.zeros(s)) for s in SHAPES]
    if layout != "own":
        lucid.compile_optimizer(lucid.optim.SGD(params, lr=0.1))
    for p, g in zip(params, grads):
        p.grad = jnp.asarray(g)
    params[2].grad = None  # a parameter without a gradient is skipped
    chosen = params if layout != "subset" else params[:2]
    tparams = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    for p, g in zip(tparams, grads):
        p.grad = torch.tensor(g)
    tparams[2].grad = None
    tchosen = tparams if layout != "subset" else tparams[:2]
    return params, chosen, tparams, tchosen


@pytest.mark.parametrize("layout", ["own", "flat", "subset"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf"), 3.0, 0.0])
@pytest.mark.parametrize("scale", [0.01, 10.0], ids=["below", "above"])
def test_clip_grad_norm_matches_torch(layout, norm_type, scale):
    grads = _grads(scale)
    params, chosen, tparams, tchosen = _setup(layout, grads)
    total = lucid.nn.utils.clip_grad_norm_(chosen, max_norm=1.5, norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_(tchosen, max_norm=1.5, norm_type=norm_type)
    np.testing.assert_allclose(float(total), float(expected), rtol=1e-12)
    for p, tp in zip(params, tparams):
        if tp.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("layout", ["own", "flat", "subset"])
def test_clip_grad_value_matches_torch(layout):
    params, chosen, tparams, tchosen = _setup(layout, _grads(1.0))
    assert lucid.nn.utils.clip_grad_value_(chosen, 0.3) is None
    torch.nn.utils.clip_grad_value_(tchosen, 0.3)
    for p, tp in zip(params, tparams):
        if tp.grad is not None:
            np.testing.assert_array_equal(np.asarray(p.grad), tp.grad.numpy())


def test_total_norm_and_clip_with_norm_are_torchs_two_halves():
    params, _, tparams, _ = _setup("flat", _grads(3.0))
    total = lucid.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    expected = torch.nn.utils.get_total_norm([p.grad for p in tparams if p.grad is not None])
    np.testing.assert_allclose(float(total), float(expected), rtol=1e-12)
    lucid.nn.utils.clip_grads_with_norm_(params, 2.0, total)
    torch.nn.utils.clip_grads_with_norm_(tparams, 2.0, expected)
    for p, tp in zip(params, tparams):
        if tp.grad is not None:
            np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=1e-12)
    assert float(lucid.nn.utils.get_total_norm([])) == float(torch.nn.utils.get_total_norm([]))


def test_a_non_finite_norm_raises_torchs_error_and_changes_nothing():
    grads = _grads(1.0)
    grads[0][0, 0] = np.nan
    params, chosen, _, tchosen = _setup("flat", grads)
    before = [None if p.grad is None else np.asarray(p.grad).copy() for p in params]
    with pytest.raises(RuntimeError) as theirs:
        torch.nn.utils.clip_grad_norm_(tchosen, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite") as ours:
        lucid.nn.utils.clip_grad_norm_(chosen, 1.0, error_if_nonfinite=True)
    assert str(ours.value) == str(theirs.value)
    for p, b in zip(params, before):
        if b is not None:
            np.testing.assert_array_equal(np.asarray(p.grad), b)
    with pytest.warns(UserWarning, match="empty generator"):
        lucid.nn.utils.clip_grad_norm_((p for p in []), 1.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0])
def test_half_precision_norms_accumulate_in_float32_as_torchs(dtype, norm_type):
    # found by the stateful profile: a bfloat16 norm summed in bfloat16 was an ulp off
    # torch's (which accumulates in float32 and rounds once), so the clipped values too
    rng = np.random.default_rng(5)
    for _ in range(20):
        grads = [rng.normal(size=(3,)) * 3.0, rng.normal(size=(7,)) * 3.0]
        params = [lucid.Parameter(jnp.zeros(g.shape, dtype)) for g in grads]
        tparams = [torch.zeros(g.shape, dtype=getattr(torch, dtype)) for g in grads]
        for p, t, g in zip(params, tparams, grads):
            p.grad = jnp.asarray(g, dtype)
            t.grad = torch.tensor(g, dtype=getattr(torch, dtype))
        total = lucid.nn.utils.clip_grad_norm_(params, 1.0, norm_type)
        expected = torch.nn.utils.clip_grad_norm_(tparams, 1.0, norm_type)
        assert total.dtype == jnp.dtype(dtype)
        np.testing.assert_array_equal(np.float32(total), expected.float().numpy())
        for p, t in zip(params, tparams):
            np.testing.assert_array_equal(np.asarray(p.grad, np.float32), t.grad.float().numpy())
