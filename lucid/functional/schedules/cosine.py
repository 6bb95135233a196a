"""Cosine annealing: CosineAnnealingLR and CosineAnnealingWarmRestarts.

**CosineAnnealingLR.** torch's ``step()`` is recursive: with ``c_t =
cos(pi * t / T)`` it sets ``lr_t = eta + (lr_{t-1} - eta) * (1 + c_t) /
(1 + c_{t-1})``, except at ``t = T + 1 (mod 2T)``, where ``1 + c_{t-1} = 0``
and it adds ``(base - eta) * (1 - cos(pi / T)) / 2`` instead. The ratios
telescope, and the additive step lands on the same curve (``1 - cos(pi/T) =
1 + cos(pi (T+1) / T)``), so every value torch produces -- including past
``T_max``, where it keeps oscillating with period ``2 T_max`` (optax's
cosine decay clamps instead) -- is the closed form

$$
\\eta_t = \\eta_{min} + (b - \\eta_{min})\\,\\frac{1 + \\cos(\\pi t / T)}{2}.
$$

Evaluated with torch's own expression in float64 this reproduces torch's
recursion to ~1e-13 relative (also near the troughs, where both carry the
same rounding of ``1 + cos``); float32 uses the ``sin**2`` form of
`ArrayOps.cos_bump`.

**CosineAnnealingWarmRestarts.** ``lr = eta + (b - eta) (1 + cos(pi T_cur /
T_i)) / 2`` where ``T_i`` is the current period (``T_0 * T_mult**n`` in the
``n``-th restart) and ``T_cur`` the steps since the last restart.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar, default_float_dtype

__all__ = [
    "cosine_annealing_lr",
    "cosine_annealing_warm_restarts",
]


def cosine_annealing_lr_at(
    t: Any, base_lr: Any, T_max: Any, eta_min: float, ops: Any = PYTHON
) -> Scalar:
    return eta_min + (base_lr - eta_min) * ops.cos_bump(t, T_max)


def warm_restart_lr_at(
    T_cur: Any, T_i: Any, base_lr: Any, eta_min: float, ops: Any = PYTHON
) -> Scalar:
    return eta_min + (base_lr - eta_min) * ops.cos_bump(T_cur, T_i)


def validate_warm_restarts(T_0: Any, T_mult: Any, eta_min: Any) -> None:
    """torch's checks and wording for CosineAnnealingWarmRestarts."""
    if T_0 <= 0 or not isinstance(T_0, int):
        raise ValueError(f"Expected positive integer T_0, but got {T_0}")
    if T_mult < 1 or not isinstance(T_mult, int):
        raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
    if not isinstance(eta_min, (float, int)):
        raise ValueError(
            f"Expected float or int eta_min, but got {eta_min} of type {type(eta_min)}"
        )


def restart_position(t: jax.Array, T_0: int, T_mult: int) -> tuple[jax.Array, jax.Array]:
    """`(T_cur, T_i)` after `t` steps, as torch's step() leaves them.

    With `T_mult = m > 1` the `n`-th period starts at `T_0 (m**n - 1) /
    (m - 1)`; `n` is estimated with a logarithm and corrected by one either
    way with exact integer comparisons.
    """
    if T_mult == 1:
        return jnp.mod(t, jnp.asarray(T_0, t.dtype)), jnp.full_like(t, T_0)
    m = jnp.asarray(T_mult, t.dtype)  # the count's int dtype (int32 in a step), not int64

    def start(n: jax.Array) -> jax.Array:
        return T_0 * (jnp.power(m, n) - 1) // (m - 1)

    ratio = t.astype(default_float_dtype()) * (T_mult - 1) / T_0 + 1
    n = jnp.floor(jnp.log(ratio) / math.log(T_mult)).astype(t.dtype)
    n = jnp.where(t < start(n), n - 1, n)
    n = jnp.where(t >= start(n + 1), n + 1, n)
    return t - start(n), T_0 * jnp.power(m, n)


def cosine_annealing_lr(base_lr: float, T_max: int, eta_min: float = 0.0) -> Schedule:
    """torch's `CosineAnnealingLR` as a function: a cosine from `base_lr` down to `eta_min`.

    $$
    \\eta(t) = \\eta_{min} + (b - \\eta_{min}) \\, \\frac{1 + \\cos(\\pi t / T_{max})}{2}
    $$

    for every $t$: past `T_max` the lr rises back along the same cosine, with
    period `2 T_max`, as torch's recursive `step()` does (optax's cosine decay
    stays at its end value instead).

    Args:
      base_lr: the lr $b$ at the start.
      T_max: the number of steps $T_{max}$ of the descent (nonzero).
      eta_min: the lowest lr $\\eta_{min}$.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: `T_max` is 0.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.cosine_annealing_lr(1.0, T_max=4)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(9)).tolist()]
      [1.0, 0.8536, 0.5, 0.1464, 0.0, 0.1464, 0.5, 0.8536, 1.0]
    """
    if T_max == 0:
        raise ValueError("T_max must be nonzero (torch divides by it), got 0")
    return from_formula(
        lambda t, ops: cosine_annealing_lr_at(t, base_lr, T_max, eta_min, ops),
        "cosine_annealing_lr",
    )


def cosine_annealing_warm_restarts(
    base_lr: float, T_0: int, T_mult: int = 1, eta_min: float = 0.0
) -> Schedule:
    """torch's `CosineAnnealingWarmRestarts` as a function: cosine annealing with restarts (SGDR).

    $$
    \\eta(t) = \\eta_{min} + (b - \\eta_{min}) \\, \\frac{1 + \\cos(\\pi T_{cur} / T_i)}{2},
    $$

    where the periods are $T_0, T_0 T_{mult}, T_0 T_{mult}^2, \\dots$ steps,
    $T_i$ is the current one and $T_{cur}$ counts the steps since it began
    (the lr restarts at $b$ at each period's start).

    Args:
      base_lr: the lr $b$ at the start of every period.
      T_0: the length $T_0$ of the first period, in steps (a positive int).
      T_mult: the factor $T_{mult}$ by which each period is longer than the
        previous one (an int $\\ge 1$).
      eta_min: the lowest lr $\\eta_{min}$.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: `T_0` not a positive int, `T_mult` not an int $\\ge 1$, or
        `eta_min` not a number.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.cosine_annealing_warm_restarts(1.0, T_0=2, T_mult=2)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(8)).tolist()]
      [1.0, 0.5, 1.0, 0.8536, 0.5, 0.1464, 1.0, 0.9619]
    """
    validate_warm_restarts(T_0, T_mult, eta_min)

    def formula(t: jax.Array, ops: Any) -> Any:
        T_cur, T_i = restart_position(t, T_0, T_mult)
        return warm_restart_lr_at(T_cur, T_i, base_lr, eta_min, ops)

    return from_formula(formula, "cosine_annealing_warm_restarts")
