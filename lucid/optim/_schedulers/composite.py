"""SequentialLR and ChainedScheduler: torch's composition of schedulers on one optimizer."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from lucid.functional.schedules.composite import validate_sequential

from .base import LRScheduler, group_values
from .plateau import ReduceLROnPlateau


def _check_children(name: str, optimizer: Any, schedulers: Sequence[Any]) -> None:
    for index, scheduler in enumerate(schedulers):
        if not hasattr(scheduler, "optimizer"):
            raise TypeError(f"{name} at index {index} should have `optimizer` as its attribute.")
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(
                f"{name} does not support `ReduceLROnPlateau` scheduler as it requires "
                "additional kwargs to be specified when calling `step`, but got one at index "
                f"{index} in the given schedulers sequence."
            )
        if optimizer != scheduler.optimizer:
            raise ValueError(
                f"{name} expects all schedulers to belong to the same optimizer, but got "
                f"scheduler {type(scheduler).__name__} at index {index} has "
                f"{scheduler.optimizer}, which is different from {type(optimizer).__name__}."
            )


class _ChildrenState:
    """torch's state_dict of a composite: its own attributes plus each child's state_dict."""

    _schedulers: Sequence[Any]

    def state_dict(self) -> dict[str, Any]:
        """The composite's state, in torch's format.

        Returns:
          Its own attributes but the optimizer, and under `_schedulers` each
          child's `state_dict()`, in order.
        """
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved state: the composite's own, and each child's from its entry.

        Args:
          state_dict: a `state_dict()` of the same composite, with the same
            children (lucid's or torch's).
        """
        state = dict(state_dict)
        children = state.pop("_schedulers")
        self.__dict__.update(state)
        for scheduler, saved in zip(self._schedulers, children, strict=True):
            scheduler.load_state_dict(saved)


class SequentialLR(_ChildrenState, LRScheduler):
    """Run schedulers one after another, switching at milestones (torch's `SequentialLR`).

    `schedulers[0]` runs until step `milestones[0]`, `schedulers[1]` until
    `milestones[1]`, and so on: with $i$ the number of milestones $\\le t$,
    the lr after $t$ steps is that of `schedulers[i]`, restarted at the
    milestone. As torch does: construction resets every group's lr to
    `initial_lr`, takes back the children's construction steps and re-runs
    the first child's; at a milestone the next child restarts at its step 0
    (its closed form where it has one), then steps normally. A typical use is
    a warm-up followed by a decay.

    Args:
      optimizer: the optimizer every child schedules.
      schedulers: the schedulers to run in turn (at least one; all on
        `optimizer`; no [ReduceLROnPlateau][lucid.optim.lr_scheduler.ReduceLROnPlateau]).
      milestones: the steps at which the next scheduler takes over, one fewer
        than `schedulers`, increasing.
      last_epoch: the index of the last step taken (`-1`: start).

    Raises:
      TypeError: a child without an `optimizer` attribute.
      ValueError: no scheduler, a `ReduceLROnPlateau` child, a child on
        another optimizer, or not one milestone fewer than schedulers.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import ConstantLR, ExponentialLR, SequentialLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> warmup = ConstantLR(opt, factor=0.1, total_iters=2)
      >>> decay = ExponentialLR(opt, gamma=0.5)
      >>> sched = SequentialLR(opt, [warmup, decay], milestones=[2])
      >>> lrs = [round(sched.get_last_lr()[0], 4)]
      >>> for _ in range(5):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [0.1, 0.1, 1.0, 0.5, 0.25, 0.125]
    """

    def __init__(
        self,
        optimizer: Any,
        schedulers: list[Any],
        milestones: list[int],
        last_epoch: int = -1,
    ) -> None:
        name = type(self).__name__
        if len(schedulers) < 1:
            validate_sequential(len(schedulers), milestones, name)
        _check_children(name, optimizer, schedulers)
        validate_sequential(len(schedulers), milestones, name)
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self.recursive_undo()
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first.initial_step()
        self._last_lr = first.get_last_lr()

    def recursive_undo(self, sched: Any = None) -> None:
        """Take back one step from the `last_epoch` of `sched` and of every scheduler in it.

        Construction calls it, as torch's does, to undo the construction steps
        of the children.

        Args:
          sched: a scheduler, or a composite whose children (recursively) are
            undone; `None` for this scheduler.
        """
        target = self if sched is None else sched
        if hasattr(target, "_schedulers"):
            for child in target._schedulers:
                self.recursive_undo(child)
        elif hasattr(target, "last_epoch"):
            target.last_epoch -= 1

    def step(self) -> None:  # type: ignore[override]
        """Advance one step: the current child steps, or, at a milestone, the next child
        restarts at its step 0. It takes no `epoch`, as in torch.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.lr_scheduler import ConstantLR, SequentialLR, StepLR
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> first, then = ConstantLR(opt, factor=0.5), StepLR(opt, step_size=1)
          >>> sched = SequentialLR(opt, [first, then], milestones=[1])
          >>> opt.step()
          >>> sched.step()
          >>> sched.get_last_lr()
          [1.0]
        """
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler.update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_ChildrenState, LRScheduler):
    """Step several schedulers on one optimizer together (torch's `ChainedScheduler`).

    Each `step()` steps every scheduler in turn. The recursive ones (StepLR,
    ExponentialLR, ...) multiply the current lr by their own factors, so
    their effects multiply; a closed-form one (LambdaLR, CyclicLR, ...)
    overwrites what came before it. Construction takes no step: the children
    have taken theirs.

    Args:
      schedulers: the schedulers to chain (at least one; all on the same
        optimizer; no [ReduceLROnPlateau][lucid.optim.lr_scheduler.ReduceLROnPlateau]).
      optimizer: the optimizer they share; `None` takes the first
        scheduler's.

    Raises:
      TypeError: a child without an `optimizer` attribute.
      ValueError: no scheduler, a `ReduceLROnPlateau` child, or a child on
        another optimizer.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import ChainedScheduler, ConstantLR, ExponentialLR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> warmup = ConstantLR(opt, factor=0.1, total_iters=2)
      >>> sched = ChainedScheduler([warmup, ExponentialLR(opt, gamma=0.5)])
      >>> lrs = [round(sched.get_last_lr()[0], 4)]
      >>> for _ in range(4):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [0.1, 0.05, 0.25, 0.125, 0.0625]
    """

    def __init__(self, schedulers: Sequence[Any], optimizer: Any = None) -> None:
        name = type(self).__name__
        if len(schedulers) < 1:
            raise ValueError(
                f"{name} expects at least one scheduler to be chained, but got no scheduler."
            )
        optimizer = optimizer or schedulers[0].optimizer
        _check_children(name, optimizer, schedulers)
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = group_values(self._schedulers[-1].optimizer, "lr")

    def step(self) -> None:  # type: ignore[override]
        """Step every chained scheduler, in order. It takes no `epoch`, as in torch.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.lr_scheduler import ChainedScheduler, ExponentialLR, StepLR
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> chain = [ExponentialLR(opt, gamma=0.5), StepLR(opt, step_size=1, gamma=0.5)]
          >>> sched = ChainedScheduler(chain)
          >>> opt.step()
          >>> sched.step()
          >>> sched.get_last_lr()
          [0.25]
        """
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = group_values(self._schedulers[-1].optimizer, "lr")
