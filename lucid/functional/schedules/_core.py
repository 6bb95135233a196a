"""What a functional schedule is: ``count -> lr``, built from a formula ``(t, ops) -> lr``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from ._ops import ArrayOps, default_float_dtype


class Schedule(Protocol):
    """A learning-rate schedule: `schedule(count) -> lr`, any callable of that shape.

    `count` is the number of scheduler steps taken, a Python int or an integer
    array (traced or not); the result is a `jax.Array` of the count's shape: the
    lr (or momentum) after `count` steps, as torch's scheduler shows it. Pass one
    as `lr` (or another hyper-parameter that takes schedules) to a functional
    optimizer, which evaluates it at the number of updates done so far.

    Examples:
      >>> import lucid.functional.schedules as S
      >>> schedule: S.Schedule = S.step_lr(0.1, step_size=2)
      >>> [round(float(schedule(t)), 4) for t in range(5)]
      [0.1, 0.1, 0.01, 0.01, 0.001]
    """

    def __call__(self, count: Any) -> jax.Array:
        """The value after `count` steps.

        Args:
          count: the number of scheduler steps taken (an int or integer array).

        Returns:
          The lr, a `jax.Array` of `count`'s shape.
        """
        ...


Formula = Callable[[jax.Array, ArrayOps], Any]


def from_formula(formula: Formula, name: str) -> Schedule:
    """The schedule `count -> formula(count, ArrayOps(dtype))`.

    `count` is the number of scheduler steps taken (a Python int or an
    integer array, traced or not). The result is a 0-d array (or the count's
    shape) in the compute dtype of the step evaluating it (float32 for a
    float32 or bfloat16 parameter, so a float32 step holds no float64 value
    even with x64 enabled); called directly, in the default float dtype,
    float64 when x64 is enabled and float32 otherwise. The dtype is decided
    when the schedule is traced. An array of counts gives an array of
    learning rates.
    """

    def schedule(count: Any) -> jax.Array:
        ops = ArrayOps(default_float_dtype())
        count = jnp.asarray(count)
        lr = jnp.asarray(formula(count, ops), ops.dtype)
        return jnp.broadcast_to(lr, count.shape)

    schedule.__name__ = schedule.__qualname__ = name
    return schedule
