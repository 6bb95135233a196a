"""torch's gradient clipping math (`torch.nn.utils.clip_grad_norm_`), pure.

The total norm is the `norm_type`-norm of the per-tensor norms (so
`norm_type=0` counts the tensors with a nonzero entry), and every gradient
is multiplied by

$$
c = \\min\\Big(1, \\frac{\\text{max\\_norm}}{\\text{total} + 10^{-6}}\\Big).
$$

optax's `clip_by_global_norm` scales by `max_norm / max(total, max_norm)`
instead (no `1e-6`, 2-norm only); `clip_grad_norm` is torch's rule as an
optax transform, for pure pipelines and for `fused_step(grad_transform=...)`.

Dtypes as torch's: a tensor's norm is in its own dtype (bfloat16 and float16
reduced in float32, then rounded), the norms are stacked in the dtype they
promote to, and each gradient is scaled in its opmath dtype (float32 for the
16-bit floats) and rounded back.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._arrays import is_sparse
from ._math import max_abs, min_abs

__all__ = [
    "clip_grad_norm",
]

Array = jax.Array


def opmath(dtype: Any) -> np.dtype:
    """The dtype torch computes elementwise ops of `dtype` in: float32 for the floats
    narrower than 32 bits (bfloat16, float16), else `dtype` itself."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def _real(dtype: Any) -> np.dtype:
    """The dtype of a norm of `dtype`'s values (complex64 -> float32)."""
    dtype = np.dtype(dtype)
    return np.dtype(jnp.finfo(dtype).dtype) if jnp.issubdtype(dtype, jnp.inexact) else dtype


def check_dense(tensors: list[Any], where: str) -> None:
    """torch's clipping has no sparse kernels: refuse a sparse array in words.

    Raises:
      NotImplementedError: one of `tensors` is a `jax.experimental.sparse` array.
    """
    for tensor in tensors:
        if is_sparse(tensor):
            raise NotImplementedError(
                f"{where}: a sparse gradient ({type(tensor).__name__} of shape "
                f"{tuple(tensor.shape)}) cannot be clipped; torch's clipping has no sparse "
                "kernel either (NotImplementedError for a sparse COO tensor). Clip its "
                "dense form (.todense()) instead"
            )


def vector_norm(x: Array, norm_type: float) -> Array:
    """`torch.linalg.vector_norm` of `x` flattened, for any order.

    As torch's: a bfloat16 or float16 `x` is reduced in float32 and the norm
    rounded to `x`'s dtype (the real dtype, for a complex `x`).

    Raises:
      RuntimeError: `x` is empty and `norm_type` is infinite or negative (the norm
        has no value there; torch's error, in its words)."""
    out = _real(x.dtype)
    if x.size == 0 and (norm_type < 0 or math.isinf(norm_type)):
        # torch's words (the minimum or maximum of no element, or 0 to a negative power)
        raise RuntimeError(
            f"linalg.vector_norm cannot compute the {norm_type:g} norm on an empty tensor "
            "because the operation does not have an identity: leave the empty arrays out, or "
            "use a finite norm_type >= 0"
        )
    x = jnp.ravel(x)
    x = x.astype(opmath(x.dtype)) if jnp.issubdtype(x.dtype, jnp.floating) else x
    if norm_type == float("inf"):
        norm = max_abs(x)
    elif norm_type == float("-inf"):
        norm = min_abs(x)
    elif norm_type == 0:
        norm = jnp.sum(x != 0).astype(opmath(out))
    elif norm_type in (1, 2):
        norm = jnp.linalg.norm(x, ord=norm_type)
    else:
        norm = jnp.sum(jnp.abs(x) ** norm_type) ** (1.0 / norm_type)
    return norm.astype(out)


def by_dtype(dtypes: list[Any]) -> list[int]:
    """The order torch's total norm stacks the norms of tensors of ``dtypes`` in: grouped
    by dtype (torch's `_group_tensors_by_device_and_dtype`, the groups in order of first
    appearance), in the given order within a group."""
    first: dict[np.dtype, int] = {}
    for dtype in dtypes:
        first.setdefault(np.dtype(dtype), len(first))
    return sorted(range(len(dtypes)), key=lambda i: first[np.dtype(dtypes[i])])


def total_norm(tensors: list[Array], norm_type: float) -> Array:
    """The `norm_type`-norm of the tensors' norms (torch's `get_total_norm`).

    Each tensor's norm is in its own dtype; the norms are stacked in the
    dtype they promote to (bfloat16 and float32 norms: float32) and the
    total is taken in it, as torch's `torch.stack` of the per-dtype norms,
    in torch's order (`by_dtype`): the sum rounds in that order, so every
    caller (a Parameter's own array, a flat buffer's view, a pytree's leaf)
    gets the same total for the same list."""
    norms = [vector_norm(t, norm_type) for t in tensors]
    return norm_of_norms(norms, [t.dtype for t in tensors], norm_type)


def norm_of_norms(norms: list[Array], dtypes: list[Any], norm_type: float) -> Array:
    """The second half of `total_norm`: the `norm_type`-norm of the tensors' norms
    (each tensor's dtype in `dtypes`), stacked in torch's order and promoted dtype. For
    norms taken apart (on several devices, as torch's clipping takes them per device)."""
    norms = [norms[i] for i in by_dtype(dtypes)]
    dtype = jnp.result_type(*norms)
    return vector_norm(jnp.stack([n.astype(dtype) for n in norms]), norm_type)


def clip_coefficient(max_norm: Any, total: Array) -> Array:
    """`min(1, max_norm / (total + 1e-6))`, in `total`'s dtype, rounded as torch's
    (`max_norm / t` is torch's `t.reciprocal() * max_norm`)."""
    dtype, op = total.dtype, opmath(total.dtype)
    denominator = (total.astype(op) + jnp.asarray(1e-6, op)).astype(dtype)
    reciprocal = jnp.reciprocal(denominator.astype(op)).astype(dtype)
    coef = (reciprocal.astype(op) * jnp.asarray(max_norm).astype(op)).astype(dtype)
    return jnp.minimum(coef, jnp.asarray(1.0, dtype))


def scale(grad: Array, coef: Array, times: int = 1) -> Array:
    """`grad` multiplied by the 0-d `coef` `times` times in place, as torch's `mul_` does it:
    in `grad`'s opmath dtype (float32 for bfloat16), `coef` read in that dtype, the
    result rounded to `grad`'s dtype each time (a Parameter listed twice is scaled twice)."""
    op = opmath(grad.dtype)
    factor = coef.astype(op) if jnp.issubdtype(op, jnp.inexact) else coef
    for _ in range(times):
        grad = (grad.astype(op) * factor).astype(grad.dtype)
    return grad


def clip_grad_norm(max_norm: float, norm_type: float = 2.0) -> optax.GradientTransformation:
    """torch's `clip_grad_norm_` as a stateless optax transform over any gradient pytree.

    With $g_1, \\dots, g_k$ the leaves of the gradient pytree and $p$ =
    `norm_type`, the total norm is the $p$-norm of the leaves' $p$-norms,
    $N = \\lVert (\\lVert g_1 \\rVert_p, \\dots, \\lVert g_k \\rVert_p) \\rVert_p$
    (as if the leaves were one vector), and every leaf is scaled by

    $$
    c = \\min\\left(1, \\frac{\\text{max\\_norm}}{N + 10^{-6}}\\right),
    $$

    as torch's `clip_grad_norm_` does (optax's `clip_by_global_norm` scales
    by `max_norm / max(N, max_norm)`, 2-norm only). Use it in an optax chain
    or as [fused_step][lucid.fused_step]'s `grad_transform`; for
    Parameters' `.grad`, [clip_grad_norm_][lucid.nn.utils.clip_grad_norm_].

    Args:
      max_norm: the largest total norm kept (`max_norm` above).
      norm_type: the order $p$ of the norms (`float("inf")` for the max norm;
        0 counts the leaves with a nonzero entry).

    The norms and the scaling follow torch's dtype rule: over bfloat16 and
    float32 leaves the total is float32, and every leaf keeps its dtype.

    Returns:
      An optax `GradientTransformation` (stateless: `init` returns
      `optax.EmptyState()`) whose updates are the clipped gradients; its
      `update` raises `NotImplementedError` for a sparse leaf
      (`jax.experimental.sparse`), as torch's clipping has no sparse kernel,
      and `RuntimeError` for an empty leaf with an infinite or negative
      `norm_type` (torch's error: that norm has no value).

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> tx = LF.clip_grad_norm(1.0)
      >>> updates, _ = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init(None))
      >>> [round(x, 4) for x in updates["w"].tolist()]
      [0.6, 0.8]
    """
    norm_type = float(norm_type)

    def init_fn(params: Any) -> optax.EmptyState:
        return optax.EmptyState()

    def update_fn(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        leaves, treedef = jax.tree_util.tree_flatten(updates, is_leaf=is_sparse)
        if not leaves:
            return updates, state
        check_dense(leaves, "clip_grad_norm")
        coef = clip_coefficient(max_norm, total_norm(leaves, norm_type))
        return treedef.unflatten([scale(g, coef) for g in leaves]), state

    return optax.GradientTransformation(init_fn, update_fn)
