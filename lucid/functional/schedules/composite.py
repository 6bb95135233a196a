"""SequentialLR and ChainedScheduler as functions of the count.

* ``sequential(schedules, milestones)``: after ``count`` steps, with ``i`` the
  number of milestones ``<= count`` (``bisect_right``), the lr is
  ``schedules[i](count - milestones[i-1])``: torch's SequentialLR restarts the
  next scheduler at its epoch 0 at each milestone. (The exception torch makes:
  a MultiplicativeLR that is not first continues from the previous lr,
  multiplied by ``lr_lambda(0)``; build that case with ``chained`` or a
  lambda instead.)
* ``chained(base_lr, schedules)``: ``base_lr * prod_k schedules[k](count) /
  base_lr``. torch's ChainedScheduler steps every child on the same
  optimizer, and the recursive forms (StepLR, MultiStepLR, ExponentialLR,
  MultiplicativeLR, ConstantLR, LinearLR, PolynomialLR, and
  CosineAnnealingLR with ``eta_min=0`` up to ``T_max``) each multiply the
  current lr by their own factor, so the effects multiply. A closed-form
  child (LambdaLR, CyclicLR, OneCycleLR, warm restarts) overwrites the lr
  every step, and a cosine adds ``(base - eta_min) (1 - cos(pi / T_max)) /
  2`` at ``T_max + 1`` and divides around ``eta_min``; torch's result then
  depends on the order and is not modelled by ``chained``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from ._core import Schedule
from ._ops import ArrayOps, default_float_dtype


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
    """``schedules[i](count - milestones[i-1])`` between milestones ``i-1`` and ``i``."""
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
    """``base_lr * prod_k (schedules[k](count) / base_lr)``; every schedule built
    from the same ``base_lr``."""
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
