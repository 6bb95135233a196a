"""ReduceLROnPlateau: lower the lr when a metric stops improving.

The decision rule and the reduction are `lucid.functional.schedules.plateau`'s
`transition` and `reduced_lr` in Python floats; this class keeps torch's
attributes (`best`, `num_bad_epochs`, `cooldown_counter`, ...). Like
torch's, it takes no construction step and does not touch `initial_lr`.
"""

from __future__ import annotations

import warnings
from typing import Any

from lucid.functional.schedules import plateau as formulas

from .base import EPOCH_DEPRECATION_WARNING, LRScheduler, check_optimizer, group_values


class ReduceLROnPlateau(LRScheduler):
    """Reduce the lr when a metric has stopped improving (torch's `ReduceLROnPlateau`).

    `step(metric)` takes a metric (a validation loss, say) once per epoch.
    With $b$ the best metric so far (`best`) and $\\tau$ = `threshold`, a
    metric $a$ is an improvement when

    | `mode` | `threshold_mode="rel"` | `threshold_mode="abs"` |
    | --- | --- | --- |
    | `"min"` | $a < b \\, (1 - \\tau)$ | $a < b - \\tau$ |
    | `"max"` | $a > b \\, (1 + \\tau)$ | $a > b + \\tau$ |

    An improvement becomes `best` and resets the count of bad epochs; any
    other metric adds one. When the count exceeds `patience`, every group's
    lr becomes $\\max(\\eta \\cdot \\text{factor}, \\text{min\\_lr})$ (unless that
    changes it by `eps` or less), the count resets and a cooldown of
    `cooldown` epochs starts, during which bad epochs are not counted. Unlike
    the other schedulers, construction takes no step and leaves the lr and
    `initial_lr` as they are.

    Args:
      optimizer: the optimizer whose groups' `lr` it lowers.
      mode: `"min"`: lower the lr when the metric stops decreasing (a loss);
        `"max"`: when it stops increasing (an accuracy).
      factor: the factor the lr is multiplied by at a reduction, `< 1`.
      patience: the number of epochs without improvement tolerated; the lr is
        reduced at the next one (with `patience=2`, the third bad epoch in a
        row).
      threshold: how much better than `best` a metric must be to count as an
        improvement (relative or absolute, by `threshold_mode`).
      threshold_mode: `"rel"` (a relative margin) or `"abs"` (an absolute
        one), as in the table above.
      cooldown: the number of epochs after a reduction during which bad
        epochs are not counted.
      min_lr: the lowest lr a reduction may reach; one value, or a list with
        one per group.
      eps: the smallest change of lr made: a reduction smaller than `eps` is
        skipped.

    Attributes:
      best: the best metric so far (`inf` in `"min"` mode before the first).
      num_bad_epochs: the epochs without improvement since the last
        improvement or reduction.
      cooldown_counter: the cooldown epochs left.
      min_lrs: `min_lr`, one per group.
      default_min_lr: `min_lr` when one value was given (it extends to groups
        added later), else `None`.
      mode_worse: the worst value in `mode` (`best`'s starting value).
      last_epoch: the number of metrics seen (or the last `epoch` given).

    Raises:
      ValueError: `factor >= 1`, an unknown `mode` or `threshold_mode`, or a
        list of `min_lr` whose length is not the number of groups.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import ReduceLROnPlateau
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = ReduceLROnPlateau(opt, factor=0.5, patience=1)
      >>> lrs = []
      >>> for val_loss in [3.0, 2.0, 2.0, 2.0, 2.0, 1.0]:
      ...     opt.step()
      ...     sched.step(val_loss)
      ...     lrs.append(sched.get_last_lr()[0])
      >>> lrs, sched.best
      ([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], 1.0)
    """

    # the attributes' types (the API reference's Attributes table reads them)
    best: float
    num_bad_epochs: int
    cooldown_counter: int
    min_lrs: list[float]
    default_min_lr: float | None
    mode_worse: float
    last_epoch: int

    def __init__(
        self,
        optimizer: Any,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: list[float] | float = 0,
        eps: float = 1e-8,
    ) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        check_optimizer(optimizer, type(self).__name__)
        groups = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)) and len(min_lr) != groups:
            raise ValueError(f"expected {groups} min_lrs, got {len(min_lr)}")
        formulas.validate_modes(mode, threshold_mode)
        self.factor = factor
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * groups
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = group_values(optimizer, "lr")
        self._init_is_better(mode=mode, threshold=threshold, threshold_mode=threshold_mode)
        self._reset()

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        formulas.validate_modes(mode, threshold_mode)
        self.mode_worse = formulas.worst(mode)
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self) -> bool:
        """Whether a cooldown is running (bad epochs are then not counted)."""
        return self.cooldown_counter > 0

    def _is_better(self, a: float, best: float) -> bool:
        return formulas.is_better(a, best, self.mode, self.threshold_mode, self.threshold)

    def step(self, metrics: Any, epoch: int | None = None) -> None:  # type: ignore[override]
        """Record one epoch's metric, and reduce the lr if it has plateaued.

        Args:
          metrics: the metric, a number or a one-element array (`float()` is
            taken).
          epoch: deprecated in torch (it warns, as here): the epoch number to
            record instead of `last_epoch + 1`.

        Raises:
          RuntimeError: groups were added since construction and `min_lr` was
            a list (torch's message says how to fix `min_lrs`).

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> sched = lucid.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
          >>> sched.step(1.0)
          >>> sched.step(jnp.array(1.0))  # no improvement: reduced at once
          >>> sched.get_last_lr(), sched.num_bad_epochs
          ([0.1], 0)
        """
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        self.best, self.num_bad_epochs, self.cooldown_counter, reduce = formulas.transition(
            self.best,
            self.num_bad_epochs,
            self.cooldown_counter,
            current,
            mode=self.mode,
            threshold_mode=self.threshold_mode,
            threshold=self.threshold,
            patience=self.patience,
            cooldown=self.cooldown,
        )
        if reduce:
            self._reduce_lr(epoch)
        self._last_lr = group_values(self.optimizer, "lr")

    def _reduce_lr(self, epoch: int) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    "The number of param groups in the `optimizer` "
                    f"({len(groups)}) differs from when `ReduceLROnPlateau` was initialized "
                    f"({len(self.min_lrs)}), usually due to a new param group being added "
                    "to the optimizer. Please modify the `min_lrs` field to match the "
                    "length of the `optimizer` param groups."
                )
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs, strict=True):
            old_lr = float(group["lr"])
            new_lr = formulas.reduced_lr(old_lr, self.factor, min_lr, self.eps)
            if new_lr != old_lr:
                group["lr"] = new_lr

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved state (lucid's or torch's), the comparison rule included.

        Args:
          state_dict: a `state_dict()` of a ReduceLROnPlateau.
        """
        self.__dict__.update(state_dict)
        self._init_is_better(
            mode=self.mode, threshold=self.threshold, threshold_mode=self.threshold_mode
        )
