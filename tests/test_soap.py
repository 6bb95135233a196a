"""SOAP against its reference, pytorch-optimizer 4.1's ``pytorch_optimizer.SOAP``, run live.

The bounds, and where they come from:

* **The first bases' tilt**: an eigendecomposition's eigenvectors move by about
  ``eps ||L|| / gap`` (``gap`` the smallest distance between two eigenvalues) under the
  roundings of two implementations, so each step adds up to ``lr · 2⁴ · n · eps ·
  ||L|| / gap`` (``n`` the largest axis); ``||L|| / gap`` is read from the reference's
  statistics after its first step.
* **float64, before the first refresh** (steps ``s < precondition_frequency``): the
  reference's eigendecomposition (LAPACK's ``syevd``) and XLA's differ by a few ulps per
  eigenvector (times ``||L|| / gap``); every other operation is the same sequence of
  roundings. Bound: ``1e-12`` of the largest parameter entry.
* **float64, after a refresh**: the reference runs the refresh's QR in **float32** for
  every dtype (``power_iter.to(torch.float32)``) and lucid does too; LAPACK's and XLA's
  float32 QR agree to a few float32 ulps (about ``n eps32`` for an ``n x n`` basis), and a
  basis wrong by ``δ`` moves the update direction by at most about ``2δ`` relative. With
  ``|u| <= 1 / (1 - β₁)`` per entry for Adam's direction, each step adds at most
  ``lr · 2⁷ · n · eps32`` (a factor 2⁴ above ``2 n eps32 / (1 - β₁)`` at β₁ = 0.95 for the
  QR's own constant), so after ``k`` steps ``k · lr · 2⁷ · n · eps32``.
* **float32**: the same budgets from the bases, plus the roundings of the parameter's own
  update (a few ulps of ``|p|`` a step, from float32 bias corrections and ``1 - β`` that the
  reference takes in double on the host): ``k · (4 eps32 max|p| + lr · 2⁷ · n · eps32)``.

The bounds do not cover a coordinate of the projected gradient within rounding of zero,
where Adam's ``x / (|x| + ε)`` is steep (``1/ε`` at 0) and a rounding of ``x`` moves the
direction by far more than its own size; the seeded data hold none (seed 0 does, for the
``(3, 3)`` case: an error of ``4e-4 lr`` in one entry at the first update).

Shapes whose statistics are singular at the first step (a rectangular matrix, a vector
with ``precondition_1d``) have an eigenspace of zeros there, in which any basis is an
eigenbasis: LAPACK's and XLA's choices differ by a rotation, not a rounding, and so do the
trajectories. Those shapes are compared from a shared state instead: the reference's
state_dict, after its first steps, loaded into lucid (which is also the checkpoint test).
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
from lucid.functional.soap import entries, merge_small_dims, preconditioners

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
RefSOAP = pytorch_optimizer.SOAP

EPS32 = float(np.finfo(np.float32).eps)

# (shapes, options): every shape's statistics are nonsingular after one gradient
# (each axis at most the product of the others), so both sides start from one basis
FULL_RANK = [
    # 2-D, 3-D, a vector (Adam), an axis above max_precondition_dim (6) beside one below
    (
        [(4, 4), (2, 3, 4), (5,), (6, 2)],
        {"lr": 0.01, "precondition_frequency": 3, "max_precondition_dim": 5},
    ),
    # merge_dims: (2,3,4,5) -> [6, 4, 5], (3,2,2,3) -> [6, 6]
    (
        [(2, 3, 4, 5), (3, 2, 2, 3)],
        {"lr": 0.01, "precondition_frequency": 2, "merge_dims": True, "max_precondition_dim": 8},
    ),
    (
        [(2, 3, 4, 5), (3, 2, 2, 3)],
        {
            "lr": 0.01,
            "precondition_frequency": 2,
            "merge_dims": True,
            "max_precondition_dim": 8,
            "data_format": "channels_last",
        },
    ),
    (
        [(4, 4), (3,), ()],
        {
            "lr": 0.02,
            "precondition_frequency": 2,
            "normalize_gradient": True,
            "correct_bias": False,
            "maximize": True,
            "shampoo_beta": 0.9,
            "weight_decay": 0.0,
            "betas": (0.9, 0.99),
            "eps": 1e-6,
        },
    ),
    (
        [(3, 3), (1,)],
        {"lr": 0.01, "precondition_frequency": 4, "precondition_1d": True, "weight_decay": 0.1},
    ),
]
STEPS = 10


def _ids(case):
    _, options = case
    return ",".join(f"{k}={v}" for k, v in options.items() if k != "lr")


def _data(shapes, dtype, steps, seed=1):
    rng = np.random.default_rng(seed)
    init = [rng.normal(size=s).astype(dtype) for s in shapes]
    grads = [[rng.normal(size=s).astype(dtype) for s in shapes] for _ in range(steps)]
    return init, grads


def _reference(init, options, groups=None):
    params = [torch.tensor(x) for x in init]
    if groups is None:
        return params, RefSOAP(params, **options)
    return params, RefSOAP(groups(params), **options)


def _Lucid(form, init, options, groups=None):
    """lucid's SOAP in one of its forms, stepped on given gradients."""
    return LucidForms(lucid.functional.soap, lucid.optim.SOAP, form, init, options, groups)


def _gap(ref):
    """The largest ``||L|| / gap`` over the reference's statistics after its first step:
    how much an eigendecomposition's roundings tilt its eigenvectors."""
    worst = 1.0
    for state in ref.state.values():
        for m in state["GG"]:
            if len(m):
                values = np.linalg.eigvalsh(m.double().numpy())
                gaps = np.diff(values)
                if gaps.size:
                    worst = max(worst, float(np.abs(values).max() / max(gaps.min(), 1e-300)))
    return worst


def _bound(dtype, options, shapes, k, scale, refreshed, gap=1.0):
    n = max([max(s) for s in shapes if s] + [1])
    lr = options.get("lr", 3e-3)
    eps = float(np.finfo(dtype).eps)
    tilt = k * lr * 2**4 * n * eps * gap  # the first bases' eigenvectors
    if dtype == np.float64 and not refreshed:
        return max(1e-12 * scale, tilt)
    budget = k * lr * 2**7 * n * EPS32 + tilt
    if dtype == np.float32:
        budget += k * 4 * EPS32 * scale
    return budget


def _compare(form, shapes, options, dtype, steps=STEPS, groups=None):
    init, grads = _data(shapes, dtype, steps)
    ref_params, ref = _reference(init, options, groups)
    mine = _Lucid(form, init, options, groups)
    freq = options.get("precondition_frequency", 10)
    scale = max(float(np.abs(x).max()) if x.size else 0.0 for x in init)
    gap = 1.0
    for k, g in enumerate(grads, start=1):
        want = reference_step(ref_params, ref, g)
        got = mine.step(g)
        gap = _gap(ref) if k == 1 else gap
        # the reference's step k refreshes at s = k - 1 when s % f == 0 (s > 0)
        refreshed = k - 1 >= freq
        bound = _bound(dtype, options, shapes, k, scale, refreshed, gap)
        for w, o, s in zip(want, got, shapes):
            assert o.dtype == w.dtype and o.shape == s
            np.testing.assert_allclose(o, w, rtol=0, atol=bound, err_msg=f"step {k}, {s}")


@pytest.mark.parametrize("case", FULL_RANK, ids=_ids)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_eager_matches_the_reference(case, dtype):
    _compare("eager", *case, dtype)


@pytest.mark.parametrize("case", FULL_RANK, ids=_ids)
@pytest.mark.parametrize(
    "form, dtype",
    [("transform", np.float64), ("compiled", np.float32), ("fused", np.float64)],
    ids=["transform-f64", "compiled-f32", "fused-f64"],
)
def test_every_form_matches_the_reference(case, form, dtype):
    _compare(form, *case, dtype)


def test_groups_keep_their_own_options():
    """Two groups, each with its own lr, merge_dims and refresh period, in every form."""

    def groups(params):
        return [
            {"params": params[:2], "lr": 0.02, "merge_dims": True, "max_precondition_dim": 8},
            {"params": params[2:], "precondition_frequency": 2},
        ]

    shapes = [(2, 3, 4, 5), (4, 4), (3, 3), (5,)]
    for form in ("eager", "compiled"):
        _compare(form, shapes, {"lr": 0.01, "precondition_frequency": 3}, np.float64, groups=groups)


SINGULAR = [
    # rectangular (rank 3 of 5 at the first step), a vector with precondition_1d, an axis
    # above max_precondition_dim, 3-D with one axis longer than the others' product
    (
        [(5, 3), (4,), (6, 2), (2, 2, 6)],
        {
            "lr": 0.01,
            "precondition_frequency": 2,
            "precondition_1d": True,
            "max_precondition_dim": 5,
        },
    ),
]


@pytest.mark.parametrize("form", ["eager", "compiled"])
@pytest.mark.parametrize("case", SINGULAR, ids=_ids)
def test_a_reference_checkpoint_loads_and_steps_as_the_reference(case, form):
    """The reference steps 6 times (its statistics full rank by then), lucid loads its
    state_dict, and both go on over several refreshes (float64, the refreshed bound)."""
    shapes, options = case
    init, grads = _data(shapes, np.float64, 14)
    ref_params, ref = _reference(init, options)
    for g in grads[:6]:
        reference_step(ref_params, ref, g)
    mine = _Lucid(form, [p.detach().numpy() for p in ref_params], options)
    mine.opt.load_state_dict(ref.state_dict())
    assert mine.opt.param_groups[0]["step"] == 6
    for k, g in enumerate(grads[6:], start=1):
        want = reference_step(ref_params, ref, g)
        got = mine.step(g)
        bound = _bound(np.float64, options, shapes, k, 1.0, True)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=0, atol=bound)


@pytest.mark.parametrize("form", ["eager", "compiled"])
@pytest.mark.parametrize("case", SINGULAR + FULL_RANK[1:2], ids=_ids)
def test_a_lucid_checkpoint_loads_into_the_reference_and_steps_as_lucid(case, form):
    """lucid steps 5 times; the reference loads its state_dict (as torch tensors) and
    its parameters, and both go on."""
    shapes, options = case
    init, grads = _data(shapes, np.float64, 12)
    mine = _Lucid(form, init, options)
    for g in grads[:5]:
        mine.step(g)
    saved = lucid.optim.to_torch(mine.opt.state_dict())
    ref_params, ref = _reference([np.asarray(p.data) for p in mine.params], options)
    ref.load_state_dict(saved)
    assert ref.param_groups[0]["step"] == 5
    for k, g in enumerate(grads[5:], start=1):
        want = reference_step(ref_params, ref, g)
        got = mine.step(g)
        bound = _bound(np.float64, options, shapes, k, 1.0, True)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=0, atol=bound)


def test_the_state_dict_is_the_references_entry_for_entry():
    shapes, options = SINGULAR[0]
    init, grads = _data(shapes, np.float32, 3)
    ref_params, ref = _reference(init, options)
    mine = _Lucid("eager", init, options)
    for g in grads:
        reference_step(ref_params, ref, g)
        mine.step(g)
    want, got = ref.state_dict(), mine.opt.state_dict()
    assert set(got["state"]) == set(want["state"])
    for key, entry in want["state"].items():
        assert set(got["state"][key]) == set(entry)
        for name in ("GG", "Q"):
            assert [len(m) == 0 for m in got["state"][key][name]] == [
                len(m) == 0 for m in entry[name]
            ]
            for a, b in zip(got["state"][key][name], entry[name]):
                if len(b):
                    assert tuple(a.shape) == tuple(b.shape) and a.dtype == jnp.float32
        assert got["state"][key]["precondition_frequency"] == entry["precondition_frequency"]
        assert type(got["state"][key]["precondition_frequency"]) is int
        assert got["state"][key]["shampoo_beta"] == pytest.approx(entry["shampoo_beta"])
    wanted_group = dict(want["param_groups"][0])
    got_group = dict(got["param_groups"][0])
    # the reference keeps data_format and maximize on the optimizer, not in its groups
    assert set(got_group) - set(wanted_group) == {"data_format", "maximize"}
    assert not set(wanted_group) - set(got_group)
    assert got_group["step"] == wanted_group["step"] == 3


def test_a_checkpoint_of_the_wrong_shape_is_refused_and_changes_nothing():
    shapes, options = FULL_RANK[0]
    init, grads = _data(shapes, np.float32, 2)
    mine = _Lucid("eager", init, options)
    for g in grads:
        mine.step(g)
    saved = mine.opt.state_dict()
    before = {
        k: np.asarray(v)
        for k, v in mine.opt.state[mine.params[0]].items()
        if k in ("exp_avg", "exp_avg_sq")
    }
    bad = {**saved, "state": {**saved["state"], 0: {**saved["state"][0]}}}
    bad["state"][0]["GG"] = [np.zeros((3, 3), np.float32), saved["state"][0]["GG"][1]]
    with pytest.raises(ValueError, match=r"GG\[0\].*shape \(3, 3\)"):
        mine.opt.load_state_dict(bad)
    del bad["state"][0]["Q"]
    with pytest.raises(ValueError, match="missing"):
        mine.opt.load_state_dict(bad)
    after = mine.opt.state[mine.params[0]]
    for name, value in before.items():
        np.testing.assert_array_equal(np.asarray(after[name]), value)


# ------------------------------------------------------------------ signature, checks


def test_the_signature_is_the_references():
    ref = inspect.signature(RefSOAP)
    mine = inspect.signature(lucid.optim.SOAP)
    wanted = [(p.name, p.default) for p in ref.parameters.values() if p.kind != p.VAR_KEYWORD]
    assert [(p.name, p.default) for p in mine.parameters.values()] == wanted
    assert list(inspect.signature(lucid.functional.soap).parameters) == [n for n, _ in wanted[1:]]


BAD = [
    {"lr": -1.0},
    {"betas": (1.0, 0.9)},
    {"betas": (0.9, -0.1)},
    {"shampoo_beta": -0.5},
    {"weight_decay": -1e-3},
    {"precondition_frequency": 0},
    {"max_precondition_dim": -1},
    {"eps": -1e-8},
]


@pytest.mark.parametrize("options", BAD, ids=str)
def test_bad_options_raise_the_references_error(options):
    with pytest.raises(Exception) as want:
        RefSOAP([torch.zeros(2)], **options)
    for make in (
        lambda: lucid.optim.SOAP([lucid.Parameter(jnp.zeros(2))], **options),
        lambda: lucid.functional.soap(**options),
    ):
        with pytest.raises(ValueError) as got:
            make()
        assert type(got.value).__name__ in (type(want.value).__name__, "ValueError")
        assert type(got.value).__name__ == type(want.value).__name__ or isinstance(
            want.value, ValueError
        )
        assert str(got.value) == str(want.value)


def test_merging_every_axis_into_one_is_refused_in_words_before_anything_moves():
    """The reference's merge_small_dims gives [1] when a parameter's axes all fit in one
    merged axis, and its reshape then fails (a RuntimeError); lucid refuses at the first
    step, with the reshape's words and the fix, and nothing moves."""
    w = torch.zeros((2, 3), requires_grad=True)
    w.grad = torch.ones((2, 3))
    with pytest.raises(RuntimeError) as want:
        RefSOAP([w], merge_dims=True).step()
    p = lucid.Parameter(jnp.zeros((2, 3)))
    opt = lucid.optim.SOAP([p], merge_dims=True)
    p.grad = jnp.ones((2, 3))
    with pytest.raises(RuntimeError) as got:
        opt.step()
    assert str(want.value) in str(got.value) and "merge_dims=False" in str(got.value)
    assert len(opt.state[p]) == 0 and "step" not in opt.param_groups[0]


def test_merge_small_dims_is_the_references():
    from pytorch_optimizer.optimizer.utils.shape import merge_small_dims as ref

    for shape in [(1, 2, 512, 1, 2048, 1, 3, 4), (2, 3, 4, 5), (4, 6), (7,), (), (3, 1, 9)]:
        for top in (1, 4, 8, 24, 1024):
            assert merge_small_dims(shape, top) == ref(list(shape), top)


def test_preconditioners_cut_the_flat_layout():
    flags = {
        "max_precondition_dim": 5,
        "merge_dims": False,
        "precondition_1d": False,
        "channels_last": False,
    }
    dims = entries((6, 2, 3), flags)
    assert dims == (0, 2, 3)
    flat = jnp.arange(13.0)
    cut = preconditioners(flat, dims)
    assert cut[0] is None and cut[1].tolist() == [[0, 1], [2, 3]] and cut[2].shape == (3, 3)


# ------------------------------------------------------------------ the compiled program


def test_the_refresh_is_a_conditional_inside_one_float32_program():
    """One compiled program for every step: the first step's eigendecomposition and the
    refresh's QR are branches of conditionals (not Python branches on the step), and
    a float32 step holds no float64 value and no host callback."""
    tx = lucid.functional.soap(precondition_frequency=2)
    params = {"w": jnp.ones((3, 4), jnp.float32)}
    state = tx.init(params)
    text = jax.jit(tx.update).lower(params, state, params).as_text()
    assert text.count("stablehlo.case") + text.count("stablehlo.if") >= 2
    assert "f64" not in text
    assert "callback" not in text.lower()


def test_the_transform_counts_steps_and_skips_the_first_update():
    tx = lucid.functional.soap(lr=0.1)
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(3)}
    state = tx.init(params)
    grads = {"w": jnp.eye(2), "b": jnp.ones(3)}
    updates, state = tx.update(grads, state, params)
    assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree_util.tree_leaves(updates))
    updates, state = tx.update(grads, state, params)
    assert float(jnp.abs(updates["w"]).max()) > 0
    assert int(state.step["w"]) == 2 and state.GG["b"].shape == (0,)
