"""Shampoo against its reference, pytorch-optimizer 4.1's ``pytorch_optimizer.Shampoo``, run
live.

The bound, and where it comes from. Every operation is the reference's sequence except the
inverse roots, an SVD by LAPACK (torch) or by XLA. An SVD's singular values carry an
absolute error of about ``n eps ||H||`` (``n`` the matrix's size), so the root
``σ^{-1/(2k)}`` of the smallest, ``σ_min``, is off by about ``n eps κ / (2k)`` relative,
``κ = ||H|| / σ_min``; the singular vectors of a cluster of equal values are arbitrary but
the root is a function of ``H`` and does not depend on them. So each step moves the
update ``u`` by at most ``2⁴ · n · eps · κ · |u|`` (a factor 2⁴ above ``n eps κ / (2k)``
for the SVD's own constant and the ``k`` roots a step multiplies), and the parameter's own
roundings add ``4 eps |p|``: after ``k`` steps the bound is the sum over the steps of
``lr · 2⁴ · n · eps · max(κ, 1) · max|u| + 4 eps max|p|``, with ``κ`` and ``u`` read from the
reference's state at each step. It holds in float64 (a few ulps: ``κ`` stays near 1e3 on
these data) and in float32 alike.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from _matrix_forms import LucidForms, reference_step

import lucid

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
RefShampoo = pytorch_optimizer.Shampoo

CASES = [
    # 2-D, 3-D, a vector, a long axis beside a short one, a scalar (no preconditioner)
    ([(4, 4), (2, 3, 4), (5,), (6, 2), ()], {"lr": 0.01}),
    (
        [(4, 4), (2, 3, 4), (3,)],
        {
            "lr": 0.01,
            "momentum": 0.9,
            "weight_decay": 0.1,
            "preconditioning_compute_steps": 3,
            "maximize": True,
        },
    ),
    ([(4, 4), (3,)], {"lr": 0.01, "weight_decay": 0.1, "weight_decouple": True}),
    (
        [(4, 4), (3, 1, 2)],
        {
            "lr": 0.01,
            "weight_decay": 0.1,
            "weight_decouple": True,
            "fixed_decay": True,
            "matrix_eps": 1e-3,
            "momentum": 0.5,
        },
    ),
]
STEPS = 8


def _ids(case):
    _, options = case
    return ",".join(f"{k}={v}" for k, v in options.items() if k != "lr") or "defaults"


def _data(shapes, dtype, steps, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.normal(size=s).astype(dtype) for s in shapes]
    grads = [[rng.normal(size=s).astype(dtype) for s in shapes] for _ in range(steps)]
    return init, grads


def _budget(ref, params, dtype, lr):
    """One step's share of the bound, from the reference's state after that step."""
    eps = float(np.finfo(dtype).eps)
    worst = 0.0
    for p in params:
        state = ref.state[p]
        u = float(np.abs(state["momentum_buffer"].numpy()).max()) if p.ndim else 0.0
        for i in range(p.ndim):
            h = state[f"pre_cond_{i}"].double().numpy()
            values = np.linalg.eigvalsh(h)
            kappa = max(float(values.max() / max(values.min(), 1e-300)), 1.0)
            worst = max(worst, lr * 2**4 * h.shape[0] * eps * kappa * u)
    scale = max(float(np.abs(p.detach().numpy()).max()) if p.numel() else 0.0 for p in params)
    return worst + 4 * eps * scale


def _Lucid(form, init, options, groups=None):
    """lucid's Shampoo in one of its forms, stepped on given gradients."""
    return LucidForms(lucid.functional.shampoo, lucid.optim.Shampoo, form, init, options, groups)


def _compare(form, shapes, options, dtype, groups=None, steps=STEPS):
    init, grads = _data(shapes, dtype, steps)
    ref_params = [torch.tensor(x) for x in init]
    ref = RefShampoo(ref_params if groups is None else groups(ref_params), **options)
    mine = _Lucid(form, init, options, groups)
    bound = 0.0
    for k, g in enumerate(grads, start=1):
        want = reference_step(ref_params, ref, g)
        got = mine.step(g)
        bound += _budget(ref, ref_params, dtype, options.get("lr", 1e-3))
        for w, o, s in zip(want, got, shapes):
            assert o.dtype == w.dtype and o.shape == s
            np.testing.assert_allclose(o, w, rtol=0, atol=bound, err_msg=f"step {k}, {s}")


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_eager_matches_the_reference(case, dtype):
    _compare("eager", *case, dtype)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize(
    "form, dtype",
    [("transform", np.float64), ("compiled", np.float32), ("fused", np.float64)],
    ids=["transform-f64", "compiled-f32", "fused-f64"],
)
def test_every_form_matches_the_reference(case, form, dtype):
    _compare(form, *case, dtype)


@pytest.mark.parametrize("form", ["eager", "compiled"])
def test_groups_keep_their_own_options(form):
    def groups(params):
        return [
            {"params": params[:2], "lr": 0.02, "momentum": 0.9},
            {"params": params[2:], "weight_decay": 0.1},
        ]

    _compare(form, [(4, 4), (2, 3, 4), (3, 3), (5,)], {"lr": 0.01}, np.float64, groups=groups)


@pytest.mark.parametrize("form", ["eager", "compiled"])
def test_checkpoints_move_both_ways_with_the_reference(form):
    """The reference's state_dict after 3 steps loads into lucid and both go on; lucid's
    after 3 more loads into a fresh reference (as torch tensors) and both go on."""
    shapes, options = CASES[1]
    options = {**options, "preconditioning_compute_steps": 2}
    init, grads = _data(shapes, np.float64, 9)
    ref_params = [torch.tensor(x) for x in init]
    ref = RefShampoo(ref_params, **options)
    for g in grads[:3]:
        reference_step(ref_params, ref, g)
    mine = _Lucid(form, [p.detach().numpy() for p in ref_params], options)
    mine.opt.load_state_dict(ref.state_dict())
    assert mine.opt.param_groups[0]["step"] == 3
    for g in grads[3:6]:
        want, got = reference_step(ref_params, ref, g), mine.step(g)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=0, atol=1e-12)
    fresh_params = [torch.tensor(np.asarray(p.data)) for p in mine.params]
    fresh = RefShampoo(fresh_params, **options)
    fresh.load_state_dict(lucid.optim.to_torch(mine.opt.state_dict()))
    assert fresh.param_groups[0]["step"] == 6
    for g in grads[6:]:
        want, got = reference_step(fresh_params, fresh, g), mine.step(g)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=0, atol=1e-12)


def test_the_state_dict_is_the_references_entry_for_entry():
    shapes, options = CASES[1]
    init, grads = _data(shapes, np.float32, 2)
    ref_params = [torch.tensor(x) for x in init]
    ref = RefShampoo(ref_params, **options)
    mine = _Lucid("eager", init, options)
    for g in grads:
        reference_step(ref_params, ref, g)
        mine.step(g)
    want, got = ref.state_dict(), mine.opt.state_dict()
    for key, entry in want["state"].items():
        assert set(got["state"][key]) == set(entry)
        for name, value in entry.items():
            assert tuple(got["state"][key][name].shape) == tuple(value.shape)
    extra = set(got["param_groups"][0]) - set(want["param_groups"][0])
    # the reference keeps these two on the optimizer, not in its groups
    assert extra == {"preconditioning_compute_steps", "maximize"}
    assert got["param_groups"][0]["step"] == want["param_groups"][0]["step"] == 2


def test_the_signature_is_the_references():
    ref = inspect.signature(RefShampoo)
    wanted = [(p.name, p.default) for p in ref.parameters.values() if p.kind != p.VAR_KEYWORD]
    mine = inspect.signature(lucid.optim.Shampoo)
    assert [(p.name, p.default) for p in mine.parameters.values()] == wanted
    assert list(inspect.signature(lucid.functional.shampoo).parameters) == [
        n for n, _ in wanted[1:]
    ]


BAD = [
    {"lr": -1.0},
    {"momentum": 1.0},
    {"momentum": -0.1},
    {"weight_decay": -1e-3},
    {"preconditioning_compute_steps": 0},
    {"matrix_eps": -1e-6},
]


@pytest.mark.parametrize("options", BAD, ids=str)
def test_bad_options_raise_the_references_error(options):
    with pytest.raises(Exception) as want:
        RefShampoo([torch.zeros(2)], **options)
    for make in (
        lambda: lucid.optim.Shampoo([lucid.Parameter(jnp.zeros(2))], **options),
        lambda: lucid.functional.shampoo(**options),
    ):
        with pytest.raises(ValueError) as got:
            make()
        assert type(got.value).__name__ == type(want.value).__name__
        assert str(got.value) == str(want.value)


def test_a_parameter_of_more_than_eight_axes_is_refused_in_words_and_nothing_moves():
    p = lucid.Parameter(jnp.ones((1,) * 9))
    opt = lucid.optim.Shampoo([p])
    p.grad = jnp.ones((1,) * 9)
    with pytest.raises(ValueError, match="at most 8 axes"):
        opt.step()
    assert len(opt.state[p]) == 0 and float(p.data.ravel()[0]) == 1.0


def test_the_roots_are_a_conditional_inside_one_float32_program():
    tx = lucid.functional.shampoo(preconditioning_compute_steps=3)
    params = {"w": jnp.ones((3, 4), jnp.float32)}
    state = tx.init(params)
    text = jax.jit(tx.update).lower(params, state, params).as_text()
    assert "stablehlo.case" in text or "stablehlo.if" in text
    assert "f64" not in text and "callback" not in text.lower()
