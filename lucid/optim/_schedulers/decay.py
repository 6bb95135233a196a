"""The multiplicative decays: StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR,
PolynomialLR, LambdaLR, MultiplicativeLR.

All but LambdaLR step *recursively*, as torch does: ``get_lr`` scales each
group's current lr by that step's factor, so schedulers on one optimizer
multiply and an lr edited between steps carries through. Their closed forms
(``step(epoch)``, and SequentialLR's restarts) are
``lucid.functional.schedules.decay``'s formulas evaluated in Python floats.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from lucid.functional.schedules import decay as formulas

from .base import LRScheduler


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` steps."""

    def __init__(
        self, optimizer: Any, step_size: int, gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        return [
            formulas.step_lr_at(self.last_epoch, base, self.step_size, self.gamma)
            for base in self.base_lrs
        ]


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each milestone (a repeated one: ``gamma**count``)."""

    def __init__(
        self, optimizer: Any, milestones: Iterable[int], gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        decay = self.gamma ** self.milestones[self.last_epoch]
        return [lr * decay for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        points = sorted(self.milestones.elements())
        return [
            formulas.multi_step_lr_at(self.last_epoch, base, points, self.gamma)
            for base in self.base_lrs
        ]


class ConstantLR(LRScheduler):
    """Multiply the lr by ``factor`` at construction and divide it out at ``total_iters``."""

    def __init__(
        self,
        optimizer: Any,
        factor: float = 1.0 / 3,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        formulas.validate_constant_lr(factor)
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._current_lrs()]
        if self.last_epoch != self.total_iters:
            return self._current_lrs()
        return [lr * (1.0 / self.factor) for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        return [
            formulas.constant_lr_at(self.last_epoch, base, self.factor, self.total_iters)
            for base in self.base_lrs
        ]


class LinearLR(LRScheduler):
    """Move the lr's factor linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` steps; each step multiplies by the ratio of consecutive factors."""

    def __init__(
        self,
        optimizer: Any,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        formulas.validate_linear_lr(start_factor, end_factor)
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        t = self.last_epoch
        if t == 0:
            return [lr * self.start_factor for lr in self._current_lrs()]
        if self._is_initial or t > self.total_iters:
            return self._current_lrs()
        rise = self.end_factor - self.start_factor
        ratio = 1.0 + rise / (self.total_iters * self.start_factor + (t - 1) * rise)
        return [lr * ratio for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        return [
            formulas.linear_lr_at(
                self.last_epoch, base, self.start_factor, self.end_factor, self.total_iters
            )
            for base in self.base_lrs
        ]


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every step."""

    def __init__(self, optimizer: Any, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        if self._is_initial:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        return [
            formulas.exponential_lr_at(self.last_epoch, base, self.gamma) for base in self.base_lrs
        ]


class PolynomialLR(LRScheduler):
    """Decay the lr as ``(1 - t / total_iters) ** power`` until ``total_iters``."""

    def __init__(
        self, optimizer: Any, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1
    ) -> None:
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        t, total = self.last_epoch, self.total_iters
        if self._is_initial or t > total:
            return self._current_lrs()
        ratio = ((1.0 - t / total) / (1.0 - (t - 1) / total)) ** self.power
        return [lr * ratio for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        return [
            formulas.polynomial_lr_at(self.last_epoch, base, self.total_iters, self.power)
            for base in self.base_lrs
        ]


def _lambdas(optimizer: Any, lr_lambda: Any) -> list[Callable[[int], float]]:
    groups = len(optimizer.param_groups)
    if not isinstance(lr_lambda, (list, tuple)):
        return [lr_lambda] * groups
    if len(lr_lambda) != groups:
        raise ValueError(f"Expected {groups} lr_lambdas, but got {len(lr_lambda)}")
    return list(lr_lambda)


class _LambdaStateMixin:
    """torch's state_dict for lambda schedulers: a plain function is saved as None,
    a callable object as its ``__dict__``; rebuild with the same functions, then load."""

    lr_lambdas: list[Callable[[int], float]]

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [
            None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
            for fn in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        saved = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for fn, attributes in zip(self.lr_lambdas, saved, strict=True):
            if attributes is not None:
                fn.__dict__.update(attributes)


class LambdaLR(_LambdaStateMixin, LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)`` (one lambda, or one per group)."""

    def __init__(self, optimizer: Any, lr_lambda: Any, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        return [
            base * fn(self.last_epoch)
            for fn, base in zip(self.lr_lambdas, self.base_lrs, strict=True)
        ]


class MultiplicativeLR(_LambdaStateMixin, LRScheduler):
    """Multiply the lr by ``lr_lambda(epoch)`` at every step after construction."""

    def __init__(self, optimizer: Any, lr_lambda: Any, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda)
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"lr_lambda should be a function, but got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        if self._is_initial:
            return self._current_lrs()
        return [
            lr * fn(self.last_epoch)
            for fn, lr in zip(self.lr_lambdas, self._current_lrs(), strict=True)
        ]
