"""ReduceLROnPlateau as a pure state machine.

After each metric, with `better` torch's comparison against the best value
so far (`rel`: `a < best * (1 - threshold)` in `min` mode, `a > best *
(1 + threshold)` in `max` mode; `abs`: `best -/+ threshold`):

1. `better`: `best = a` and the bad-epoch count resets, otherwise it grows;
2. during cooldown the counter counts down and bad epochs are ignored;
3. more than `patience` bad epochs: every lr becomes `max(lr * factor,
   min_lr)` -- unless that changes it by `eps` or less -- and cooldown starts.

The functional state carries the learning rate (`scale = lr / base_lr`)
because `min_lr` and `eps` are absolute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._ops import PYTHON, ArrayOps, default_float_dtype

__all__ = [
    "Plateau",
    "PlateauState",
    "reduce_lr_on_plateau",
]


def validate_plateau(factor: float, mode: str, threshold_mode: str) -> None:
    """torch's checks and wording (factor first, then the modes)."""
    if factor >= 1.0:
        raise ValueError("Factor should be < 1.0.")
    validate_modes(mode, threshold_mode)


def validate_modes(mode: str, threshold_mode: str) -> None:
    if mode not in {"min", "max"}:
        raise ValueError("mode " + mode + " is unknown!")
    if threshold_mode not in {"rel", "abs"}:
        raise ValueError("threshold mode " + threshold_mode + " is unknown!")


def worst(mode: str) -> float:
    """The starting `best`: the worst value in `mode`."""
    return float("inf") if mode == "min" else float("-inf")


def is_better(current: Any, best: Any, mode: str, threshold_mode: str, threshold: float) -> Any:
    if mode == "min" and threshold_mode == "rel":
        return current < best * (1.0 - threshold)
    if mode == "min":
        return current < best - threshold
    if threshold_mode == "rel":
        return current > best * (threshold + 1.0)
    return current > best + threshold


def transition(
    best: Any,
    num_bad_epochs: Any,
    cooldown_counter: Any,
    current: Any,
    *,
    mode: str,
    threshold_mode: str,
    threshold: float,
    patience: int,
    cooldown: int,
    ops: Any = PYTHON,
) -> tuple[Any, Any, Any, Any]:
    """One metric: `(best, num_bad_epochs, cooldown_counter, reduce)`."""
    better = is_better(current, best, mode, threshold_mode, threshold)
    best = ops.where(better, current, best)
    num_bad_epochs = ops.where(better, 0, num_bad_epochs + 1)
    in_cooldown = cooldown_counter > 0
    cooldown_counter = ops.where(in_cooldown, cooldown_counter - 1, cooldown_counter)
    num_bad_epochs = ops.where(in_cooldown, 0, num_bad_epochs)
    reduce = num_bad_epochs > patience
    cooldown_counter = ops.where(reduce, cooldown, cooldown_counter)
    num_bad_epochs = ops.where(reduce, 0, num_bad_epochs)
    return best, num_bad_epochs, cooldown_counter, reduce


def reduced_lr(lr: Any, factor: float, min_lr: Any, eps: float, ops: Any = PYTHON) -> Any:
    """`max(lr * factor, min_lr)`, or `lr` itself when that moves it by `eps` or less."""
    new_lr = ops.maximum(lr * factor, min_lr)
    return ops.where(lr - new_lr > eps, new_lr, lr)


class PlateauState(NamedTuple):
    """The state of a [Plateau][lucid.functional.schedules.Plateau] (all 0-d arrays but `lr`).

    Attributes:
      best: the best metric so far (the worst value of `mode` before any).
      num_bad_epochs: the metrics without improvement since the last
        improvement or reduction (int32).
      cooldown_counter: the cooldown epochs left (int32).
      last_epoch: the number of metrics seen (int32).
      lr: the current lr, one per group when `base_lr` is a vector.

    Examples:
      >>> import lucid.functional as LF
      >>> state = LF.schedules.reduce_lr_on_plateau(base_lr=0.1).init()
      >>> float(state.best), int(state.num_bad_epochs), round(float(state.lr), 4)
      (inf, 0, 0.1)
    """

    best: jax.Array  # best metric so far
    num_bad_epochs: jax.Array  # int32
    cooldown_counter: jax.Array  # int32
    last_epoch: jax.Array  # int32, metrics seen
    lr: jax.Array  # the current lr (one per group when base_lr is a vector)


class Plateau(NamedTuple):
    """ReduceLROnPlateau as three pure, jit-able functions.

    Made by [reduce_lr_on_plateau][lucid.functional.schedules.reduce_lr_on_plateau].

    Attributes:
      init: `init() -> state`, a
        [PlateauState][lucid.functional.schedules.PlateauState] before any
        metric.
      update: `update(state, metric) -> state`, recording one epoch's metric
        (a number or a 0-d array) and reducing the lr when it has plateaued.
      scale: `scale(state) -> lr / base_lr`, the factor to multiply an
        optimizer's updates (or its base lr) by.

    Examples:
      >>> import jax, lucid.functional as LF
      >>> plateau = LF.schedules.reduce_lr_on_plateau(patience=0)
      >>> update = jax.jit(plateau.update)
      >>> state = update(update(plateau.init(), 1.0), 1.0)  # no improvement
      >>> round(float(plateau.scale(state)), 4)
      0.1
    """

    init: Callable[[], PlateauState]
    update: Callable[[PlateauState, Any], PlateauState]
    scale: Callable[[PlateauState], jax.Array]


def reduce_lr_on_plateau(
    base_lr: Any = 1.0,
    mode: str = "min",
    factor: float = 0.1,
    patience: int = 10,
    threshold: float = 1e-4,
    threshold_mode: str = "rel",
    cooldown: int = 0,
    min_lr: Any = 0.0,
    eps: float = 1e-8,
) -> Plateau:
    """torch's `ReduceLROnPlateau` as a pure state machine: `init`, `update`, `scale`.

    With $b$ the best metric so far and $\\tau$ = `threshold`, a metric $a$
    is an improvement when $a < b(1 - \\tau)$ (`mode="min"`,
    `threshold_mode="rel"`), $a < b - \\tau$ (`"min"`, `"abs"`),
    $a > b(1 + \\tau)$ (`"max"`, `"rel"`) or $a > b + \\tau$ (`"max"`,
    `"abs"`). An improvement becomes the best and resets the count of bad
    epochs; any other metric adds one (none during a cooldown). When the
    count exceeds `patience`, the lr becomes
    $\\max(\\eta \\cdot \\text{factor}, \\text{min\\_lr})$ (unless that moves it
    by `eps` or less), the count resets and a cooldown of `cooldown` metrics
    starts. The state carries the lr itself, since `min_lr` and `eps` are
    absolute; `scale(state)` is `lr / base_lr`.

    Args:
      base_lr: the lr at the start; a vector gives one lr per parameter
        group. With the default 1.0, the state's `lr` is the scale itself.
      mode: `"min"` (the metric should decrease, a loss) or `"max"` (it
        should increase, an accuracy).
      factor: the factor the lr is multiplied by at a reduction, `< 1`.
      patience: the number of metrics without improvement tolerated; the lr
        is reduced at the next one.
      threshold: the margin $\\tau$ a metric must beat the best by.
      threshold_mode: `"rel"` (a relative margin) or `"abs"` (an absolute one).
      cooldown: the number of metrics after a reduction during which bad
        ones are not counted.
      min_lr: the lowest lr a reduction may reach; a vector gives one per
        group.
      eps: the smallest change of lr made: a smaller reduction is skipped.

    Returns:
      A [Plateau][lucid.functional.schedules.Plateau]: `init`, `update` and
      `scale`, all jit-able, in the default float dtype.

    Raises:
      ValueError: `factor >= 1`, or an unknown `mode` or `threshold_mode`.

    Examples:
      >>> import lucid.functional as LF
      >>> plateau = LF.schedules.reduce_lr_on_plateau(base_lr=1.0, factor=0.5, patience=1)
      >>> state, lrs = plateau.init(), []
      >>> for val_loss in [3.0, 2.0, 2.0, 2.0, 2.0, 1.0]:
      ...     state = plateau.update(state, val_loss)
      ...     lrs.append(float(state.lr))
      >>> lrs, float(state.best)
      ([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], 1.0)
    """
    validate_plateau(factor, mode, threshold_mode)
    rules = dict(
        mode=mode,
        threshold_mode=threshold_mode,
        threshold=threshold,
        patience=patience,
        cooldown=cooldown,
    )

    def init() -> PlateauState:
        dtype = default_float_dtype()
        zero = jnp.zeros((), jnp.int32)
        return PlateauState(
            best=jnp.asarray(worst(mode), dtype),
            num_bad_epochs=zero,
            cooldown_counter=zero,
            last_epoch=zero,
            lr=jnp.asarray(base_lr, dtype),
        )

    def update(state: PlateauState, metric: Any) -> PlateauState:
        ops = ArrayOps(state.lr.dtype)
        current = jnp.asarray(metric, state.best.dtype)
        best, bad, cooldown_counter, reduce = transition(
            state.best, state.num_bad_epochs, state.cooldown_counter, current, ops=ops, **rules
        )
        lowered = reduced_lr(state.lr, factor, jnp.asarray(min_lr, state.lr.dtype), eps, ops)
        return PlateauState(
            best=best,
            num_bad_epochs=bad.astype(jnp.int32),
            cooldown_counter=jnp.asarray(cooldown_counter).astype(jnp.int32),
            last_epoch=state.last_epoch + 1,
            lr=jnp.where(reduce, lowered, state.lr),
        )

    def scale(state: PlateauState) -> jax.Array:
        return state.lr / jnp.asarray(base_lr, state.lr.dtype)

    return Plateau(init, update, scale)
