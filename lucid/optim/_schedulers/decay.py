"""The multiplicative decays: StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR,
PolynomialLR, LambdaLR, MultiplicativeLR.

All but LambdaLR step *recursively*, as torch does: `get_lr` scales each
group's current lr by that step's factor, so schedulers on one optimizer
multiply and an lr edited between steps carries through. Their closed forms
(`step(epoch)`, and SequentialLR's restarts) are
`lucid.functional.schedules.decay`'s formulas evaluated in Python floats.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from lucid.functional.schedules import decay as formulas

from .base import LRScheduler, param_groups_of


class StepLR(LRScheduler):
    """Decay the lr by `gamma` every `step_size` steps (torch's `StepLR`).

    With $b$ a group's base lr (`initial_lr`), after $t$ steps

    $$
    \\eta_t = b \\, \\gamma^{\\lfloor t / \\text{step\\_size} \\rfloor},
    $$

    reached as torch does: at every multiple of `step_size` the group's
    current lr is multiplied by $\\gamma$ (so other schedulers' changes carry
    through).

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      step_size: the period of the decay $s$, in steps.
      gamma: the factor $\\gamma$ the lr is multiplied by every `step_size` steps.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import StepLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = StepLR(opt, step_size=2, gamma=0.5)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    """

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
    """Decay the lr by `gamma` at each milestone (torch's `MultiStepLR`).

    With $b$ a group's base lr, after $t$ steps

    $$
    \\eta_t = b \\, \\gamma^{\\#\\{m \\in \\text{milestones} : m \\le t\\}},
    $$

    a milestone listed twice counting twice; reached as torch does, by
    multiplying the current lr by $\\gamma^{c}$ at a step listed $c$ times.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      milestones: the steps at which the lr decays (any order; repeats
        decay that many times).
      gamma: the factor $\\gamma$ of each decay.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Attributes:
      milestones: a `collections.Counter` of the milestones (torch's).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import MultiStepLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = MultiStepLR(opt, milestones=[2, 4, 4], gamma=0.5)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 1.0, 0.5, 0.5, 0.125, 0.125]
    """

    # the attributes' types (the API reference's Attributes table reads them)
    milestones: Counter[int]

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
    """Scale the lr by a constant `factor` for the first `total_iters` steps (torch's `ConstantLR`).

    With $b$ a group's base lr, after $t$ steps

    $$
    \\eta_t = \\begin{cases} b \\cdot \\text{factor} & t < \\text{total\\_iters} \\\\
    b & t \\ge \\text{total\\_iters} \\end{cases}
    $$

    reached as torch does: the lr is multiplied by `factor` at construction
    and divided by it at step `total_iters`. A warm-up, typically chained
    with another scheduler.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      factor: the constant factor, in $[0, 1]$.
      total_iters: the number of steps the factor lasts.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Raises:
      ValueError: `factor` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import ConstantLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = ConstantLR(opt, factor=0.5, total_iters=3)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]
    """

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
    """Move the lr's factor linearly from `start_factor` to `end_factor` (torch's `LinearLR`).

    With $b$ a group's base lr, $s$ = `start_factor`, $e$ = `end_factor` and
    $T$ = `total_iters`, after $t$ steps

    $$
    \\eta_t = b \\left(s + (e - s) \\frac{\\min(t, T)}{T}\\right),
    $$

    reached as torch does: each step multiplies the current lr by the ratio
    of consecutive factors. A linear warm-up with the defaults.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      start_factor: the factor $s$ at step 0, in $(0, 1]$.
      end_factor: the factor $e$ from step `total_iters` on, in $[0, 1]$.
      total_iters: the number of steps $T$ the factor takes to reach $e$.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Raises:
      ValueError: `start_factor` outside $(0, 1]$ or `end_factor` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import LinearLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = LinearLR(opt, start_factor=0.25, total_iters=3)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    """

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
    """Decay the lr by `gamma` every step (torch's `ExponentialLR`).

    With $b$ a group's base lr, after $t$ steps $\\eta_t = b \\, \\gamma^t$,
    reached by multiplying the current lr by $\\gamma$ at every step.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      gamma: the factor $\\gamma$ of each step's decay.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import ExponentialLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = ExponentialLR(opt, gamma=0.5)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.5, 0.25, 0.125, 0.0625, 0.0312]
    """

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
    """Decay the lr polynomially to zero over `total_iters` steps (torch's `PolynomialLR`).

    With $b$ a group's base lr, $T$ = `total_iters` and $p$ = `power`, after
    $t$ steps

    $$
    \\eta_t = b \\left(1 - \\frac{\\min(t, T)}{T}\\right)^{p},
    $$

    reached as torch does, by multiplying the current lr by the ratio of
    consecutive factors; the lr stays 0 after step $T$.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      total_iters: the number of steps $T$ the decay takes.
      power: the power $p$ of the polynomial (1: linear decay).
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import PolynomialLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = PolynomialLR(opt, total_iters=4, power=2.0)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.5625, 0.25, 0.0625, 0.0, 0.0]
    """

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


def _lambdas(optimizer: Any, lr_lambda: Any, scheduler: str) -> list[Callable[[int], float]]:
    groups = len(param_groups_of(optimizer, scheduler))
    if not isinstance(lr_lambda, (list, tuple)):
        return [lr_lambda] * groups
    if len(lr_lambda) != groups:
        raise ValueError(f"Expected {groups} lr_lambdas, but got {len(lr_lambda)}")
    return list(lr_lambda)


class _LambdaStateMixin:
    """torch's state_dict for lambda schedulers: a plain function is saved as None,
    a callable object as its `__dict__`; rebuild with the same functions, then load."""

    lr_lambdas: list[Callable[[int], float]]

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state, in torch's format.

        Returns:
          Every attribute but the optimizer; `lr_lambdas` as torch saves them:
          `None` for a plain function (or lambda), the `__dict__` of a callable
          object.
        """
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [
            None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
            for fn in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved state; construct the scheduler with the same functions first.

        Args:
          state_dict: a `state_dict()` of the same class (lucid's or torch's); a
            callable object's saved `__dict__` is restored into the function
            the scheduler holds.
        """
        state = dict(state_dict)
        saved = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for fn, attributes in zip(self.lr_lambdas, saved, strict=True):
            if attributes is not None:
                fn.__dict__.update(attributes)


class LambdaLR(_LambdaStateMixin, LRScheduler):
    """Set the lr to the base lr times a function of the step (torch's `LambdaLR`).

    With $b$ a group's base lr and $\\lambda$ its function, after $t$ steps
    $\\eta_t = b \\, \\lambda(t)$ (a closed form: it overwrites the lr).

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      lr_lambda: $\\lambda$, a function of the step count `t` (an int) that
        returns a factor; or a list of such functions, one per parameter
        group.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Attributes:
      lr_lambdas: the functions, one per group.

    Raises:
      ValueError: a list of `lr_lambda` whose length is not the number of groups.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import LambdaLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = LambdaLR(opt, lambda t: 1 / (t + 1))
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.5, 0.3333, 0.25, 0.2, 0.1667]
    """

    def __init__(self, optimizer: Any, lr_lambda: Any, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda, type(self).__name__)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        return [
            base * fn(self.last_epoch)
            for fn, base in zip(self.lr_lambdas, self.base_lrs, strict=True)
        ]


class MultiplicativeLR(_LambdaStateMixin, LRScheduler):
    """Multiply the lr by a function of the step at every step (torch's `MultiplicativeLR`).

    With $b$ a group's base lr and $\\lambda$ its function, after $t$ steps
    $\\eta_t = \\eta_{t-1} \\, \\lambda(t)$ for $t \\ge 1$ and $\\eta_0 = b$, so
    $\\eta_t = b \\prod_{i=1}^{t} \\lambda(i)$ when nothing else changes the lr.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      lr_lambda: $\\lambda$, a function of the step count `t` (an int) that
        returns the step's factor; or a list of such functions, one per
        parameter group.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Attributes:
      lr_lambdas: the functions, one per group.

    Raises:
      TypeError: an `lr_lambda` is not callable.
      ValueError: a list of `lr_lambda` whose length is not the number of groups.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import MultiplicativeLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = MultiplicativeLR(opt, lambda t: 0.5)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.5, 0.25, 0.125, 0.0625, 0.0312]
    """

    def __init__(self, optimizer: Any, lr_lambda: Any, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda, type(self).__name__)
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
