"""Warm-up schedules: the Noam schedule (Vaswani et al., 2017); torch has no counterpart.

$$
lr(t) = f \\cdot d_{model}^{-1/2} \\min(k^{-1/2},\\; k \\cdot w^{-3/2}),
       \\qquad k = \\max(1, t)
$$

a linear warm-up over `w = warmup_steps` steps followed by inverse
square-root decay. The value is absolute: the optimizer's own lr is not a
factor, and every parameter group gets the same lr.
"""

from __future__ import annotations

from typing import Any

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar

__all__ = [
    "noam",
]


def validate_noam(d_model: Any, warmup_steps: Any) -> None:
    if isinstance(d_model, bool) or not d_model > 0:
        raise ValueError(f"Expected positive d_model, but got {d_model}")
    if isinstance(warmup_steps, bool) or not warmup_steps > 0:
        raise ValueError(f"Expected positive warmup_steps, but got {warmup_steps}")


def noam_at(
    t: Any, d_model: float, warmup_steps: float, factor: float, ops: Any = PYTHON
) -> Scalar:
    k = ops.to_float(ops.maximum(1, t))
    scale = factor * d_model**-0.5  # on the host, in double
    return scale * ops.minimum(ops.power(k, -0.5), k * warmup_steps**-1.5)


def noam(d_model: int, warmup_steps: int, factor: float = 1.0) -> Schedule:
    """The Transformer's schedule (Vaswani et al., 2017): linear warm-up, then $1/\\sqrt{t}$ decay.

    No torch counterpart ([NoamScheduler][lucid.optim.lr_scheduler.NoamScheduler]
    is the stateful form). With $k = \\max(1, t)$,

    $$
    \\eta(t) = f \\, d^{-1/2} \\min\\left(k^{-1/2},\\; k \\, w^{-3/2}\\right),
    $$

    peaking at $t = w$. The value is absolute: pass it as `lr` (the
    optimizer's lr is not a factor).

    Args:
      d_model: the model width $d$ (positive).
      warmup_steps: the length $w$ of the warm-up, in steps (positive).
      factor: a constant factor $f$ on the whole schedule.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: `d_model` or `warmup_steps` not positive.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.noam(d_model=16, warmup_steps=2)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(5)).tolist()]
      [0.0884, 0.0884, 0.1768, 0.1443, 0.125]
    """
    validate_noam(d_model, warmup_steps)
    return from_formula(lambda t, ops: noam_at(t, d_model, warmup_steps, factor, ops), "noam")
