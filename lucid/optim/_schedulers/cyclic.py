"""CyclicLR and OneCycleLR: closed forms that also cycle momentum (or ``betas[0]``).

The curves are ``lucid.functional.schedules.cyclic`` and ``.one_cycle``'s
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
    """Cyclical learning rate between ``base_lr`` and ``max_lr`` (torch's modes,
    ``scale_fn``, ``scale_mode`` and momentum cycling)."""

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
        check_optimizer(optimizer)
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
        """The amplitude scale at cycle (or iteration) ``x``."""
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
        """torch's: a custom ``scale_fn`` is saved only as a callable object's ``__dict__``."""
        state = super().state_dict()
        fn = state.pop("_scale_fn_custom")
        is_object = fn is not None and not isinstance(fn, types.FunctionType)
        state["_scale_fn_custom"] = fn.__dict__.copy() if is_object else None
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        saved_fn = state.pop("_scale_fn_custom", None)
        state.pop("_scale_fn_ref", None)
        super().load_state_dict(state)
        if saved_fn is not None:
            self._scale_fn_custom.__dict__.update(saved_fn)
        self._init_scale_fn()


class OneCycleLR(LRScheduler):
    """The 1cycle policy: warm up to ``max_lr``, anneal far below the start
    (``cos`` or ``linear``; two phases, or three with ``three_phase``)."""

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
        check_optimizer(optimizer)
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
        """Also torch's older format, which saved the annealing function itself
        (``anneal_func``) instead of its name. As in torch 2.13, such a checkpoint
        keeps the strategy this scheduler was constructed with: torch only falls back
        to the saved function when the scheduler has no strategy of its own."""
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
