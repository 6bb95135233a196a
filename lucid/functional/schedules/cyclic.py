"""CyclicLR (Smith, 2017) and its momentum curve.

With cycle size `S = up + down`, `cycle = floor(1 + t / S)` and `x` the
fraction of the current cycle done, the triangle rises for `x <= up/S` and
falls after it:

```
h   = x / (up/S)                 if x <= up/S else (x - 1) / (up/S - 1)
lr  = base_lr + (max_lr - base_lr) * h * scale
mom = max_momentum - (max_momentum - base_momentum) * h * scale
```

`scale` is `scale_fn(cycle)` or `scale_fn(t)` by `scale_mode`; the
modes are `triangular` (1), `triangular2` (`1 / 2**(cycle - 1)`) and
`exp_range` (`gamma**t`, per iteration). As in torch, a built-in mode
fixes `scale_mode` (`cycle` for the triangles, `iterations` for
exp_range); `scale_mode` only matters with a custom `scale_fn`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar

__all__ = [
    "cyclic_lr",
    "cyclic_momentum",
]

MODES = ("triangular", "triangular2", "exp_range")


class CycleShape(NamedTuple):
    """The static description of a cycle, as torch stores it."""

    total_size: float
    step_ratio: float
    mode: str
    gamma: float
    scale_fn: Callable[[Any], Any] | None  # the custom one, or None
    scale_mode: str  # after the built-in modes have fixed it
    up: float | None = None  # step_size_up and _down, when known (not in torch's state)
    down: float | None = None


def cycle_shape(
    step_size_up: float,
    step_size_down: float | None,
    mode: str,
    gamma: float,
    scale_fn: Callable[[Any], Any] | None,
    scale_mode: str,
) -> CycleShape:
    """torch's derived quantities and its mode check (`ValueError` wording included)."""
    up = float(step_size_up)
    down = float(step_size_down) if step_size_down is not None else up
    total_size = up + down
    if mode not in MODES and scale_fn is None:
        raise ValueError("mode is invalid and scale_fn is None")
    effective = effective_scale_mode(mode, scale_fn, scale_mode)
    return CycleShape(total_size, up / total_size, mode, gamma, scale_fn, effective, up, down)


def effective_scale_mode(mode: str, scale_fn: Any, scale_mode: str) -> str:
    if scale_fn is not None:
        return scale_mode
    return "iterations" if mode == "exp_range" else "cycle"


def amplitude_scale(shape: CycleShape, argument: Any, ops: Any = PYTHON) -> Any:
    """`scale_fn(argument)`: the custom function or the mode's."""
    if shape.scale_fn is not None:
        return shape.scale_fn(ops.to_float(argument))
    if shape.mode == "triangular":
        return 1.0
    if shape.mode == "triangular2":
        return 1 / ops.int_power(2.0, argument - 1)
    return ops.int_power(shape.gamma, argument)


def cycle_height(t: Any, shape: CycleShape, ops: Any = PYTHON) -> tuple[Any, Any]:
    """`(h, scale)`: the triangle's height in [0, 1] and the amplitude scale at `t`."""
    cycle, height = ops.triangle(t, shape.total_size, shape.step_ratio, shape.up, shape.down)
    return height, amplitude_scale(shape, cycle if shape.scale_mode == "cycle" else t, ops)


def cyclic_lr_at(t: Any, base_lr: Any, max_lr: Any, shape: CycleShape, ops: Any = PYTHON) -> Scalar:
    height, scale = cycle_height(t, shape, ops)
    return base_lr + (max_lr - base_lr) * height * scale


def cyclic_momentum_at(
    t: Any, base_momentum: Any, max_momentum: Any, shape: CycleShape, ops: Any = PYTHON
) -> Scalar:
    height, scale = cycle_height(t, shape, ops)
    return max_momentum - (max_momentum - base_momentum) * height * scale


def cyclic_lr(
    base_lr: float,
    max_lr: float,
    step_size_up: int = 2000,
    step_size_down: int | None = None,
    mode: str = "triangular",
    gamma: float = 1.0,
    scale_fn: Callable[[Any], Any] | None = None,
    scale_mode: str = "cycle",
) -> Schedule:
    """torch's `CyclicLR` as a function: the lr cycling between `base_lr` and `max_lr`.

    $$
    \\eta(t) = \\text{base\\_lr} + (\\text{max\\_lr} - \\text{base\\_lr}) \\, h \\, \\sigma
    $$

    With $S$ = `step_size_up` + `step_size_down` steps per cycle,
    $c = \\lfloor 1 + t / S \\rfloor$ the cycle number, $x = 1 + t / S - c$
    the fraction of it done and $r$ = `step_size_up` $/ S$, the triangle's
    height is $h = x / r$ while rising ($x \\le r$) and $(x - 1) / (r - 1)$
    while falling, and the amplitude scale $\\sigma$ is the mode's: 1
    (`"triangular"`), $1 / 2^{c - 1}$ (`"triangular2"`), $\\gamma^t$
    (`"exp_range"`), or `scale_fn` of $c$ or $t$.
    torch's keywords, minus the optimizer and the momentum ones (see
    [cyclic_momentum][lucid.functional.schedules.cyclic_momentum]).

    Args:
      base_lr: the lower end of the cycle, and the lr at the start.
      max_lr: the upper end (reached only where $\\sigma = 1$).
      step_size_up: the number of steps in the rising half of a cycle.
      step_size_down: the number of steps in the falling half; `None` makes
        it `step_size_up`.
      mode: `"triangular"`, `"triangular2"` or `"exp_range"`, the amplitude
        scale $\\sigma$; ignored when `scale_fn` is given.
      gamma: $\\gamma$ of `"exp_range"`.
      scale_fn: a custom amplitude scale, a traceable function of one float
        array (the cycle number or the count) returning values in $[0, 1]$;
        it replaces `mode`.
      scale_mode: whether `scale_fn` is evaluated at the cycle number
        (`"cycle"`) or at the count (`"iterations"`); the built-in modes fix
        it.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: an unknown `mode` without a `scale_fn`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.cyclic_lr(0.1, 1.0, step_size_up=2)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(7)).tolist()]
      [0.1, 0.55, 1.0, 0.55, 0.1, 0.55, 1.0]
    """
    shape = cycle_shape(step_size_up, step_size_down, mode, gamma, scale_fn, scale_mode)
    return from_formula(lambda t, ops: cyclic_lr_at(t, base_lr, max_lr, shape, ops), "cyclic_lr")


def cyclic_momentum(
    base_momentum: float = 0.8,
    max_momentum: float = 0.9,
    step_size_up: int = 2000,
    step_size_down: int | None = None,
    mode: str = "triangular",
    gamma: float = 1.0,
    scale_fn: Callable[[Any], Any] | None = None,
    scale_mode: str = "cycle",
) -> Schedule:
    """The momentum (or `beta1`) torch's `CyclicLR` sets with `cycle_momentum=True`.

    $$
    m(t) = \\text{max\\_momentum}
           - (\\text{max\\_momentum} - \\text{base\\_momentum}) \\, h \\, \\sigma:
    $$

    it runs from `max_momentum` down to `base_momentum` as the lr rises, and
    back, with $h$ and $\\sigma$ as in
    [cyclic_lr][lucid.functional.schedules.cyclic_lr]. A hyper-parameter
    that takes schedules, such as `lucid.functional.sgd`'s `momentum`, takes it.

    With $S$ = `step_size_up` + `step_size_down` steps per cycle,
    $c = \\lfloor 1 + t / S \\rfloor$ the cycle number, $x = 1 + t / S - c$
    the fraction of it done and $r$ = `step_size_up` $/ S$, the triangle's
    height is $h = x / r$ while rising ($x \\le r$) and $(x - 1) / (r - 1)$
    while falling, and the amplitude scale $\\sigma$ is the mode's: 1
    (`"triangular"`), $1 / 2^{c - 1}$ (`"triangular2"`), $\\gamma^t$
    (`"exp_range"`), or `scale_fn` of $c$ or $t$.

    Args:
      base_momentum: the momentum where the lr peaks.
      max_momentum: the momentum at the start of a cycle.
      step_size_up: the number of steps in the rising half of a cycle.
      step_size_down: the number of steps in the falling half; `None` makes
        it `step_size_up`.
      mode: `"triangular"`, `"triangular2"` or `"exp_range"`, the amplitude
        scale $\\sigma$; ignored when `scale_fn` is given.
      gamma: $\\gamma$ of `"exp_range"`.
      scale_fn: a custom amplitude scale, a traceable function of one float
        array (the cycle number or the count) returning values in $[0, 1]$;
        it replaces `mode`.
      scale_mode: whether `scale_fn` is evaluated at the cycle number
        (`"cycle"`) or at the count (`"iterations"`); the built-in modes fix
        it.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> momentum`.

    Raises:
      ValueError: an unknown `mode` without a `scale_fn`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.cyclic_momentum(0.8, 0.9, step_size_up=2)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(7)).tolist()]
      [0.9, 0.85, 0.8, 0.85, 0.9, 0.85, 0.8]
    """
    shape = cycle_shape(step_size_up, step_size_down, mode, gamma, scale_fn, scale_mode)
    return from_formula(
        lambda t, ops: cyclic_momentum_at(t, base_momentum, max_momentum, shape, ops),
        "cyclic_momentum",
    )
