"""CosineAnnealingLR (recursive, as torch's step()) and CosineAnnealingWarmRestarts.

The cosine itself is `lucid.functional.schedules.cosine`'s formula; the
recursive step below is torch's: `lr_t - eta = (lr_{t-1} - eta) * bump(t) /
bump(t-1)` with `bump(t) = (1 + cos(pi t / T)) / 2`, and, where
`bump(t-1) = 0` (`t = T + 1 mod 2T`), `lr_t = lr_{t-1} + (base - eta)
(1 - cos(pi / T)) / 2`.
"""

from __future__ import annotations

import math
from typing import Any

from lucid.functional.schedules import cosine as formulas
from lucid.functional.schedules._ops import PYTHON

from .base import LRScheduler


class CosineAnnealingLR(LRScheduler):
    """Anneal the lr along a cosine to `eta_min` over `T_max` steps (torch's `CosineAnnealingLR`).

    With $b$ a group's base lr, after $t$ steps

    $$
    \\eta_t = \\eta_{min} + (b - \\eta_{min}) \\, \\frac{1 + \\cos(\\pi t / T_{max})}{2},
    $$

    reached as torch's recursive `step()` does (each step scales the distance
    of the current lr to $\\eta_{min}$, so other schedulers' changes carry
    through). Past `T_max` the lr does not stay at `eta_min`: it rises back
    along the same cosine, with period `2 T_max`, as torch's does (the SGDR
    paper's restarts are
    [CosineAnnealingWarmRestarts][lucid.optim.lr_scheduler.CosineAnnealingWarmRestarts]).

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      T_max: the number of steps $T_{max}$ of the descent to `eta_min`.
      eta_min: the lowest lr $\\eta_{min}$.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import CosineAnnealingLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = CosineAnnealingLR(opt, T_max=4)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(8):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.8536, 0.5, 0.1464, 0.0, 0.1464, 0.5, 0.8536, 1.0]
    """

    def __init__(
        self, optimizer: Any, T_max: int, eta_min: float = 0.0, last_epoch: int = -1
    ) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        t, T, eta = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._current_lrs()
        if self._step_count == 1 and t > 0:
            return self._get_closed_form_lr()
        if (t - 1 - T) % (2 * T) == 0:
            rise = (1 - math.cos(math.pi / T)) / 2
            return [
                lr + (base - eta) * rise
                for base, lr in zip(self.base_lrs, self._current_lrs(), strict=True)
            ]
        ratio = PYTHON.cos_bump(t, T) / PYTHON.cos_bump(t - 1, T)
        return [ratio * (lr - eta) + eta for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[Any]:
        return [
            formulas.cosine_annealing_lr_at(self.last_epoch, base, self.T_max, self.eta_min)
            for base in self.base_lrs
        ]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing with warm restarts, SGDR (torch's `CosineAnnealingWarmRestarts`).

    With $b$ a group's base lr, the lr anneals along a cosine from $b$ to
    $\\eta_{min}$ over a period of $T_i$ steps, then restarts at $b$:

    $$
    \\eta = \\eta_{min} + (b - \\eta_{min}) \\, \\frac{1 + \\cos(\\pi T_{cur} / T_i)}{2},
    $$

    where $T_{cur}$ counts the steps since the last restart and the periods
    are $T_0, T_0 T_{mult}, T_0 T_{mult}^2, \\dots$ A closed form: it
    overwrites the lr at every step. Call `step()` once per batch with a
    fractional epoch (`step(epoch + i / iters)`) to anneal within epochs, as
    in torch.

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      T_0: the length $T_0$ of the first period, in steps (a positive int).
      T_mult: the factor $T_{mult}$ by which each period is longer than the
        previous one (an int $\\ge 1$).
      eta_min: the lowest lr $\\eta_{min}$.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Attributes:
      T_cur: the steps since the last restart, $T_{cur}$ (fractional after
        `step(epoch)` with a fractional epoch).
      T_i: the length $T_i$ of the current period.

    Raises:
      ValueError: `T_0` not a positive int, `T_mult` not an int $\\ge 1$, or
        `eta_min` not a number.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import CosineAnnealingWarmRestarts
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=2)
      >>> lrs = [sched.get_last_lr()[0]]
      >>> for _ in range(7):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.5, 1.0, 0.8536, 0.5, 0.1464, 1.0, 0.9619]
    """

    # the attributes' types (the API reference's Attributes table reads them)
    T_cur: float
    T_i: int

    def __init__(
        self,
        optimizer: Any,
        T_0: int,
        T_mult: int = 1,
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        formulas.validate_warm_restarts(T_0, T_mult, eta_min)
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        return [
            formulas.warm_restart_lr_at(self.T_cur, self.T_i, base, self.eta_min)
            for base in self.base_lrs
        ]

    def step(self, epoch: Any = None) -> None:
        """Advance one step, or jump to `epoch`, and write each group's lr.

        Keeps torch's bookkeeping of `T_cur` (the steps into the current
        period) and `T_i` (its length). Unlike the other schedulers',
        `step(epoch)` is not deprecated here and does not warn: it is how the
        schedule anneals within an epoch.

        Args:
          epoch: the (possibly fractional) epoch to jump to; `None` takes the
            next step.

        Raises:
          ValueError: a negative `epoch`.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.lr_scheduler import CosineAnnealingWarmRestarts
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> sched = CosineAnnealingWarmRestarts(opt, T_0=2)
          >>> opt.step()
          >>> sched.step(0.5)  # half an epoch in
          >>> sched.T_cur, round(sched.get_last_lr()[0], 4)
          (0.5, 0.8536)
        """
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    m = self.T_mult
                    n = int(math.log(epoch / self.T_0 * (m - 1) + 1, m))
                    self.T_cur = epoch - self.T_0 * (m**n - 1) / (m - 1)
                    self.T_i = self.T_0 * m**n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._get_lr_called_within_step = True
        try:
            values = self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        self._write_lrs(values)
