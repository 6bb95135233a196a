"""Sparse gradients: a `jax.experimental.sparse.BCOO` gradient as the rules and the engine
read it.

A BCOO gradient's *present* entries are its stored indices (duplicates summed, as torch's
``coalesce`` does; explicit zeros included); indices outside the parameter are padding
(``sum_duplicates`` under ``jax.jit`` pads with the shape as index) and are dropped.
Everything here is written for every backend, Apple GPUs included (`docs/backends.md`):
no cumulative sum, and every gather and scatter in bounds.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array


def unbatched(grad: Any) -> Any:
    """A BCOO array with no batch dimensions (its layout changed if it has some)."""
    from jax.experimental import sparse  # a sparse gradient: already imported

    return sparse.bcoo_update_layout(grad, n_batch=0) if grad.n_batch else grad


@jax.jit
def bcoo_to_dense(grad: Any) -> Array:
    """A BCOO array as a dense one, duplicates summed and entries outside the shape
    (padding) ignored, with in-bounds indices only (so it runs on Apple GPUs too).

    Examples:
      >>> import jax.numpy as jnp
      >>> from jax.experimental import sparse
      >>> g = sparse.BCOO((jnp.array([1.0, 2.0, 5.0]), jnp.array([[1], [1], [4]])), shape=(4,))
      >>> bcoo_to_dense(g).tolist()
      [0.0, 3.0, 0.0, 0.0]
    """
    grad = unbatched(grad)
    shape, n_sparse = grad.shape, grad.n_sparse
    if n_sparse == 0:
        return grad.data.sum(0)
    indices = grad.indices
    bounds = jnp.asarray(shape[:n_sparse], indices.dtype)
    valid = jnp.all((indices >= 0) & (indices < bounds), axis=-1)
    indices = jnp.where(valid[:, None], indices, jnp.zeros_like(indices))
    mask = valid.reshape(valid.shape + (1,) * (grad.data.ndim - 1))
    data = jnp.where(mask, grad.data, jnp.zeros_like(grad.data))
    at = tuple(indices[:, k] for k in range(n_sparse))
    return jnp.zeros(shape, grad.dtype).at[at].add(data, mode="promise_in_bounds")


def stored_entries(grad: Any) -> Array:
    """The mask of the entries a BCOO gradient stores (its in-bounds indices), shaped as
    the gradient: where a sparse rule changes anything.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jax.experimental import sparse
      >>> g = sparse.BCOO((jnp.array([0.0, 2.0]), jnp.array([[1], [3]])), shape=(4,))
      >>> stored_entries(g).tolist()
      [False, True, False, True]
    """
    from jax.experimental import sparse  # a sparse gradient: already imported

    marks = sparse.BCOO((jnp.ones(grad.data.shape, jnp.int32), grad.indices), shape=grad.shape)
    return bcoo_to_dense(marks) > 0


def dense(grad: Any) -> Any:
    """A gradient as a dense array (a BCOO through `bcoo_to_dense`: one program, Metal-safe);
    a dense gradient as it is."""
    if hasattr(grad, "todense"):
        return bcoo_to_dense(grad) if hasattr(grad, "indices") else grad.todense()
    return grad


def _lexicographic_less(a: tuple[Array, ...], b: tuple[Array, ...]) -> Array:
    less, equal = jnp.zeros(a[0].shape, bool), jnp.ones(a[0].shape, bool)
    for x, y in zip(a, b):
        less = less | (equal & (x < y))
        equal = equal & (x == y)
    return less


def coalesced(
    indices: Array, data: Array, shape: tuple[int, ...], dtype: Any
) -> tuple[tuple[Array, ...], Array, Array]:
    """A BCOO gradient's entries with their duplicates summed (torch's ``coalesce``), in
    O(nnz log nnz): ``(at, summed, any_valid)``.

    No cumulative sum (``bcoo_sum_duplicates`` uses one, which jax lowers for Metal
    through padding ops jax-metal cannot run). Entries outside ``shape`` are redirected
    to the first valid entry with a zero value.
    The entries are sorted by index; each finds the first entry of its run of equal
    indices by an unrolled binary search, the values are summed there, and every entry of
    a run reads that sum, so a scatter of values computed from it writes agreeing
    duplicates.

    Args:
      indices: the gradient's ``(nse, n_sparse)`` indices (no batch dimensions).
      data: its values, ``(nse, *dense dimensions)``.
      shape: the parameter's shape.
      dtype: the parameter's dtype, which the values take.

    Returns:
      ``at``: the sorted, in-bounds index of each entry, one array per sparse dimension
      (duplicates kept); ``summed``: the sum of the values of each entry's index, in
      ``dtype``; ``any_valid``: whether any entry lies inside ``shape`` (if none does,
      ``at`` points at index 0 and nothing is present).

    Examples:
      >>> import jax.numpy as jnp
      >>> at, summed, any_valid = coalesced(
      ...     jnp.array([[3], [1], [3]]), jnp.array([1.0, 2.0, 4.0]), (4,), jnp.float32)
      >>> at[0].tolist(), summed.tolist(), bool(any_valid)
      ([1, 3, 3], [2.0, 5.0, 5.0], True)
    """
    nse, n_sparse = indices.shape
    bounds = jnp.asarray(shape[:n_sparse], indices.dtype)
    valid = jnp.all((indices >= 0) & (indices < bounds), axis=-1)
    any_valid = jnp.any(valid)
    # int32 throughout: under x64 jnp's defaults (argmax, Python ints) would be int64
    first_valid = jax.lax.argmax(valid, 0, jnp.int32)  # 0 when none is: clamped below
    indices = jnp.where(valid[:, None], indices, indices[first_valid])
    indices = jnp.clip(indices, jnp.zeros_like(bounds), bounds - 1)
    values = data.astype(dtype)
    mask = valid.reshape((nse,) + (1,) * (values.ndim - 1))
    values = jnp.where(mask, values, jnp.zeros_like(values))

    order = jnp.arange(nse, dtype=jnp.int32)
    *columns, order = jax.lax.sort((*indices.T, order), num_keys=n_sparse)
    columns = tuple(columns)
    values = values[order]
    # first[i]: the first position whose index equals entry i's (a lower bound)
    first = jnp.zeros(nse, jnp.int32)
    span = 1 << (nse.bit_length() - 1)
    while span:
        candidate = first + span
        probe = jnp.minimum(candidate, jnp.int32(nse)) - 1
        ahead = _lexicographic_less(tuple(c[probe] for c in columns), columns)
        first = jnp.where((candidate <= nse) & ahead, candidate, first)
        span >>= 1
    summed = jnp.zeros_like(values).at[first].add(values)[first]
    return columns, summed, any_valid
