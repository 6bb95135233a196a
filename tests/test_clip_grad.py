"""lucid.nn.utils' clipping against torch.nn.utils': total norms, clipped gradients and
errors, for gradients in the parameters' own arrays, in a compiled optimizer's flat buffer,
and for a subset of such a buffer."""

from __future__ import annotations

import jax
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


@pytest.mark.parametrize("layout", ["own", "flat"])
def test_a_nan_total_norm_spoils_only_the_gradients_there_are_as_torchs(layout):
    """A NaN gradient makes the total norm, and so the clip coefficient, NaN: torch scales
    every listed gradient to NaN and leaves a parameter without one without one. In a flat
    buffer the whole gradient buffer is scaled; the slice of the parameter without a
    gradient must stay zero, so that a later backward gives that parameter torch's
    gradient, not NaN (found by the random stateful sequences)."""
    grads = _grads(1.0)
    grads[0][1, 2] = np.nan
    params, chosen, tparams, tchosen = _setup(layout, grads)
    lucid.nn.utils.clip_grad_norm_(chosen, max_norm=1.0)
    torch.nn.utils.clip_grad_norm_(tchosen, max_norm=1.0)
    assert params[2].grad is None and tparams[2].grad is None
    later = np.arange(8.0).reshape(SHAPES[2])  # the next backward's gradient for it
    lucid.backward(lambda tree: jnp.sum(tree[2] * later), params)  # adds into every .grad
    torch.sum(tparams[2] * torch.tensor(later)).backward()
    for p, tp in zip(params, tparams):  # (lucid's backward adds zeros to the NaN others)
        np.testing.assert_array_equal(np.asarray(p.grad), tp.grad.numpy())


@pytest.mark.parametrize("where", [0, 4095], ids=["first", "last"])
@pytest.mark.parametrize("norm_type", [float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_infinity_norm_over_a_nan_is_nan_as_torchs(dtype, norm_type, where):
    """torch's max and min reductions propagate a NaN, so the infinity norms of a gradient
    holding one are NaN and the clip scales every gradient to NaN. XLA:CPU reduces 4096
    elements or more in a way that drops the NaN (1.0 or inf here, before lucid's
    `_math.max_abs`/`min_abs`)."""
    g = np.ones(4096, dtype)
    g[where] = np.nan
    p = lucid.Parameter(jnp.zeros(4096, dtype))
    p.grad = jnp.asarray(g)
    tp = torch.zeros(4096, dtype=getattr(torch, dtype), requires_grad=True)
    tp.grad = torch.tensor(g)
    total = lucid.nn.utils.clip_grad_norm_([p], max_norm=1.0, norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_([tp], max_norm=1.0, norm_type=norm_type)
    assert np.isnan(float(expected)) and np.isnan(float(total))
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


# ------------------------------------------- mixed dtypes, parameters listed twice, sparse
DTYPES = {
    "bfloat16": (torch.bfloat16, jnp.bfloat16),
    "float16": (torch.float16, jnp.float16),
    "float32": (torch.float32, jnp.float32),
    "float64": (torch.float64, jnp.float64),
}


def _mixed(dtypes, layout, scale, seed=5):
    """Parameters of the given dtypes, torch's and lucid's, with the same gradients."""
    from lucid._arrays import torch_to_numpy

    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (5,), (2, 3)]
    tparams, params = [], []
    for shape, name in zip(shapes, dtypes):
        tdtype, jdtype = DTYPES[name]
        grad = torch.tensor(rng.normal(size=shape) * scale).to(tdtype)
        tp = torch.zeros(shape, dtype=tdtype, requires_grad=True)
        tp.grad = grad.clone()
        tparams.append(tp)
        params.append((lucid.Parameter(jnp.zeros(shape, jdtype)), torch_to_numpy(grad)))
    if layout == "flat":
        lucid.compile_optimizer(lucid.optim.SGD([p for p, _ in params], lr=0.1))
    for p, grad in params:
        p.grad = jnp.asarray(grad)
    return [p for p, _ in params], tparams


def _as_float64(array):
    from lucid._arrays import torch_to_numpy

    return (torch_to_numpy(array) if isinstance(array, torch.Tensor) else np.asarray(array)).astype(
        np.float64
    )


@pytest.mark.parametrize("layout", ["own", "flat"])
@pytest.mark.parametrize(
    "norm_type, scale",
    [(2.0, 0.01), (2.0, 10.0), (1.0, 10.0), (float("inf"), 10.0)],
    ids=["2-below", "2-above", "1-above", "inf-above"],
)
@pytest.mark.parametrize(
    "dtypes",
    [("bfloat16", "float32"), ("float16", "bfloat16"), ("bfloat16",), ("float32", "float64")],
)
def test_the_total_norm_of_mixed_dtypes_is_torchs(dtypes, norm_type, scale, layout):
    """torch takes each gradient's norm in its dtype (16-bit floats reduced in float32),
    stacks the norms in the dtype they promote to, and scales each gradient in its
    opmath dtype: the total's dtype, and its value and every clipped gradient to rounding
    (XLA and torch sum in different orders: a few float32 roundings, or one rounding of a
    16-bit result; rounding the total to the first gradient's bfloat16 is 100 times that)."""
    params, tparams = _mixed(dtypes, layout, scale)
    expected = torch.nn.utils.clip_grad_norm_(tparams, 1.0, norm_type=norm_type)
    total = lucid.nn.utils.clip_grad_norm_(params, 1.0, norm_type=norm_type)
    assert str(total.dtype) == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_allclose(
        _as_float64(total), _as_float64(expected), rtol=_rounding(total.dtype)
    )
    for p, tp in zip(params, tparams):
        assert p.grad.dtype == p.dtype
        np.testing.assert_allclose(
            _as_float64(p.grad), _as_float64(tp.grad), rtol=_rounding(p.dtype)
        )


def _rounding(dtype):
    """A result's tolerance: one rounding of a 16-bit float, else a few float32 roundings
    (the float32 reductions torch and XLA order differently)."""
    dtype = np.dtype(dtype)
    return float(jnp.finfo(dtype).eps) if dtype.itemsize < 4 else 5e-7


def test_a_float32_gradient_beside_a_bfloat16_one_keeps_its_precision_in_the_total():
    """The issue's case: a bfloat16 first gradient must not round the total to bfloat16
    (torch: 300.005 and a coefficient below 1; rounded: 300.0 and no clipping)."""
    tparams = [torch.zeros(1, dtype=torch.bfloat16, requires_grad=True), torch.zeros(1)]
    tparams[0].grad = torch.tensor([0.5], dtype=torch.bfloat16)
    tparams[1].grad = torch.tensor([300.005])
    params = [lucid.Parameter(jnp.zeros(1, jnp.bfloat16)), lucid.Parameter(jnp.zeros(1))]
    params[0].grad = jnp.array([0.5], jnp.bfloat16)
    params[1].grad = jnp.array([300.005], jnp.float32)
    expected = torch.nn.utils.clip_grad_norm_(tparams, 300.0)
    total = lucid.nn.utils.clip_grad_norm_(params, 300.0)
    assert float(expected) > 300.0 and total.dtype == np.float32
    assert float(total) == float(expected)
    assert float(params[1].grad[0]) == float(tparams[1].grad[0]) < 300.005


@pytest.mark.parametrize("layout", ["own", "flat"])
def test_a_parameter_listed_twice_counts_twice_and_is_scaled_twice_as_torchs(layout):
    params, tparams = _mixed(("float64", "float64", "float64"), layout, 3.0)
    order = [0, 1, 0, 2, 0]
    expected = torch.nn.utils.clip_grad_norm_([tparams[i] for i in order], 1.0)
    total = lucid.nn.utils.clip_grad_norm_([params[i] for i in order], 1.0)
    np.testing.assert_allclose(float(total), float(expected), rtol=1e-15)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(np.asarray(p.grad), tp.grad.numpy(), rtol=1e-15)
    # clip_grads_with_norm_ too; clamping twice is clamping once
    lucid.nn.utils.clip_grads_with_norm_([params[0], params[0]], 0.5, total)
    torch.nn.utils.clip_grads_with_norm_([tparams[0], tparams[0]], 0.5, expected)
    np.testing.assert_allclose(np.asarray(params[0].grad), tparams[0].grad.numpy(), rtol=1e-15)
    lucid.nn.utils.clip_grad_value_([params[1], params[1]], 0.01)
    torch.nn.utils.clip_grad_value_([tparams[1], tparams[1]], 0.01)
    np.testing.assert_array_equal(np.asarray(params[1].grad), tparams[1].grad.numpy())


def _sparse_setup(compiled):
    from jax.experimental import sparse

    dense = lucid.Parameter(jnp.zeros(3))
    rows = lucid.Parameter(jnp.zeros((4, 2)))
    if compiled:
        lucid.compile_optimizer(lucid.optim.SparseAdam([dense, rows], lr=0.1))
    dense.grad = jnp.array([3.0, 4.0, 0.0])
    values = jnp.array([[1.0, 2.0], [0.0, 0.0], [5.0, 6.0], [0.0, 0.0]])
    rows.grad = sparse.BCOO.fromdense(values)
    tdense = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    trows = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
    tdense.grad = torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64)
    trows.grad = torch.tensor(np.asarray(values)).to_sparse()
    return [dense, rows], [tdense, trows]


@pytest.mark.parametrize("compiled", [False, True], ids=["own", "compiled"])
def test_a_sparse_gradient_is_refused_as_torch_refuses_it_and_nothing_changes(compiled):
    params, tparams = _sparse_setup(compiled)
    before = np.asarray(params[0].grad).copy()
    calls = [
        (torch.nn.utils.clip_grad_norm_, lucid.nn.utils.clip_grad_norm_, (1.0,)),
        (torch.nn.utils.clip_grad_value_, lucid.nn.utils.clip_grad_value_, (1.0,)),
    ]
    for theirs, ours, args in calls:
        with pytest.raises(NotImplementedError):
            theirs(tparams, *args)
        with pytest.raises(NotImplementedError, match=r"sparse gradient .* cannot be clipped"):
            ours(params, *args)
        np.testing.assert_array_equal(np.asarray(params[0].grad), before)
        assert hasattr(params[1].grad, "todense")
    with pytest.raises(NotImplementedError):
        torch.nn.utils.get_total_norm([t.grad for t in tparams])
    with pytest.raises(NotImplementedError, match="sparse"):
        lucid.nn.utils.get_total_norm([p.grad for p in params])
    with pytest.raises(NotImplementedError, match="sparse"):
        lucid.functional.clip_grad_norm(1.0).update({"w": params[1].grad}, None)


@pytest.mark.parametrize("dtypes", [("bfloat16", "float32"), ("float32", "float64")])
def test_the_clip_grad_norm_transform_follows_torchs_dtype_rule(dtypes):
    params, tparams = _mixed(dtypes, "own", 10.0)
    expected = torch.nn.utils.clip_grad_norm_(tparams, 1.0)
    grads = {str(i): p.grad for i, p in enumerate(params)}
    clipped, _ = jax.jit(lucid.functional.clip_grad_norm(1.0).update)(grads, None)
    for i, tp in enumerate(tparams):
        assert clipped[str(i)].dtype == params[i].dtype
        np.testing.assert_allclose(
            _as_float64(clipped[str(i)]), _as_float64(tp.grad), rtol=_rounding(params[i].dtype)
        )
    assert float(expected) > 1.0


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
