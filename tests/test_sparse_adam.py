"""lucid.functional.sparse_adam against torch.optim.SparseAdam.

The problem is two embedding tables looked up with a different batch of row
indices at every step (duplicates included, some rows skipped, two rows of one
table never used, one step with an empty batch). torch gets the sparse
gradients of ``F.embedding(..., sparse=True)``; lucid gets, from the same loss
in JAX, either the dense gradient (zero on unused rows) or a BCOO gradient
built from the gradient of the looked-up rows, one stored entry per lookup,
so the indices repeat as torch's uncoalesced gradient's do.
"""

from __future__ import annotations

import functools
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from jax.experimental import sparse
from oracle import F32_RTOL_FLOOR, TORCH_DTYPE, relative_error, torch_default_dtype

from lucid.functional.sparse_adam import SparseAdamState, sparse_adam

STEPS = 50
USER_ROWS, USER_USED, USER_DIM = 10, 8, 4  # rows 8 and 9 are never looked up
ITEM_ROWS, ITEM_DIM = 7, 3
BATCH = 6
EMPTY_ITEM_STEP = 7  # the item batch is empty at this step: torch counts the step, skips the rest

_RNG = np.random.default_rng(2024)
_INIT = {
    "item": _RNG.normal(size=(ITEM_ROWS, ITEM_DIM)),
    "user": _RNG.normal(size=(USER_ROWS, USER_DIM)),
}
_MIX = _RNG.normal(size=(USER_DIM, ITEM_DIM))
_TARGET = _RNG.normal(size=(BATCH, ITEM_DIM))


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """(user rows, item rows) per step; every user batch repeats its first row."""
    rng = np.random.default_rng(7)
    out = []
    for step in range(STEPS):
        users = rng.integers(0, USER_USED, size=BATCH)
        users[1] = users[0]
        items = rng.integers(0, ITEM_ROWS, size=BATCH if step != EMPTY_ITEM_STEP else 0)
        out.append((users, items))
    return out


BATCHES = _batches()
KEYS = sorted(_INIT)  # torch's parameter order

OPTIONS = [
    {"lr": 0.05},
    {"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-6},
    {"lr": 0.05, "maximize": True},
]


def _ids(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items())


# --- the loss on looked-up rows, in both frameworks ------------------------------------------


def _row_loss_jax(user_rows: jax.Array, item_rows: jax.Array) -> jax.Array:
    pred = jnp.tanh(user_rows @ jnp.asarray(_MIX, user_rows.dtype))
    user_term = jnp.mean((pred - jnp.asarray(_TARGET, user_rows.dtype)) ** 2)
    item_term = jnp.sum(0.5 * item_rows**2 + 0.3 * jnp.sin(3 * item_rows))
    return user_term + item_term


def _row_loss_torch(user_rows: torch.Tensor, item_rows: torch.Tensor) -> torch.Tensor:
    pred = torch.tanh(user_rows @ torch.as_tensor(_MIX, dtype=user_rows.dtype))
    user_term = torch.mean((pred - torch.as_tensor(_TARGET, dtype=user_rows.dtype)) ** 2)
    item_term = torch.sum(0.5 * item_rows**2 + 0.3 * torch.sin(3 * item_rows))
    return user_term + item_term


def _loss_jax(params: dict, users: jax.Array, items: jax.Array) -> jax.Array:
    return _row_loss_jax(params["user"][users], params["item"][items])


# --- gradients in the forms lucid accepts ------------------------------------------------------


def dense_grads(params: dict, users: jax.Array, items: jax.Array) -> dict:
    """The ordinary gradient: zero on every row not looked up."""
    return jax.grad(_loss_jax)(params, users, items)


def _row_grads(params: dict, users: jax.Array, items: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.grad(_row_loss_jax, argnums=(0, 1))(params["user"][users], params["item"][items])


def row_bcoo_grads(params: dict, users: jax.Array, items: jax.Array) -> dict:
    """One stored row per lookup (``n_dense=1``): torch's uncoalesced layout, duplicates kept."""
    g_user, g_item = _row_grads(params, users, items)
    return {
        "item": sparse.BCOO((g_item, items[:, None]), shape=params["item"].shape),
        "user": sparse.BCOO((g_user, users[:, None]), shape=params["user"].shape),
    }


def _elementwise(rows: jax.Array, row_index: jax.Array, shape: tuple[int, int]) -> sparse.BCOO:
    """One stored element per looked-up value, plus two padding entries whose indices are
    out of bounds and whose values are zero, as jax pads: they must be ignored (a nonzero
    value out of bounds is torch's IndexError: test_bad_input.py)."""
    n, dim = rows.shape
    indices = jnp.stack(
        [jnp.repeat(row_index, dim), jnp.tile(jnp.arange(dim, dtype=row_index.dtype), n)], axis=1
    )
    padding = jnp.asarray([[shape[0], 0], [0, shape[1]]], row_index.dtype)
    data = jnp.concatenate([rows.reshape(-1), jnp.zeros(2, rows.dtype)])
    return sparse.BCOO((data, jnp.concatenate([indices, padding])), shape=shape)


def element_bcoo_grads(params: dict, users: jax.Array, items: jax.Array) -> dict:
    """One stored element per value (``n_dense=0``), duplicates and padding included."""
    g_user, g_item = _row_grads(params, users, items)
    return {
        "item": _elementwise(g_item, items, params["item"].shape),
        "user": _elementwise(g_user, users, params["user"].shape),
    }


def batched_bcoo_grads(params: dict, users: jax.Array, items: jax.Array) -> dict:
    """``BCOO.fromdense(..., n_batch=1)`` of the dense gradient: a batched layout whose
    short rows are padded by out-of-bounds indices."""
    grads = dense_grads(params, users, items)
    return {k: sparse.BCOO.fromdense(g, nse=g.shape[1], n_batch=1) for k, g in grads.items()}


def mixed_grads(params: dict, users: jax.Array, items: jax.Array) -> dict:
    """A dense leaf and a BCOO leaf in one gradient tree."""
    user = row_bcoo_grads(params, users, items)["user"]
    return {**dense_grads(params, users, items), "user": user}


GRADS = {
    "dense": dense_grads,
    "rows": row_bcoo_grads,
    "elements": element_bcoo_grads,
    "batched": batched_bcoo_grads,
    "mixed": mixed_grads,
}


# --- the two runs ------------------------------------------------------------------------------


def run_torch(options: dict, dtype: str, steps: int = STEPS) -> tuple[dict, dict]:
    return _run_torch(tuple(options.items()), dtype, steps)


@functools.cache  # several tests compare against the same torch run
def _run_torch(options: tuple, dtype: str, steps: int) -> tuple[dict, dict]:
    options = dict(options)
    tdtype = TORCH_DTYPE[dtype]
    with torch_default_dtype(tdtype):
        params = {k: torch.tensor(_INIT[k], dtype=tdtype, requires_grad=True) for k in KEYS}
        opt = torch.optim.SparseAdam([params[k] for k in KEYS], **options)
        for users, items in BATCHES[:steps]:
            opt.zero_grad()
            user_rows = torch.nn.functional.embedding(
                torch.as_tensor(users), params["user"], sparse=True
            )
            item_rows = torch.nn.functional.embedding(
                torch.as_tensor(items), params["item"], sparse=True
            )
            _row_loss_torch(user_rows, item_rows).backward()
            assert params["user"].grad.is_sparse and params["item"].grad.is_sparse
            opt.step()
        return {k: v.detach().numpy().copy() for k, v in params.items()}, opt.state_dict()


def run_lucid(
    options: dict, dtype: str, grads: str = "dense", steps: int = STEPS, jit: bool = True
) -> tuple[dict, SparseAdamState]:
    """``steps`` updates of ``sparse_adam(**options)`` with gradients in the form ``grads``."""
    return _run_lucid(tuple(options.items()), dtype, grads, steps, jit)


@functools.cache  # compiling dominates: tests share identical runs
def _run_lucid(
    options: tuple, dtype: str, grads: str, steps: int, jit: bool
) -> tuple[dict, SparseAdamState]:
    tx = sparse_adam(**dict(options))
    grad_fn = GRADS[grads]

    def step(params, state, users, items):
        updates, state = tx.update(grad_fn(params, users, items), state, params)
        return optax.apply_updates(params, updates), state

    if jit:
        step = jax.jit(step)
    params = {k: jnp.asarray(v, dtype) for k, v in _INIT.items()}
    state = tx.init(params)
    for users, items in BATCHES[:steps]:
        params, state = step(params, state, jnp.asarray(users), jnp.asarray(items, jnp.int32))
    return {k: np.asarray(v) for k, v in params.items()}, state


def _assert_close(actual, expected, rtol: float, what: str) -> None:
    err = relative_error(actual, expected)
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:.3g}"


# --- parity --------------------------------------------------------------------------------------


# Every option set with dense gradients; each BCOO layout with one option set (the
# agreement test below ties the layouts to the dense path for the rest).
FLOAT64_CASES = [(options, "dense") for options in OPTIONS] + [
    (OPTIONS[2], "rows"),
    (OPTIONS[1], "elements"),
    (OPTIONS[1], "mixed"),
]


@pytest.mark.fast
@pytest.mark.parametrize(
    ("options", "grads"), FLOAT64_CASES, ids=[f"{g}-{_ids(o)}" for o, g in FLOAT64_CASES]
)
def test_float64_matches_torch(options, grads):
    expected, torch_state = run_torch(options, "float64")
    actual, state = run_lucid(options, "float64", grads)
    for index, key in enumerate(KEYS):
        _assert_close(actual[key], expected[key], 1e-10, f"param {key}")
        torch_fields = torch_state["state"][index]
        assert set(torch_fields) == set(SparseAdamState._fields)
        assert float(state.step[key]) == torch_fields["step"] == STEPS
        for field in ("exp_avg", "exp_avg_sq"):
            _assert_close(
                getattr(state, field)[key], torch_fields[field].numpy(), 1e-10, f"{field}[{key}]"
            )


def test_rows_never_looked_up_never_change():
    actual, state = run_lucid(OPTIONS[2], "float64", "rows")
    unused = slice(USER_USED, None)
    np.testing.assert_array_equal(actual["user"][unused], _INIT["user"][unused])
    np.testing.assert_array_equal(np.asarray(state.exp_avg["user"])[unused], 0.0)
    np.testing.assert_array_equal(np.asarray(state.exp_avg_sq["user"])[unused], 0.0)
    assert np.all(actual["user"][:USER_USED] != _INIT["user"][:USER_USED])


FLOAT32_CASES = [(OPTIONS[0], "dense"), (OPTIONS[1], "dense"), (OPTIONS[2], "rows")]


@pytest.mark.parametrize(
    ("options", "grads"), FLOAT32_CASES, ids=[f"{g}-{_ids(o)}" for o, g in FLOAT32_CASES]
)
def test_float32_matches_torch_within_its_own_rounding_drift(options, grads):
    """float32 cannot match bit for bit: torch computes ``step_size`` in double on the
    host and rounds it once, lucid in float32 on the device (no float64 in a float32
    step), and the two sum duplicate lookups in different orders. Both errors are
    rounding-sized and Adam's normalised steps do not amplify them, so the tolerance is
    torch's own float32-vs-float64 drift on this problem (x4), floored at 2e-6."""
    exact, _ = run_torch(options, "float64")
    expected, _ = run_torch(options, "float32")
    actual, state = run_lucid(options, "float32", grads)
    for key in KEYS:
        assert actual[key].dtype == np.float32
        assert state.exp_avg[key].dtype == jnp.float32
        drift = relative_error(expected[key], exact[key])
        _assert_close(actual[key], expected[key], max(4 * drift, F32_RTOL_FLOOR), key)


def test_stored_entries_count_even_when_their_value_is_zero():
    """torch updates every stored index of a sparse gradient, also where the value is an
    explicit zero (the moments decay there); a BCOO gradient does the same. Hand-made
    gradients, duplicates included, against torch on the same values."""
    rng = np.random.default_rng(3)
    init = rng.normal(size=(5, 2))
    indices = np.array([[0, 2, 2, 4], [1, 0, 0, 1]])
    torch_param = torch.tensor(init, requires_grad=True)
    opt = torch.optim.SparseAdam([torch_param], lr=0.1)
    tx = sparse_adam(lr=0.1)
    params = jnp.asarray(init)
    state = tx.init(params)
    for step in range(4):
        values = rng.normal(size=4)
        values[0] = 0.0 if step != 0 else values[0]  # (0, 1): nonzero once, then stored zeros
        torch_param.grad = torch.sparse_coo_tensor(indices, values, (5, 2), check_invariants=True)
        opt.step()
        grad = sparse.BCOO((jnp.asarray(values), jnp.asarray(indices.T)), shape=(5, 2))
        updates, state = tx.update(grad, state, params)
        params = optax.apply_updates(params, updates)
        chex.assert_trees_all_close(params, torch_param.detach().numpy(), rtol=1e-12)
    torch_state = opt.state[torch_param]
    chex.assert_trees_all_close(state.exp_avg, torch_state["exp_avg"].numpy(), rtol=1e-12)
    assert float(state.exp_avg[0, 1]) != 0.0  # decayed, kept as stored, not skipped
    assert float(state.exp_avg[0, 0]) == 0.0  # never stored


# --- the paths against each other ---------------------------------------------------------------


@pytest.mark.parametrize("grads", ["rows", "elements", "batched", "mixed"])
def test_bcoo_paths_agree_with_the_dense_path(grads):
    """Same present entries, same result; only the summation order of duplicates differs."""
    dense, dense_state = run_lucid(OPTIONS[1], "float64", "dense")
    other, other_state = run_lucid(OPTIONS[1], "float64", grads)
    chex.assert_trees_all_close(other, dense, rtol=1e-13, atol=0)
    chex.assert_trees_all_close(other_state, dense_state, rtol=1e-13, atol=1e-300)


def test_a_bcoo_without_sparse_dimensions_updates_every_entry():
    """``n_dense`` = ndim: the stored values are the whole gradient, every entry present;
    for a gradient without zeros that is the dense path's result."""
    rng = np.random.default_rng(5)
    tx = sparse_adam(lr=0.1, maximize=True)
    params = {"dense": jnp.asarray(rng.normal(size=(3, 2)))}
    params["bcoo"] = params["dense"]
    state = tx.init(params)
    for _ in range(3):
        grad = jnp.asarray(rng.normal(size=(3, 2)))
        bcoo = sparse.BCOO.fromdense(grad, n_dense=2)
        assert bcoo.n_sparse == 0
        updates, state = jax.jit(tx.update)({"dense": grad, "bcoo": bcoo}, state, params)
        params = optax.apply_updates(params, updates)
    chex.assert_trees_all_close(params["bcoo"], params["dense"], rtol=1e-14)
    chex.assert_trees_all_close(state.exp_avg_sq["bcoo"], state.exp_avg_sq["dense"], rtol=1e-14)


@pytest.mark.parametrize("grads", ["dense", "rows", "elements"])
def test_jit_and_eager_agree(grads):
    jitted, jitted_state = run_lucid(OPTIONS[2], "float64", grads, steps=3)
    eager, eager_state = run_lucid(OPTIONS[2], "float64", grads, steps=3, jit=False)
    chex.assert_trees_all_close(jitted, eager, rtol=1e-13)
    chex.assert_trees_all_close(jitted_state, eager_state, rtol=1e-13, atol=1e-300)


def test_float32_step_has_no_float64():
    """A float32 step must not create float64 values (Apple Metal has none), even with
    x64 enabled as it is in this test session; both paths (a dense and a BCOO leaf)."""
    tx = sparse_adam(lr=0.05)
    params = {k: jnp.asarray(v, jnp.float32) for k, v in _INIT.items()}
    users, items = (jnp.asarray(b, jnp.int32) for b in BATCHES[0])

    def step(params, state):
        return tx.update(mixed_grads(params, users, items), state, params)

    jaxpr = str(jax.make_jaxpr(step)(params, tx.init(params)))
    assert "f64" not in jaxpr


def test_bfloat16_parameters_keep_their_dtype():
    """Both paths: ``item`` gets a dense gradient, ``user`` a BCOO one."""
    tx = sparse_adam(lr=0.05)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in _INIT.items()}
    users, items = (jnp.asarray(b) for b in BATCHES[0])
    grads = mixed_grads(params, users, items)
    updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
    for key in KEYS:
        assert updates[key].dtype == jnp.bfloat16
        assert state.exp_avg[key].dtype == jnp.bfloat16
        assert state.exp_avg_sq[key].dtype == jnp.bfloat16
        assert state.step[key].dtype == jnp.float32
        assert jnp.any(updates[key] != 0)


# --- construction --------------------------------------------------------------------------------


def test_signature_is_torchs():
    ours = inspect.signature(sparse_adam).parameters
    theirs = dict(inspect.signature(torch.optim.SparseAdam.__init__).parameters)
    del theirs["self"], theirs["params"]
    assert list(ours) == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default, name
        assert ours[name].kind == parameter.kind, name


@pytest.mark.parametrize(
    "bad",
    [
        {"lr": 0.0},
        {"lr": -1e-3},
        {"eps": 0.0},
        {"eps": -1e-8},
        {"betas": (1.0, 0.999)},
        {"betas": (-0.1, 0.999)},
        {"betas": (0.9, 1.0)},
    ],
    ids=_ids,
)
def test_invalid_options_raise_torchs_error(bad):
    with pytest.raises(ValueError) as torch_error:
        torch.optim.SparseAdam([torch.zeros(2, requires_grad=True)], **bad)
    with pytest.raises(ValueError) as our_error:
        sparse_adam(**bad)
    assert str(our_error.value) == str(torch_error.value)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError):
        sparse_adam(weight_decay=0.1)


def test_complex_parameters_are_refused():
    # the transform refuses at init, with the error a rule without complex support
    # raises at a step (the class refuses at construction, as torch's)
    with pytest.raises(RuntimeError, match="complex"):
        sparse_adam().init({"w": jnp.zeros(3, jnp.complex64)})


def test_non_bcoo_sparse_gradient_is_refused():
    tx = sparse_adam()
    params = jnp.zeros((3, 3))
    grad = sparse.BCSR.fromdense(jnp.eye(3))
    with pytest.raises(TypeError, match="BCOO"):
        tx.update(grad, tx.init(params), params)
