"""SequentialLR and ChainedScheduler as functions of the count.

* `sequential(schedules, milestones)`: after `count` steps, with `i` the
  number of milestones `<= count` (`bisect_right`), the lr is
  `schedules[i](count - milestones[i-1])`: torch's SequentialLR restarts the
  next scheduler at its epoch 0 at each milestone. (The exception torch makes:
  a MultiplicativeLR that is not first continues from the previous lr,
  multiplied by `lr_lambda(0)`; build that case with `chained` or a
  lambda instead.)
* `chained(base_lr, schedules)`: `base_lr * prod_k schedules[k](count) /
  base_lr`. torch's ChainedScheduler steps every child on the same
  optimizer, and the recursive forms (StepLR, MultiStepLR, ExponentialLR,
  MultiplicativeLR, ConstantLR, LinearLR, PolynomialLR, and
  CosineAnnealingLR with `eta_min=0` up to `T_max`) each multiply the
  current lr by their own factor, so the effects multiply. A closed-form
  child (LambdaLR, CyclicLR, OneCycleLR, warm restarts) overwrites the lr
  every step, and a cosine adds `(base - eta_min) (1 - cos(pi / T_max)) /
  2` at `T_max + 1` and divides around `eta_min`; torch's result then
  depends on the order and is not modelled by `chained`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from ._core import Schedule
from ._ops import ArrayOps, default_float_dtype

__all__ = [
    "chained",
    "sequential",
]


def validate_sequential(n_schedules: int, milestones: Sequence[int], name: str) -> None:
    """torch's SequentialLR checks on counts (wording included)."""
    if n_schedules < 1:
        raise ValueError(f"{name} expects at least one scheduler, but got no scheduler.")
    if len(milestones) != n_schedules - 1:
        raise ValueError(
            "Sequential Schedulers expects number of schedulers provided to be one more "
            f"than the number of milestone points, but got number of schedulers {n_schedules} "
            f"and the number of milestones to be equal to {len(milestones)}"
        )


def sequential(schedules: Sequence[Schedule], milestones: Sequence[int]) -> Schedule:
    """torch's `SequentialLR` as a function: schedules one after another, switching at milestones.

    With $i$ the number of milestones $\\le t$ and $m_0 = 0$,

    $$
    \\eta(t) = \\text{schedules}_i(t - m_i),
    $$

    $m_i$ being the milestone at which `schedules[i]` took over: each
    schedule restarts at its step 0, as torch's SequentialLR restarts the
    next scheduler. (The exception torch makes: a MultiplicativeLR that is
    not first continues from the previous lr; build that case with
    [chained][lucid.functional.schedules.chained] instead.)

    Args:
      schedules: the schedules, in order (at least one).
      milestones: the counts at which the next schedule takes over, one
        fewer than `schedules`, increasing.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: no schedule, or not one milestone fewer than schedules.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> warmup = LF.schedules.constant_lr(1.0, factor=0.1, total_iters=2)
      >>> decay = LF.schedules.exponential_lr(1.0, gamma=0.5)
      >>> schedule = LF.schedules.sequential([warmup, decay], milestones=[2])
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [0.1, 0.1, 1.0, 0.5, 0.25, 0.125]
    """
    schedules, milestones = list(schedules), [int(m) for m in milestones]
    validate_sequential(len(schedules), milestones, "sequential")

    def schedule(count: object) -> jax.Array:
        t = jnp.asarray(count)
        ops = ArrayOps(default_float_dtype())
        index = ops.count_reached(milestones, t) if milestones else jnp.zeros_like(t)
        lr = schedules[0](t)
        for i, (start, child) in enumerate(zip(milestones, schedules[1:], strict=True), start=1):
            lr = jnp.where(index == i, child(jnp.maximum(t - start, jnp.zeros_like(t))), lr)
        return lr

    schedule.__name__ = schedule.__qualname__ = "sequential"
    return schedule


def chained(base_lr: float, schedules: Sequence[Schedule]) -> Schedule:
    """torch's `ChainedScheduler` as a function: schedules whose factors multiply.

    $$
    \\eta(t) = b \\prod_k \\frac{\\text{schedules}_k(t)}{b},
    $$

    every schedule built from the same base lr $b$. This is what torch's
    ChainedScheduler produces when every child is a recursive one (StepLR,
    MultiStepLR, ExponentialLR, MultiplicativeLR, ConstantLR, LinearLR,
    PolynomialLR, and CosineAnnealingLR with `eta_min=0` up to `T_max`):
    each multiplies the current lr by its own factor. With a closed-form
    child (LambdaLR, CyclicLR, OneCycleLR, warm restarts) torch's result
    depends on the order and is not modelled here.

    Args:
      base_lr: the base lr $b$ every schedule was built from.
      schedules: the schedules to chain (at least one).

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: no schedule.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> warmup = LF.schedules.constant_lr(1.0, factor=0.1, total_iters=2)
      >>> decay = LF.schedules.exponential_lr(1.0, gamma=0.5)
      >>> schedule = LF.schedules.chained(1.0, [warmup, decay])
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [0.1, 0.05, 0.25, 0.125, 0.0625, 0.0312]
    """
    schedules = list(schedules)
    if not schedules:
        raise ValueError("chained expects at least one schedule to be chained, but got none.")

    def schedule(count: object) -> jax.Array:
        t = jnp.asarray(count)
        lr = schedules[0](t)
        for child in schedules[1:]:
            lr = lr * (child(t) / base_lr) if base_lr != 0 else lr * 0
        return lr

    schedule.__name__ = schedule.__qualname__ = "chained"
    return schedule
