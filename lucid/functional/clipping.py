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
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

Array = jax.Array


def vector_norm(x: Array, norm_type: float) -> Array:
    """`torch.linalg.vector_norm` of `x` flattened, for any order."""
    x = jnp.ravel(x)
    if x.dtype in (jnp.bfloat16, jnp.float16):
        # torch accumulates half-precision norms in float32 and rounds the result once
        return vector_norm(x.astype(jnp.float32), norm_type).astype(x.dtype)
    if norm_type == float("inf"):
        return jnp.max(jnp.abs(x)) if x.size else jnp.zeros((), x.dtype)
    if norm_type == float("-inf"):
        return jnp.min(jnp.abs(x))
    if norm_type == 0:
        return jnp.sum(x != 0).astype(x.dtype)
    if norm_type in (1, 2):
        return jnp.linalg.norm(x, ord=norm_type)
    return jnp.sum(jnp.abs(x) ** norm_type) ** (1.0 / norm_type)


def total_norm(tensors: list[Array], norm_type: float) -> Array:
    """The `norm_type`-norm of the tensors' norms (torch's `get_total_norm`)."""
    norms = jnp.stack([vector_norm(t, norm_type).astype(tensors[0].dtype) for t in tensors])
    return vector_norm(norms, norm_type)


def clip_coefficient(max_norm: Any, total: Array) -> Array:
    """`min(1, max_norm / (total + 1e-6))`."""
    return jnp.minimum(max_norm / (total + 1e-6), 1.0)


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

    Returns:
      An optax `GradientTransformation` (stateless: `init` returns
      `optax.EmptyState()`) whose updates are the clipped gradients.

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
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        if not leaves:
            return updates, state
        coef = clip_coefficient(max_norm, total_norm(leaves, norm_type))
        return treedef.unflatten([g * coef.astype(g.dtype) for g in leaves]), state

    return optax.GradientTransformation(init_fn, update_fn)
