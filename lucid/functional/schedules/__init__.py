"""torch.optim.lr_scheduler as step-indexed functions: `make(...)(count) -> lr`.

Each schedule's value at `count` is the lr torch's scheduler shows after
`count` calls of `step()` (`count = 0`: right after construction), so
it can be passed as `lr` to a functional optimizer, whose transforms
evaluate it at the number of updates done so far. Every schedule traces under
`jax.jit` with an integer array count, and an array of counts gives an array
of learning rates. The stateful classes of [lucid.optim.lr_scheduler][]
compute the same values from the same formulas, in Python floats.

Inside an optimizer's step a schedule computes in that step's compute dtype
(float32 for float32 and bfloat16 parameters, so a float32 step has no
float64 operation even with x64 enabled: Apple GPUs have no float64); called
on its own, in the default float dtype (float32, or float64 with x64
enabled). A callable you pass (`lambda_lr`'s `lr_lambda`, a custom
`scale_fn`) runs as you wrote it: `1.0 / (1 + t)` on the int32 count is
float64 under x64; write `1.0 / (1 + t.astype(jnp.float32))` to keep a
float32 step free of it.

The formulas are shared with `lucid.optim.lr_scheduler`: each schedule's math
is written once, evaluated here with jax arrays and there with Python floats.

Examples:
  >>> import jax.numpy as jnp, optax, lucid.functional as LF
  >>> schedule = LF.schedules.step_lr(0.1, step_size=1, gamma=0.5)
  >>> tx = LF.sgd(lr=schedule)  # the lr of update k is schedule(k)
  >>> params = jnp.ones(2)
  >>> state = tx.init(params)
  >>> for _ in range(3):
  ...     updates, state = tx.update(jnp.ones(2), state, params)
  ...     params = optax.apply_updates(params, updates)
  >>> [round(x, 4) for x in params.tolist()]  # 1 - 0.1 - 0.05 - 0.025
  [0.825, 0.825]
"""

from ._core import Schedule
from .composite import chained, sequential
from .cosine import cosine_annealing_lr, cosine_annealing_warm_restarts
from .cyclic import cyclic_lr, cyclic_momentum
from .decay import (
    constant_lr,
    exponential_lr,
    lambda_lr,
    linear_lr,
    multi_step_lr,
    multiplicative_lr,
    polynomial_lr,
    step_lr,
)
from .one_cycle import one_cycle_lr, one_cycle_momentum
from .plateau import Plateau, PlateauState, reduce_lr_on_plateau
from .warmup import noam

__all__ = [
    "Plateau",
    "PlateauState",
    "Schedule",
    "chained",
    "constant_lr",
    "cosine_annealing_lr",
    "cosine_annealing_warm_restarts",
    "cyclic_lr",
    "cyclic_momentum",
    "exponential_lr",
    "lambda_lr",
    "linear_lr",
    "multi_step_lr",
    "multiplicative_lr",
    "noam",
    "one_cycle_lr",
    "one_cycle_momentum",
    "polynomial_lr",
    "reduce_lr_on_plateau",
    "sequential",
    "step_lr",
]
