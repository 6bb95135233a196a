"""OneCycleLR (Smith & Topin, 2018) and its momentum curve.

The schedule is a list of phases, torch's ``_schedule_phases``; phase ``i``
ends at step ``end_i`` (the last phase at ``total_steps - 1``) and anneals
from a start value to an end value over ``pct = (t - end_{i-1}) / (end_i -
end_{i-1})``, with ``end_{-1} = 0``:

* ``cos``:    ``end + (start - end) (1 + cos(pi pct)) / 2``
* ``linear``: ``(end - start) pct + start``

Two phases: ``initial_lr -> max_lr`` until ``pct_start * total_steps - 1``,
then ``max_lr -> min_lr``. ``three_phase``: up, back down to ``initial_lr``
at ``2 pct_start total_steps - 2``, then down to ``min_lr``.
``initial_lr = max_lr / div_factor`` and ``min_lr = initial_lr /
final_div_factor``. Momentum runs the other way, between ``max_momentum``
and ``base_momentum``. torch raises once stepped past ``total_steps``; the
functional form keeps evaluating the last phase's formula there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar

# phase tables: (end_step key names), as torch stores them in _schedule_phases
_LR_KEYS = ("start_lr", "end_lr")
_MOMENTUM_KEYS = ("start_momentum", "end_momentum")


def total_steps_of(total_steps: Any, epochs: Any, steps_per_epoch: Any) -> int:
    """torch's resolution of the length and its ``ValueError`` wording."""
    if total_steps is not None:
        if total_steps <= 0 or not isinstance(total_steps, int):
            raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
        return total_steps
    if epochs is not None and steps_per_epoch is not None:
        if not isinstance(epochs, int) or epochs <= 0:
            raise ValueError(f"Expected positive integer epochs, but got {epochs}")
        if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
            raise ValueError(
                f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}"
            )
        return epochs * steps_per_epoch
    raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")


def schedule_phases(total_steps: int, pct_start: float, three_phase: bool) -> list[dict]:
    """torch's ``_schedule_phases`` (group keys to read, and each phase's end step)."""
    up_end = float(pct_start * total_steps) - 1
    if three_phase:
        return [
            _phase(up_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
            _phase(
                float(2 * pct_start * total_steps) - 2,
                "max_lr",
                "initial_lr",
                "base_momentum",
                "max_momentum",
            ),
            _phase(total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
        ]
    return [
        _phase(up_end, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
        _phase(total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
    ]


def _phase(end_step: float, start_lr: str, end_lr: str, start_m: str, end_m: str) -> dict:
    return {
        "end_step": end_step,
        "start_lr": start_lr,
        "end_lr": end_lr,
        "start_momentum": start_m,
        "end_momentum": end_m,
    }


def validate_one_cycle(pct_start: Any, anneal_strategy: Any) -> None:
    if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
        raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
    if anneal_strategy not in ["cos", "linear"]:
        raise ValueError(
            f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}"
        )


def phase_value_at(
    t: Any, phases: Sequence[tuple[float, Any, Any]], strategy: str, ops: Any = PYTHON
) -> Scalar:
    """The value at ``t`` of phases ``(end_step, start_value, end_value)``: the first
    phase with ``t <= end_step`` (or the last) anneals, as in torch's get_lr."""
    values, start_step = [], 0.0
    for end_step, start_value, end_value in phases:
        values.append(ops.anneal(start_value, end_value, t, start_step, end_step, strategy))
        start_step = end_step
    value = values[-1]
    for (end_step, _, _), phase_value in zip(phases[-2::-1], values[-2::-1], strict=True):
        # t is an integer, so t <= end_step exactly when t <= floor(end_step)
        value = ops.where(t <= math.floor(end_step), phase_value, value)
    return value


def _curve(
    keys: tuple[str, str],
    values: dict[str, float],
    total_steps: int,
    pct_start: float,
    three_phase: bool,
) -> list[tuple[float, float, float]]:
    phases = schedule_phases(total_steps, pct_start, three_phase)
    return [(p["end_step"], values[p[keys[0]]], values[p[keys[1]]]) for p in phases]


def one_cycle_lr(
    max_lr: float,
    total_steps: int | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    pct_start: float = 0.3,
    anneal_strategy: str = "cos",
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
    three_phase: bool = False,
) -> Schedule:
    """``torch.optim.lr_scheduler.OneCycleLR``'s learning rate (torch's keywords,
    minus the optimizer and the momentum ones: see :func:`one_cycle_momentum`)."""
    total = total_steps_of(total_steps, epochs, steps_per_epoch)
    validate_one_cycle(pct_start, anneal_strategy)
    initial_lr = max_lr / div_factor
    levels = {"initial_lr": initial_lr, "max_lr": max_lr, "min_lr": initial_lr / final_div_factor}
    phases = _curve(_LR_KEYS, levels, total, pct_start, three_phase)
    return from_formula(
        lambda t, ops: phase_value_at(t, phases, anneal_strategy, ops), "one_cycle_lr"
    )


def one_cycle_momentum(
    total_steps: int | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    pct_start: float = 0.3,
    anneal_strategy: str = "cos",
    base_momentum: float = 0.85,
    max_momentum: float = 0.95,
    three_phase: bool = False,
) -> Schedule:
    """The momentum (or ``beta1``) OneCycleLR sets with ``cycle_momentum=True``."""
    total = total_steps_of(total_steps, epochs, steps_per_epoch)
    validate_one_cycle(pct_start, anneal_strategy)
    levels = {"max_momentum": max_momentum, "base_momentum": base_momentum}
    phases = _curve(_MOMENTUM_KEYS, levels, total, pct_start, three_phase)
    return from_formula(
        lambda t, ops: phase_value_at(t, phases, anneal_strategy, ops), "one_cycle_momentum"
    )
