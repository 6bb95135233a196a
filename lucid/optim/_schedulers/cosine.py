"""CosineAnnealingLR (recursive, as torch's step()) and CosineAnnealingWarmRestarts.

The cosine itself is ``lucid.functional.schedules.cosine``'s formula; the
recursive step below is torch's: ``lr_t - eta = (lr_{t-1} - eta) * bump(t) /
bump(t-1)`` with ``bump(t) = (1 + cos(pi t / T)) / 2``, and, where
``bump(t-1) = 0`` (``t = T + 1 mod 2T``), ``lr_t = lr_{t-1} + (base - eta)
(1 - cos(pi / T)) / 2``.
"""

from __future__ import annotations

import math
from typing import Any

from lucid.functional.schedules import cosine as formulas
from lucid.functional.schedules._ops import PYTHON

from .base import LRScheduler


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the base lr to ``eta_min`` over ``T_max`` steps, and back
    (torch's recursive form: the lr keeps oscillating with period ``2 T_max``)."""

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
    """Cosine annealing restarted after ``T_0``, ``T_0 * T_mult``, ... steps (SGDR)."""

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
        """torch's bookkeeping of ``T_cur`` (steps into the period) and ``T_i`` (its length);
        ``step(epoch)`` jumps there directly."""
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
