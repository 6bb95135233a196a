"""Elementwise building blocks shared by the rules, in torch's order of operations.

torch's CPU kernels fix an order of floating-point operations
(``addcdiv``: ``self + value * t1 / t2``, ``lerp`` switching formula at
weight 0.5); following it keeps float32 trajectories within rounding of torch's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def lerp(start: Array, end: Array, weight: Array) -> Array:
    """``torch.lerp``: ``start + weight*(end-start)`` for ``|weight| < 0.5``, else
    ``end - (end-start)*(1-weight)`` (torch's CPU kernel, exact at both ends; a weight
    may be negative, as schedule-free's ``1 - 1/beta``)."""
    # One select of the base and a scalar coefficient, not both branches per element:
    # ``end + (-(1-w))*diff`` rounds exactly as ``end - diff*(1-w)``.
    diff = end - start
    low = jnp.abs(weight) < 0.5
    return jnp.where(low, start, end) + jnp.where(low, weight, -(1 - weight)) * diff


def sign(x: Array) -> Array:
    """``torch.sign``: ``(x > 0) - (x < 0)``, so ``1``, ``-1`` or ``0``, and ``0`` for NaN
    (``jnp.sign`` gives NaN). No array constant: a Pallas kernel traces it too."""
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def max_abs(x: Array, axis: int | None = None) -> Array:
    """``torch.amax(x.abs())``: the largest magnitude along ``axis``, NaN where any
    element is NaN.

    ``jnp.max`` alone does not promise the NaN on every backend: XLA:CPU (jax 0.10.2)
    reduces 4096 elements or more in a way that drops it (or gives ``-inf`` for ones and
    a last NaN), where torch and XLA on a GPU give NaN. So the magnitudes are reduced as
    their bit patterns, integers in the order of the non-negative floats they encode,
    with every NaN above infinity: one integer max, as cheap as the float one.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.ones(4096).at[-1].set(jnp.nan)
      >>> float(max_abs(x)), float(max_abs(jnp.array([-3.0, 2.0])))
      (nan, 3.0)
    """
    magnitude = jnp.abs(x)
    bits = jnp.dtype(f"int{8 * magnitude.dtype.itemsize}")
    largest = jnp.max(jax.lax.bitcast_convert_type(magnitude, bits), axis=axis)
    return jax.lax.bitcast_convert_type(largest, magnitude.dtype)


def min_abs(x: Array) -> Array:
    """``torch.amin(x.abs())`` over every element: the smallest magnitude, NaN if any
    element is NaN (`max_abs`: ``jnp.min`` may drop a NaN on XLA:CPU)."""
    magnitude = jnp.abs(x)
    nan = jnp.asarray(jnp.nan, magnitude.dtype)
    return jnp.where(jnp.any(jnp.isnan(magnitude)), nan, jnp.min(magnitude))


def host_max(floor: Array, x: Array) -> Array:
    """Python's ``max(floor, x)`` of host floats, as torch computes ``max(eps2, rms)``:
    ``x`` where it is greater, else ``floor``, so a NaN ``x`` gives ``floor``
    (``jnp.maximum`` gives NaN)."""
    return jnp.where(x > floor, x, floor)


def guard(eps: Array) -> Array:
    """A guard against dividing by zero (``eps``) as XLA can compute with it: a nonzero
    subnormal value becomes its dtype's smallest normal number.

    XLA on CPU flushes subnormal numbers to zero in every arithmetic operation, so
    ``Adam(eps=1e-40)`` would divide ``0 / 0`` where torch divides ``0 / 1e-40``.
    The test is on the bits (a comparison would see the flushed value), so a runtime
    value works as well as a constant; normal values and zero pass unchanged.
    """
    eps = jnp.asarray(eps)
    info = jnp.finfo(eps.dtype)
    if info.bits not in (32, 64):  # the compute dtypes; nothing to do elsewhere
        return eps
    uint = jnp.uint32 if info.bits == 32 else jnp.uint64
    bits = jax.lax.bitcast_convert_type(eps, uint)
    magnitude = bits & uint((1 << (info.bits - 1)) - 1)
    smallest_normal = jax.lax.bitcast_convert_type(jnp.asarray(info.tiny, eps.dtype), uint)
    subnormal = (magnitude != 0) & (magnitude < smallest_normal)
    return jnp.where(subnormal, jnp.asarray(info.tiny, eps.dtype), eps)


def one_minus_pow(one_minus_beta: Array, step: Array) -> Array:
    """``1 - beta**step`` computed as ``-expm1(step * log1p(-(1 - beta)))``.

    torch evaluates bias corrections in double precision on the host; this
    form keeps float32 within an ulp of that even when ``beta`` is close to 1,
    where ``1 - beta**step`` in float32 would lose half its digits.
    """
    return -jnp.expm1(step * jnp.log1p(-one_minus_beta))


def power(one_minus_beta: Array, step: Array) -> Array:
    """``beta**step`` from ``1 - beta``, accurate for beta close to 1."""
    return jnp.exp(step * jnp.log1p(-one_minus_beta))
