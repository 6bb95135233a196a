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
    """``torch.lerp``: ``start + weight*(end-start)`` for weight < 0.5, else
    ``end - (end-start)*(1-weight)`` (torch's CPU kernel, exact at both ends)."""
    # One select of the base and a scalar coefficient, not both branches per element:
    # ``end + (-(1-w))*diff`` rounds exactly as ``end - diff*(1-w)``.
    diff = end - start
    low = weight < 0.5
    return jnp.where(low, start, end) + jnp.where(low, weight, -(1 - weight)) * diff


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
