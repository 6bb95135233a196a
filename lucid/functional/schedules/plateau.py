"""ReduceLROnPlateau as a pure state machine.

After each metric, with ``better`` torch's comparison against the best value
so far (``rel``: ``a < best * (1 - threshold)`` in ``min`` mode, ``a > best *
(1 + threshold)`` in ``max`` mode; ``abs``: ``best -/+ threshold``):

1. ``better``: ``best = a`` and the bad-epoch count resets, otherwise it grows;
2. during cooldown the counter counts down and bad epochs are ignored;
3. more than ``patience`` bad epochs: every lr becomes ``max(lr * factor,
   min_lr)`` -- unless that changes it by ``eps`` or less -- and cooldown starts.

The functional state carries the learning rate (``scale = lr / base_lr``)
because ``min_lr`` and ``eps`` are absolute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._ops import PYTHON, ArrayOps, default_float_dtype


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
    """The starting ``best``: the worst value in ``mode``."""
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
    """One metric: ``(best, num_bad_epochs, cooldown_counter, reduce)``."""
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
    """``max(lr * factor, min_lr)``, or ``lr`` itself when that moves it by ``eps`` or less."""
    new_lr = ops.maximum(lr * factor, min_lr)
    return ops.where(lr - new_lr > eps, new_lr, lr)


class PlateauState(NamedTuple):
    best: jax.Array  # best metric so far
    num_bad_epochs: jax.Array  # int32
    cooldown_counter: jax.Array  # int32
    last_epoch: jax.Array  # int32, metrics seen
    lr: jax.Array  # the current lr (one per group when base_lr is a vector)


class Plateau(NamedTuple):
    """``init() -> state``, ``update(state, metric) -> state``, ``scale(state) -> lr / base_lr``."""

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
    """``torch.optim.lr_scheduler.ReduceLROnPlateau`` as ``init``/``update``/``scale``.

    ``base_lr`` and ``min_lr`` may be vectors (one entry per parameter group).
    With the default ``base_lr=1.0`` the state's ``lr`` is the scale itself.
    Everything is jit-able; the dtype is the default float dtype.
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
