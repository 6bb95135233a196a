"""NoamScheduler: the Transformer schedule (no torch counterpart)."""

from __future__ import annotations

from typing import Any

from lucid.functional.schedules import warmup as formulas

from .base import LRScheduler


class NoamScheduler(LRScheduler):
    """The Transformer's warm-up and inverse-square-root decay (Vaswani et al., 2017).

    No torch counterpart. After $t$ steps, with $k = \\max(1, t)$,
    $w$ = `warmup_steps`, $d$ = `d_model` and $f$ = `factor`,

    $$
    \\eta_t = f \\, d^{-1/2} \\min\\left(k^{-1/2},\\; k \\, w^{-3/2}\\right):
    $$

    a linear rise for `warmup_steps` steps, then a decay as $1/\\sqrt{k}$.
    The value is absolute: the optimizer's own lr is not a factor, and every
    group gets the same lr. The functional form is
    [noam][lucid.functional.schedules.noam].

    Args:
      optimizer: the optimizer whose groups' `lr` it writes.
      d_model: the model width $d$ (positive).
      warmup_steps: the length $w$ of the warm-up, in steps (positive).
      factor: a constant factor $f$ on the whole schedule.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Raises:
      ValueError: `d_model` or `warmup_steps` not positive.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import NoamScheduler
      >>> opt = lucid.optim.Adam([lucid.Parameter(jnp.zeros(1))])
      >>> sched = NoamScheduler(opt, d_model=16, warmup_steps=2)
      >>> lrs = [round(sched.get_last_lr()[0], 4)]
      >>> for _ in range(4):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs  # the peak, 16**-0.5 * 2**-0.5, at step 2
      [0.0884, 0.0884, 0.1768, 0.1443, 0.125]
    """

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
