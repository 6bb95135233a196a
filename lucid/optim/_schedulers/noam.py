"""NoamScheduler: the Transformer schedule (no torch counterpart; see DESIGN.md)."""

from __future__ import annotations

from typing import Any

from lucid.functional.schedules import warmup as formulas

from .base import LRScheduler


class NoamScheduler(LRScheduler):
    """``lr = factor * d_model**-0.5 * min(k**-0.5, k * warmup_steps**-1.5)``,
    ``k = max(1, last_epoch)``, the same absolute value in every group (the
    optimizer's lr is not a factor)."""

    def __init__(
        self,
        optimizer: Any,
        d_model: int,
        warmup_steps: int,
        factor: float = 1.0,
        last_epoch: int = -1,
    ) -> None:
        formulas.validate_noam(d_model, warmup_steps)
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.factor = factor
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        self._warn_if_called_directly()
        lr = formulas.noam_at(self.last_epoch, self.d_model, self.warmup_steps, self.factor)
        return [lr] * len(self.optimizer.param_groups)

    def _get_closed_form_lr(self) -> list[Any]:
        return self.get_lr()
