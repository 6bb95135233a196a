"""`torch.nn.utils`' gradient clipping, over [Parameter][lucid.Parameter] gradients.

Same names, signatures and return values as torch 2.13: `clip_grad_norm_`
returns the total norm (a 0-d array) and scales every gradient by
`min(1, max_norm / (total_norm + 1e-6))`; `clip_grad_value_` clamps them.
Gradients held by a compiled optimizer's flat buffer are clipped as that one
buffer, so clipping thousands of parameters is one small executable, not
thousands of dispatches. The math is `lucid.functional.clipping`'s; for a
pure pipeline, [clip_grad_norm][lucid.functional.clip_grad_norm] is the
same rule as an optax transform.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from .._parameter import Parameter
from .._storage import by_storage
from ..functional import clipping

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]

Array = jax.Array


def _tensors(grads: list[Array], pieces: tuple) -> list[Array]:
    """The gradients as torch sees them, one per parameter: a flat buffer's views."""
    tensors = []
    for grad, piece in zip(grads, pieces):
        if piece is None:
            tensors.append(grad)
        else:
            layout, indices = piece
            views = layout.split(grad)
            tensors.extend(views[i] for i in indices)
    return tensors


@functools.partial(jax.jit, static_argnums=(1, 2))
def _total_norm(grads: list[Array], pieces: tuple, norm_type: float) -> Array:
    return clipping.total_norm(_tensors(grads, pieces), norm_type)


@jax.jit
def _scaled(grads: list[Array], max_norm: Array, total_norm: Array) -> list[Array]:
    coef = clipping.clip_coefficient(max_norm, total_norm)
    return [g * coef.astype(g.dtype) for g in grads]


@functools.partial(jax.jit, static_argnums=(2, 3))
def _clipped_by_norm(grads: list[Array], max_norm: Array, pieces: tuple, norm_type: float):
    total = _total_norm(grads, pieces, norm_type)
    return total, _scaled(grads, max_norm, total)


@jax.jit
def _clamped(grads: list[Array], clip_value: Array) -> list[Array]:
    return [jnp.clip(g, -clip_value.astype(g.dtype), clip_value.astype(g.dtype)) for g in grads]


def _parameters(parameters: Parameter | Iterable[Parameter]) -> list[Parameter]:
    if isinstance(parameters, Parameter):
        return [parameters]
    is_generator = isinstance(parameters, types.GeneratorType)
    params = list(parameters)
    if is_generator and not params:
        warnings.warn(
            "`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=3
        )
    return params


class _Gradients:
    """The gradients of some parameters as a few arrays: a storage's whole gradient
    buffer where these parameters are all of its gradients, else one array each."""

    def __init__(self, params: list[Parameter]) -> None:
        # presence from the storages: reading p.grad would cut a slice per parameter
        with_grad = [p for p in params if p.location[0].grad_present(p.location[1])]
        self.arrays: list[Array] = []
        pieces: list[Any] = []  # per array: None (one tensor) or (layout, indices)
        self._writers: list[Any] = []
        for storage, indices in by_storage(p.location for p in with_grad):
            buffer = storage.grad_buffer(indices)
            if buffer is not None:
                self.arrays.append(buffer)
                several = storage.layout.param_count > 1
                pieces.append((storage.layout, tuple(sorted(indices))) if several else None)
                self._writers.append(storage.set_grad_buffer)
                continue
            for index in indices:
                self.arrays.append(storage.grad(index))
                pieces.append(None)
                self._writers.append(functools.partial(storage.set_grad, index))
        self.pieces = tuple(pieces)

    def write(self, arrays: list[Array]) -> None:
        for writer, array in zip(self._writers, arrays):
            writer(array)


def get_total_norm(
    tensors: Array | Iterable[Array],
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Array:
    """The norm of the norms of `tensors`, as if they were one vector (torch's `get_total_norm`).

    $N = \\lVert (\\lVert t_1 \\rVert_p, \\dots, \\lVert t_k \\rVert_p) \\rVert_p$
    with $p$ = `norm_type`.

    Args:
      tensors: an array, or an iterable of arrays (e.g. gradients) $t_i$.
      norm_type: the order $p$ of the norms (`float("inf")` for the max norm).
      error_if_nonfinite: raise when the total is nan or inf.
      foreach: accepted for torch compatibility; ignored.

    Returns:
      $N$, a 0-d array (`0.0` for no tensors).

    Raises:
      RuntimeError: `error_if_nonfinite` and a non-finite total.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> grads = [jnp.array([3.0]), jnp.array([4.0])]
      >>> float(lucid.nn.utils.get_total_norm(grads))
      5.0
      >>> float(lucid.nn.utils.get_total_norm(grads, norm_type=float("inf")))
      4.0
    """
    arrays = [tensors] if isinstance(tensors, jax.Array) else list(tensors)
    if not arrays:
        return jnp.asarray(0.0)
    total = _total_norm(arrays, (None,) * len(arrays), float(norm_type))
    _check_finite(total, norm_type, error_if_nonfinite)
    return total


def _check_finite(total: Array, norm_type: float, error_if_nonfinite: bool) -> None:
    if error_if_nonfinite and not bool(jnp.isfinite(total)):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
        )


def clip_grads_with_norm_(
    parameters: Parameter | Iterable[Parameter],
    max_norm: float,
    total_norm: Array,
    foreach: bool | None = None,
) -> None:
    """Scale the gradients by `min(1, max_norm / (total_norm + 1e-6))`, in place (torch's).

    The second half of [clip_grad_norm_][lucid.nn.utils.clip_grad_norm_],
    for a total norm computed otherwise (e.g. over several groups of
    parameters, with [get_total_norm][lucid.nn.utils.get_total_norm]).

    Args:
      parameters: a Parameter or an iterable of them, whose `.grad` is scaled
        (those without one are skipped).
      max_norm: the largest norm kept.
      total_norm: the total norm to scale by, a 0-d array.
      foreach: accepted for torch compatibility; ignored.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> w.grad = jnp.array([3.0, 4.0])
      >>> total = lucid.nn.utils.get_total_norm([w.grad])
      >>> lucid.nn.utils.clip_grads_with_norm_([w], max_norm=1.0, total_norm=total)
      >>> [round(x, 4) for x in w.grad.tolist()]
      [0.6, 0.8]
    """
    grads = _Gradients(_parameters(parameters))
    if grads.arrays:
        grads.write(_scaled(grads.arrays, jnp.asarray(float(max_norm)), total_norm))


def clip_grad_norm_(
    parameters: Parameter | Iterable[Parameter],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Array:
    """Clip the gradients' total norm to `max_norm`, in place (torch's `clip_grad_norm_`).

    With $g_i$ the gradients and $p$ = `norm_type`, the total norm is
    $N = \\lVert (\\lVert g_1 \\rVert_p, \\dots, \\lVert g_k \\rVert_p) \\rVert_p$,
    as if the gradients were one vector, and every gradient is multiplied by

    $$
    c = \\min\\left(1, \\frac{\\text{max\\_norm}}{N + 10^{-6}}\\right).
    $$

    Call it between [backward][lucid.backward] and the optimizer's `step()`.

    Args:
      parameters: a Parameter or an iterable of them (`None` gradients are skipped).
      max_norm: the largest total norm kept.
      norm_type: the order $p$ of the norms (`float("inf")` for the max norm).
      error_if_nonfinite: raise (and change nothing) when $N$ is nan or inf.
      foreach: accepted for torch compatibility; ignored.

    Returns:
      $N$, the total norm before clipping (a 0-d array; `0.0` without gradients).

    Raises:
      RuntimeError: `error_if_nonfinite` and a non-finite total norm.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> w.grad = jnp.array([3.0, 4.0])
      >>> float(lucid.nn.utils.clip_grad_norm_([w], max_norm=1.0))
      5.0
      >>> [round(x, 4) for x in w.grad.tolist()]
      [0.6, 0.8]
    """
    grads = _Gradients(_parameters(parameters))
    if not grads.arrays:
        return jnp.asarray(0.0)
    max_norm = jnp.asarray(float(max_norm))
    if error_if_nonfinite:  # torch checks before anything is scaled
        total = _total_norm(grads.arrays, grads.pieces, float(norm_type))
        _check_finite(total, norm_type, error_if_nonfinite)
        grads.write(_scaled(grads.arrays, max_norm, total))
        return total
    total, scaled = _clipped_by_norm(grads.arrays, max_norm, grads.pieces, float(norm_type))
    grads.write(scaled)
    return total


def clip_grad_value_(
    parameters: Parameter | Iterable[Parameter], clip_value: float, foreach: bool | None = None
) -> None:
    """Clamp every gradient elementwise to `[-clip_value, clip_value]`, in place (torch's).

    Args:
      parameters: a Parameter or an iterable of them (`None` gradients are skipped).
      clip_value: the largest magnitude kept.
      foreach: accepted for torch compatibility; ignored.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(3))
      >>> w.grad = jnp.array([-2.0, 0.5, 3.0])
      >>> lucid.nn.utils.clip_grad_value_(w, clip_value=1.0)
      >>> w.grad.tolist()
      [-1.0, 0.5, 1.0]
    """
    grads = _Gradients(_parameters(parameters))
    if grads.arrays:
        grads.write(_clamped(grads.arrays, jnp.asarray(float(clip_value))))
