"""OneCycleLR (Smith & Topin, 2018) and its momentum curve.

The schedule is a list of phases, torch's `_schedule_phases`; phase `i`
ends at step `end_i` (the last phase at `total_steps - 1`) and anneals
from a start value to an end value over `pct = (t - end_{i-1}) / (end_i -
end_{i-1})`, with `end_{-1} = 0`:

* `cos`:    `end + (start - end) (1 + cos(pi pct)) / 2`
* `linear`: `(end - start) pct + start`

Two phases: `initial_lr -> max_lr` until `pct_start * total_steps - 1`,
then `max_lr -> min_lr`. `three_phase`: up, back down to `initial_lr`
at `2 pct_start total_steps - 2`, then down to `min_lr`.
`initial_lr = max_lr / div_factor` and `min_lr = initial_lr /
final_div_factor`. Momentum runs the other way, between `max_momentum`
and `base_momentum`. torch raises once stepped past `total_steps`; the
functional form keeps evaluating the last phase's formula there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar

__all__ = [
    "one_cycle_lr",
    "one_cycle_momentum",
]

# phase tables: (end_step key names), as torch stores them in _schedule_phases
_LR_KEYS = ("start_lr", "end_lr")
_MOMENTUM_KEYS = ("start_momentum", "end_momentum")


def total_steps_of(total_steps: Any, epochs: Any, steps_per_epoch: Any) -> int:
    """torch's resolution of the length and its `ValueError` wording."""
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
    """torch's `_schedule_phases` (group keys to read, and each phase's end step)."""
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
    """The value at `t` of phases `(end_step, start_value, end_value)`: the first
    phase with `t <= end_step` (or the last) anneals, as in torch's get_lr."""
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
    """torch's `OneCycleLR` as a function: warm up to `max_lr`, then anneal far below the start.

    With $\\eta_{init} = \\text{max\\_lr} / \\text{div\\_factor}$ and
    $\\eta_{min} = \\eta_{init} / \\text{final\\_div\\_factor}$, the lr goes
    $\\eta_{init} \\to \\text{max\\_lr} \\to \\eta_{min}$ (two phases) or
    $\\eta_{init} \\to \\text{max\\_lr} \\to \\eta_{init} \\to \\eta_{min}$
    (`three_phase`).

    With $T$ = `total_steps` and $p$ = `pct_start`, the curve moves through
    phases, each annealing from one value to the next: two phases (the
    default) end at steps $pT - 1$ and $T - 1$; with `three_phase`, three
    end at $pT - 1$, $2pT - 2$ and $T - 1$. With $f$ the fraction of the
    phase done, an anneal from $a$ to $z$ is $z + (a - z)(1 + \\cos \\pi f) / 2$
    (`"cos"`) or $a + (z - a) f$ (`"linear"`). Past `total_steps`, where
    torch's scheduler raises, the last phase's formula keeps being evaluated.

    torch's keywords, minus the optimizer and the momentum ones (see
    [one_cycle_momentum][lucid.functional.schedules.one_cycle_momentum]).

    Args:
      max_lr: the peak lr.
      total_steps: the number of steps in the cycle; `None` computes it as
        `epochs * steps_per_epoch`.
      epochs: with `steps_per_epoch`, the length of the cycle when
        `total_steps` is `None`.
      steps_per_epoch: the steps (batches) per epoch, with `epochs`.
      pct_start: the fraction $p$ of the cycle spent raising the lr, a float
        in $[0, 1]$.
      anneal_strategy: `"cos"` or `"linear"`, the shape of each anneal.
      div_factor: the starting lr is `max_lr / div_factor`.
      final_div_factor: the final lr is `max_lr / div_factor / final_div_factor`.
      three_phase: use three phases (above), the first two symmetric about
        step $pT - 1$; otherwise the second phase anneals straight to
        $\\eta_{min}$.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: neither `total_steps` nor both `epochs` and
        `steps_per_epoch`, or one of them not a positive int; `pct_start` not
        a float in $[0, 1]$; an unknown `anneal_strategy`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.one_cycle_lr(1.0, total_steps=6)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [0.04, 0.9944, 0.8117, 0.4626, 0.1335, 0.0]
    """
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
    """The momentum (or `beta1`) torch's `OneCycleLR` sets with `cycle_momentum=True`.

    It runs opposite to the lr: `max_momentum` $\\to$ `base_momentum` $\\to$
    `max_momentum` (two phases), or `max_momentum` $\\to$ `base_momentum`
    $\\to$ `max_momentum` $\\to$ `max_momentum` (`three_phase`), over the same
    phases as [one_cycle_lr][lucid.functional.schedules.one_cycle_lr].

    With $T$ = `total_steps` and $p$ = `pct_start`, the curve moves through
    phases, each annealing from one value to the next: two phases (the
    default) end at steps $pT - 1$ and $T - 1$; with `three_phase`, three
    end at $pT - 1$, $2pT - 2$ and $T - 1$. With $f$ the fraction of the
    phase done, an anneal from $a$ to $z$ is $z + (a - z)(1 + \\cos \\pi f) / 2$
    (`"cos"`) or $a + (z - a) f$ (`"linear"`). Past `total_steps`, where
    torch's scheduler raises, the last phase's formula keeps being evaluated.

    Args:
      total_steps: the number of steps in the cycle; `None` computes it as
        `epochs * steps_per_epoch`.
      epochs: with `steps_per_epoch`, the length of the cycle when
        `total_steps` is `None`.
      steps_per_epoch: the steps (batches) per epoch, with `epochs`.
      pct_start: the fraction $p$ of the cycle spent raising the lr, a float
        in $[0, 1]$.
      anneal_strategy: `"cos"` or `"linear"`, the shape of each anneal.
      base_momentum: the momentum where the lr peaks.
      max_momentum: the momentum at the start and the end of the cycle.
      three_phase: use three phases (above).

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> momentum`.

    Raises:
      ValueError: neither `total_steps` nor both `epochs` and
        `steps_per_epoch`, or one of them not a positive int; `pct_start` not
        a float in $[0, 1]$; an unknown `anneal_strategy`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.one_cycle_momentum(total_steps=6)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [0.95, 0.8506, 0.8688, 0.9037, 0.9367, 0.95]
    """
    total = total_steps_of(total_steps, epochs, steps_per_epoch)
    validate_one_cycle(pct_start, anneal_strategy)
    levels = {"max_momentum": max_momentum, "base_momentum": base_momentum}
    phases = _curve(_MOMENTUM_KEYS, levels, total, pct_start, three_phase)
    return from_formula(
        lambda t, ops: phase_value_at(t, phases, anneal_strategy, ops), "one_cycle_momentum"
    )
