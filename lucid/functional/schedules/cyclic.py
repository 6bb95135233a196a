"""CyclicLR (Smith, 2017) and its momentum curve.

With cycle size ``S = up + down``, ``cycle = floor(1 + t / S)`` and ``x`` the
fraction of the current cycle done, the triangle rises for ``x <= up/S`` and
falls after it::

    h   = x / (up/S)                 if x <= up/S else (x - 1) / (up/S - 1)
    lr  = base_lr + (max_lr - base_lr) * h * scale
    mom = max_momentum - (max_momentum - base_momentum) * h * scale

``scale`` is ``scale_fn(cycle)`` or ``scale_fn(t)`` by ``scale_mode``; the
modes are ``triangular`` (1), ``triangular2`` (``1 / 2**(cycle - 1)``) and
``exp_range`` (``gamma**t``, per iteration). As in torch, a built-in mode
fixes ``scale_mode`` (``cycle`` for the triangles, ``iterations`` for
exp_range); ``scale_mode`` only matters with a custom ``scale_fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar

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
    """torch's derived quantities and its mode check (``ValueError`` wording included)."""
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
    """``scale_fn(argument)``: the custom function or the mode's."""
    if shape.scale_fn is not None:
        return shape.scale_fn(ops.to_float(argument))
    if shape.mode == "triangular":
        return 1.0
    if shape.mode == "triangular2":
        return 1 / ops.int_power(2.0, argument - 1)
    return ops.int_power(shape.gamma, argument)


def cycle_height(t: Any, shape: CycleShape, ops: Any = PYTHON) -> tuple[Any, Any]:
    """``(h, scale)``: the triangle's height in [0, 1] and the amplitude scale at ``t``."""
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
    """``torch.optim.lr_scheduler.CyclicLR``'s learning rate (torch's keywords,
    minus the optimizer and the momentum ones: see :func:`cyclic_momentum`).

    A custom ``scale_fn`` receives the cycle number or the count as a float
    array and must be traceable.
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
    """The momentum (or ``beta1``) CyclicLR sets with ``cycle_momentum=True``:
    it runs from ``max_momentum`` down to ``base_momentum`` as the lr rises."""
    shape = cycle_shape(step_size_up, step_size_down, mode, gamma, scale_fn, scale_mode)
    return from_formula(
        lambda t, ops: cyclic_momentum_at(t, base_momentum, max_momentum, shape, ops),
        "cyclic_momentum",
    )
