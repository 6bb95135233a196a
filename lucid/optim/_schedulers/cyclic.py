"""CyclicLR and OneCycleLR: closed forms that also cycle momentum (or `betas[0]`).

The curves are `lucid.functional.schedules.cyclic` and `.one_cycle`'s
formulas in Python floats; this module holds torch's bookkeeping: what is
written into the groups at construction, validation order, and state_dict.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from lucid.functional.schedules import cyclic as cyclic_formulas
from lucid.functional.schedules import one_cycle as one_cycle_formulas

from .base import LRScheduler, check_optimizer, per_group, set_momentum, uses_beta1


class CyclicLR(LRScheduler):
    """Cycle the lr between `base_lr` and `max_lr`, momentum inversely (torch's `CyclicLR`).

    The cyclical learning rate policy (Smith, 2017), stepped once per batch.
    Each cycle has $S$ = `step_size_up` + `step_size_down` steps; with
    $c = \\lfloor 1 + t / S \\rfloor$ the cycle number and
    $x = 1 + t / S - c$ the fraction of it done after $t$ steps, the
    triangle's height is

    $$
    h = \\begin{cases} x / r & x \\le r \\\\ (x - 1) / (r - 1) & x > r \\end{cases}
    \\qquad r = \\text{step\\_size\\_up} / S,
    $$

    and the lr and momentum are

    $$
    \\begin{aligned}
    \\eta_t &= \\text{base\\_lr} + (\\text{max\\_lr} - \\text{base\\_lr})\\, h \\, \\sigma, \\\\
    m_t &= \\text{max\\_momentum}
           - (\\text{max\\_momentum} - \\text{base\\_momentum})\\, h \\, \\sigma,
    \\end{aligned}
    $$

    where the amplitude scale $\\sigma$ is the mode's: 1 (`"triangular"`),
    $1 / 2^{c - 1}$ (`"triangular2"`: halved every cycle), $\\gamma^t$
    (`"exp_range"`), or `scale_fn` of the cycle number or of $t$. A closed
    form: it overwrites the lr (and momentum) at every step. At construction
    each group's `lr` is set to `base_lr` and, with momentum cycling, its
    momentum to `max_momentum` (`betas[0]` for optimizers with `betas`).

    Args:
      optimizer: the optimizer whose groups' `lr` (and momentum) it writes.
      base_lr: the lower end of the cycle, and every group's lr at the start;
        one value, or a list with one per group.
      max_lr: the upper end of the cycle (reached only where the amplitude
        scale is 1); one value, or one per group.
      step_size_up: the number of steps in the rising half of a cycle.
      step_size_down: the number of steps in the falling half; `None` makes
        it `step_size_up`.
      mode: `"triangular"`, `"triangular2"` or `"exp_range"`, the amplitude
        scale above; ignored when `scale_fn` is given.
      gamma: $\\gamma$ of `"exp_range"`: the amplitude is scaled by
        $\\gamma^t$.
      scale_fn: a custom amplitude scale, a function of one float returning a
        value in $[0, 1]$; it replaces `mode`.
      scale_mode: whether `scale_fn` is evaluated at the cycle number
        (`"cycle"`) or at the step count (`"iterations"`); the built-in modes
        fix it (`"cycle"` for the triangles, `"iterations"` for
        `"exp_range"`).
      cycle_momentum: also cycle the momentum (or `betas[0]`), between
        `max_momentum` and `base_momentum`, inversely to the lr.
      base_momentum: the momentum where the lr peaks; one value, or one per
        group.
      max_momentum: the momentum at the start of a cycle, where the lr is
        lowest; one value, or one per group.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Attributes:
      max_lrs: `max_lr`, one per group.
      total_size: the steps in a cycle, $S$.
      step_ratio: the rising half's share of a cycle, $r$.
      use_beta1: whether the momentum cycled is `betas[0]` (else `momentum`).
      base_momentums: `base_momentum`, one per group.
      max_momentums: `max_momentum`, one per group.

    Raises:
      ValueError: an unknown `mode` without a `scale_fn`; a list whose length
        is not the number of groups; `cycle_momentum` for an optimizer with
        neither `momentum` nor `betas`.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import CyclicLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0, momentum=0.9)
      >>> sched = CyclicLR(opt, base_lr=0.1, max_lr=1.0, step_size_up=2)
      >>> lrs, momenta = [sched.get_last_lr()[0]], [opt.param_groups[0]["momentum"]]
      >>> for _ in range(4):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      ...     momenta.append(round(opt.param_groups[0]["momentum"], 4))
      >>> lrs, momenta
      ([0.1, 0.55, 1.0, 0.55, 0.1], [0.9, 0.85, 0.8, 0.85, 0.9])
    """

    # the attributes' types (the API reference's Attributes table reads them)
    max_lrs: list[float]
    total_size: float
    step_ratio: float
    use_beta1: bool
    base_momentums: list[float]
    max_momentums: list[float]

    def __init__(
        self,
        optimizer: Any,
        base_lr: float | list[float],
        max_lr: float | list[float],
        step_size_up: int = 2000,
        step_size_down: int | None = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_fn: Callable[[float], float] | None = None,
        scale_mode: str = "cycle",
        cycle_momentum: bool = True,
        base_momentum: float = 0.8,
        max_momentum: float = 0.9,
        last_epoch: int = -1,
    ) -> None:
        check_optimizer(optimizer, type(self).__name__)
        # every check first (torch's order), so a bad argument changes nothing
        base_lrs = per_group("base_lr", optimizer, base_lr)
        max_lrs = per_group("max_lr", optimizer, max_lr)
        shape = cyclic_formulas.cycle_shape(
            step_size_up, step_size_down, mode, gamma, scale_fn, scale_mode
        )
        if cycle_momentum:
            use_beta1 = uses_beta1(optimizer)
            base_momenta = per_group("base_momentum", optimizer, base_momentum)
            max_momenta = per_group("max_momentum", optimizer, max_momentum)

        self.optimizer = optimizer
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups, strict=True):
                group["lr"] = lr
        self.max_lrs = max_lrs
        self.total_size = shape.total_size
        self.step_ratio = shape.step_ratio
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = shape.scale_mode
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = use_beta1
            self.base_momentums = base_momenta
            self.max_momentums = max_momenta
            if last_epoch == -1:
                for top, bottom, group in zip(
                    max_momenta, base_momenta, optimizer.param_groups, strict=True
                ):
                    set_momentum(group, top, use_beta1)
                    group["max_momentum"] = top
                    group["base_momentum"] = bottom
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _shape(self) -> cyclic_formulas.CycleShape:
        return cyclic_formulas.CycleShape(
            self.total_size,
            self.step_ratio,
            self.mode,
            self.gamma,
            self._scale_fn_custom,
            self.scale_mode,
        )

    def _init_scale_fn(self) -> None:
        """After loading a state: the built-in modes fix ``scale_mode`` again."""
        self.scale_mode = cyclic_formulas.effective_scale_mode(
            self.mode, self._scale_fn_custom, self.scale_mode
        )

    def scale_fn(self, x: Any) -> float:
        """The amplitude scale $\\sigma$ at `x` (torch's `CyclicLR.scale_fn`).

        Args:
          x: the cycle number (`scale_mode="cycle"`) or the step count
            (`"iterations"`).

        Returns:
          The custom `scale_fn(x)`, or the mode's: 1 (`"triangular"`),
          `1 / 2 ** (x - 1)` (`"triangular2"`), `gamma ** x` (`"exp_range"`).
        """
        return cyclic_formulas.amplitude_scale(self._shape(), x)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        t, shape = self.last_epoch, self._shape()
        lrs = [
            cyclic_formulas.cyclic_lr_at(t, base, top, shape)
            for base, top in zip(self.base_lrs, self.max_lrs, strict=True)
        ]
        if self.cycle_momentum:
            momenta = [
                cyclic_formulas.cyclic_momentum_at(t, bottom, top, shape)
                for bottom, top in zip(self.base_momentums, self.max_momentums, strict=True)
            ]
            for group, momentum in zip(self.optimizer.param_groups, momenta, strict=True):
                set_momentum(group, momentum, self.use_beta1)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state, in torch's format.

        Returns:
          Every attribute but the optimizer; a custom `scale_fn` saved as
          torch saves it: `None` for a plain function, the `__dict__` of a
          callable object.
        """
        state = super().state_dict()
        fn = state.pop("_scale_fn_custom")
        is_object = fn is not None and not isinstance(fn, types.FunctionType)
        state["_scale_fn_custom"] = fn.__dict__.copy() if is_object else None
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved state (lucid's or torch's); construct the scheduler with the
        same `scale_fn` first.

        Args:
          state_dict: a `state_dict()` of a CyclicLR; a callable object's saved
            `__dict__` is restored into the `scale_fn` this scheduler holds.
        """
        state = dict(state_dict)
        saved_fn = state.pop("_scale_fn_custom", None)
        state.pop("_scale_fn_ref", None)
        super().load_state_dict(state)
        if saved_fn is not None:
            self._scale_fn_custom.__dict__.update(saved_fn)
        self._init_scale_fn()


class OneCycleLR(LRScheduler):
    """The 1cycle policy: warm up to `max_lr`, anneal far below the start (torch's `OneCycleLR`).

    Super-convergence's schedule (Smith & Topin, 2018), stepped once per
    batch, `total_steps` steps in all. With $T$ = `total_steps`,
    $p$ = `pct_start`, $\\eta_{init} = \\text{max\\_lr} / \\text{div\\_factor}$
    and $\\eta_{min} = \\eta_{init} / \\text{final\\_div\\_factor}$, the lr
    moves through phases, each annealing from one value to the next:

    * two phases (the default): $\\eta_{init} \\to \\text{max\\_lr}$ over steps
      $0$ to $pT - 1$, then $\\text{max\\_lr} \\to \\eta_{min}$ until step $T - 1$;
    * `three_phase`: $\\eta_{init} \\to \\text{max\\_lr}$ until $pT - 1$,
      $\\text{max\\_lr} \\to \\eta_{init}$ until $2pT - 2$, then
      $\\eta_{init} \\to \\eta_{min}$ until $T - 1$.

    With $f$ the fraction of the phase done, an anneal from $a$ to $z$ is
    $z + (a - z)(1 + \\cos \\pi f) / 2$ (`"cos"`) or $a + (z - a) f$
    (`"linear"`). Momentum (or `betas[0]`) runs the other way, from
    `max_momentum` down to `base_momentum` while the lr rises, and back. A
    closed form: it overwrites the lr at every step. At construction each
    group gets `initial_lr`, `max_lr` and `min_lr` entries (and
    `max_momentum`, `base_momentum`), as in torch.

    Args:
      optimizer: the optimizer whose groups' `lr` (and momentum) it writes.
      max_lr: the peak lr; one value, or a list with one per group.
      total_steps: the number of steps in the cycle; `None` computes it as
        `epochs * steps_per_epoch`.
      epochs: with `steps_per_epoch`, the length of the cycle when
        `total_steps` is `None`.
      steps_per_epoch: the steps (batches) per epoch, with `epochs`.
      pct_start: the fraction $p$ of the cycle spent raising the lr, a float
        in $[0, 1]$.
      anneal_strategy: `"cos"` or `"linear"`, the shape of each anneal.
      cycle_momentum: also cycle the momentum (or `betas[0]`) between
        `max_momentum` and `base_momentum`, inversely to the lr.
      base_momentum: the momentum where the lr peaks; one value, or one per
        group.
      max_momentum: the momentum at the start and the end of the cycle; one
        value, or one per group.
      div_factor: the starting lr is `max_lr / div_factor`.
      final_div_factor: the final lr is `initial_lr / final_div_factor`.
      three_phase: use a third phase (above), the first two symmetric about
        step $pT - 1$; otherwise the second phase anneals straight to
        $\\eta_{min}$.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Attributes:
      use_beta1: whether the momentum cycled is `betas[0]` (else `momentum`).

    Raises:
      ValueError: neither `total_steps` nor both `epochs` and
        `steps_per_epoch`, or one of them not a positive int; `pct_start` not a
        float in $[0, 1]$; an unknown `anneal_strategy`; a list whose length is
        not the number of groups; `cycle_momentum` for an optimizer with
        neither `momentum` nor `betas`; at `step()`, more than `total_steps`
        steps.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import OneCycleLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0, momentum=0.9)
      >>> sched = OneCycleLR(opt, max_lr=1.0, total_steps=6)
      >>> lrs = [round(sched.get_last_lr()[0], 4)]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [0.04, 0.9944, 0.8117, 0.4626, 0.1335, 0.0]
    """

    # the attributes' types (the API reference's Attributes table reads them)
    use_beta1: bool

    def __init__(
        self,
        optimizer: Any,
        max_lr: float | list[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | list[float] = 0.85,
        max_momentum: float | list[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        check_optimizer(optimizer, type(self).__name__)
        # every check first (torch's order), so a bad argument changes nothing
        total = one_cycle_formulas.total_steps_of(total_steps, epochs, steps_per_epoch)
        one_cycle_formulas.validate_one_cycle(pct_start, anneal_strategy)
        max_lrs = per_group("max_lr", optimizer, max_lr)
        if cycle_momentum:
            use_beta1 = uses_beta1(optimizer)
            max_momenta = per_group("max_momentum", optimizer, max_momentum)
            base_momenta = per_group("base_momentum", optimizer, base_momentum)

        self.optimizer = optimizer
        self.total_steps = total
        self._schedule_phases = one_cycle_formulas.schedule_phases(total, pct_start, three_phase)
        self._anneal_func_type = anneal_strategy
        if last_epoch == -1:
            for top, group in zip(max_lrs, optimizer.param_groups, strict=True):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = use_beta1
            if last_epoch == -1:
                for top, bottom, group in zip(
                    max_momenta, base_momenta, optimizer.param_groups, strict=True
                ):
                    set_momentum(group, top, use_beta1)
                    group["max_momentum"] = top
                    group["base_momentum"] = bottom
        super().__init__(optimizer, last_epoch)

    def _phases(self, group: dict, start_key: str, end_key: str) -> list[tuple[float, Any, Any]]:
        return [
            (phase["end_step"], group[phase[start_key]], group[phase[end_key]])
            for phase in self._schedule_phases
        ]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved state, lucid's or torch's (torch's older format included).

        torch's older checkpoints saved the annealing function itself
        (`anneal_func`) instead of its name. As in torch 2.13, such a
        checkpoint keeps the strategy this scheduler was constructed with:
        torch only falls back to the saved function when the scheduler has no
        strategy of its own.

        Args:
          state_dict: a `state_dict()` of a OneCycleLR.
        """
        state = dict(state_dict)
        state.pop("anneal_func", None)
        super().load_state_dict(state)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(
                f"Tried to step {t} times. The specified number of total steps is "
                f"{self.total_steps}"
            )
        strategy, lrs = self._anneal_func_type, []
        for group in self.optimizer.param_groups:
            lr_phases = self._phases(group, "start_lr", "end_lr")
            lrs.append(one_cycle_formulas.phase_value_at(t, lr_phases, strategy))
            if self.cycle_momentum:
                momentum_phases = self._phases(group, "start_momentum", "end_momentum")
                momentum = one_cycle_formulas.phase_value_at(t, momentum_phases, strategy)
                set_momentum(group, momentum, self.use_beta1)
        return lrs
