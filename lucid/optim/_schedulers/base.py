"""LRScheduler: torch's scheduler bookkeeping over any object with `param_groups`.

A scheduler works on any optimizer-like object whose `param_groups` is a
list of dicts holding `'lr'` (and `'momentum'` or `'betas'` for the
cycling schedulers). Learning rates are Python floats, computed as torch
computes them, so sequences agree with torch's to rounding.

torch's protocol, kept here attribute for attribute (so `state_dict()`
has torch's keys and checkpoints move both ways):

* construction with `last_epoch=-1` writes `initial_lr` into every group
  with `setdefault` (a second scheduler keeps the first one's) and records
  `base_lrs` from it; with `last_epoch >= 0` every group must already
  hold `initial_lr` (`KeyError` otherwise);
* construction takes one step (`last_epoch` -1 -> 0) in *initial mode*,
  in which most recursive schedules leave the lr as it is;
* `step()` increments `last_epoch` and writes `get_lr()` into the
  groups; `step(epoch)` (deprecated in torch, warns) sets `last_epoch`
  and uses the closed form where the class has one;
* `get_last_lr()` returns the lrs the last step wrote.

The first `step()` after construction warns, with torch's text, when the
optimizer has not stepped yet (lucid's optimizers record their steps as torch's
wrapped `step` does).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being "
    "deprecated where possible. Please use `scheduler.step()` to step the "
    "scheduler. During the deprecation, if epoch is different from None, the "
    "closed form is used instead of the new chainable form, where available. "
    "Please open an issue if you are unable to replicate your use case: "
    "https://github.com/pytorch/pytorch/issues/new/choose."
)

ORDER_WARNING = (
    "Detected call of `lr_scheduler.step()` before `optimizer.step()`. "
    "In PyTorch 1.1.0 and later, you should call them in the opposite order: "
    "`optimizer.step()` before `lr_scheduler.step()`.  Failure to do this "
    "will result in PyTorch skipping the first value of the learning rate schedule. "
    "See more details at "
    "https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate"
)


# lucid.functional.schedules' name of each scheduler whose name is not its class's in
# snake case
_FUNCTIONAL_NAMES = {
    "SequentialLR": "sequential",
    "ChainedScheduler": "chained",
    "NoamScheduler": "noam",
}


def _is_optax(value: Any) -> bool:
    """An optax transform (lucid.functional's are optax's), or a function making one."""
    if callable(getattr(value, "init", None)) and callable(getattr(value, "update", None)):
        return True
    module = getattr(value, "__module__", None) or ""
    return callable(value) and (module.startswith(("optax.", "lucid.functional.")))


def schedule_hint(optimizer: Any, scheduler: str) -> str:
    """For an optax transform given where an optimizer belongs: the pointer to the
    scheduler's counterpart in `lucid.functional.schedules`; `""` otherwise."""
    if not _is_optax(optimizer):
        return ""
    from ...functional import schedules

    name = (
        _FUNCTIONAL_NAMES.get(scheduler)
        or re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", scheduler).lower()
    )
    where = "lucid.functional.schedules"
    if name == "reduce_lr_on_plateau":
        fix = (
            f"its counterpart, {where}.reduce_lr_on_plateau(...), is a state machine: "
            "update it with the metric after each evaluation and give the transform its "
            "state.lr (the Schedules page shows how)"
        )
    else:
        example = f"{name}(base_lr, ...)" if name in schedules.__all__ else "step_lr(1e-3, 30)"
        fix = (
            f"an optax transform, lucid.functional's included, takes a schedule of {where} "
            f"as its lr, e.g. `lucid.functional.adam(lr={where}.{example})`"
        )
    return (
        f": {scheduler} schedules a lucid.optim optimizer (it writes the lr into its "
        f"param_groups, as torch's does), but got an optax transform (or what makes one); {fix}"
    )


def check_optimizer(optimizer: Any, scheduler: str) -> None:
    """torch's `TypeError` for something that is not an optimizer (here: has no
    `param_groups`), pointing an optax transform to `lucid.functional.schedules`."""
    if not hasattr(optimizer, "param_groups"):
        raise TypeError(
            f"{type(optimizer).__name__} is not an Optimizer{schedule_hint(optimizer, scheduler)}"
        )


def param_groups_of(optimizer: Any, scheduler: str) -> list[dict]:
    """`optimizer.param_groups`, read where torch's scheduler reads it before any check
    (its `AttributeError` for something else, pointing an optax transform to
    `lucid.functional.schedules`)."""
    if not hasattr(optimizer, "param_groups"):
        raise AttributeError(
            f"'{type(optimizer).__name__}' object has no attribute 'param_groups'"
            f"{schedule_hint(optimizer, scheduler)}"
        )
    return optimizer.param_groups


def per_group(name: str, optimizer: Any, value: Any) -> list[Any]:
    """One value per group: a list/tuple must match the groups (torch's wording)."""
    groups = optimizer.param_groups
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise ValueError(
                f"{name} must have the same length as optimizer.param_groups. "
                f"{name} has {len(value)} values, param_groups has {len(groups)}."
            )
        return list(value)
    return [value] * len(groups)


def _has_stepped(optimizer: Any) -> bool:
    """Whether `optimizer.step()` ran (lucid's optimizers record it, as torch's wrapped
    step sets a flag; a CompiledOptimizer answers for the optimizer it runs)."""
    return bool(getattr(optimizer, "has_stepped", False))


def group_values(optimizer: Any, key: str) -> list[Any]:
    return [group[key] for group in optimizer.param_groups]


def uses_beta1(optimizer: Any) -> bool:
    """Whether momentum cycling writes `betas[0]` (True) or `momentum` (False).

    torch looks at `optimizer.defaults`; an object without `defaults` is
    judged by its first parameter group.
    """
    keys = getattr(optimizer, "defaults", None)
    if keys is None:
        keys = optimizer.param_groups[0] if optimizer.param_groups else {}
    if "momentum" not in keys and "betas" not in keys:
        raise ValueError(
            "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"
        )
    return "betas" in keys


def set_momentum(group: dict, value: float, use_beta1: bool) -> None:
    if use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


class LRScheduler:
    """Base class of the lr schedulers, with `torch.optim.lr_scheduler.LRScheduler`'s protocol.

    A scheduler writes a new `lr` into every parameter group of its optimizer
    at each `step()`, which you call once per epoch (or per batch, as the
    schedule is meant), after `optimizer.step()`. It works on any object
    whose `param_groups` is a list of dicts holding `"lr"`: lucid's
    optimizers, a [CompiledOptimizer][lucid.optim.CompiledOptimizer] (whose
    compiled step reads the new lr as a runtime input: no recompilation), or
    your own. Learning rates are Python floats computed as torch computes
    them; `state_dict()` has torch's keys, so checkpoints move both ways.

    With `t` the number of `step()` calls since construction (`last_epoch`),
    a subclass's `get_lr()` gives each group's lr at `t`. Construction takes
    the first step (to `t = 0`). To write your own scheduler, subclass this
    and write `get_lr`, as in torch.

    Args:
      optimizer: the optimizer whose `param_groups` the scheduler writes.
      last_epoch: the index of the last step taken: `-1` (the default) starts
        the schedule, writing each group's `lr` into `initial_lr` (unless a
        scheduler did already); `>= 0` resumes it at `last_epoch + 1`, from the
        `initial_lr` every group must already hold.

    Attributes:
      optimizer: the wrapped optimizer.
      base_lrs: each group's `initial_lr` at construction: the schedules'
        starting values.
      last_epoch: the number of steps taken since the start (`t`); 0 right
        after construction.

    Raises:
      TypeError: `optimizer` has no `param_groups`.
      KeyError: `last_epoch >= 0` and a group holds no `initial_lr`.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.lr_scheduler import LRScheduler
      >>> class Halving(LRScheduler):
      ...     def get_lr(self):
      ...         return [base * 0.5 ** self.last_epoch for base in self.base_lrs]
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
      >>> sched = Halving(opt)
      >>> for _ in range(2):
      ...     opt.step()
      ...     sched.step()
      >>> sched.last_epoch, sched.get_last_lr(), opt.param_groups[0]["lr"]
      (2, [0.25], 0.25)
    """

    # the attributes' types (the API reference's Attributes table reads them)
    optimizer: Any
    base_lrs: list[float]
    last_epoch: int

    _get_lr_called_within_step: bool = False
    _is_initial: bool = False

    def __init__(self, optimizer: Any, last_epoch: int = -1) -> None:
        check_optimizer(optimizer, type(self).__name__)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when "
                        "resuming scheduler with last_epoch >= 0.\n"
                        "This typically happens when:\n"
                        "1. You're trying to resume training from a checkpoint but haven't "
                        "properly loaded the optimizer state\n"
                        "2. You're using last_epoch >= 0 for a fresh training run (not recommended)"
                    )
        self.base_lrs: list[Any] = group_values(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        self.initial_step()

    def initial_step(self) -> None:
        """Take the step every constructor takes (`last_epoch` -1 to 0), in initial
        mode (torch: `_initial_step`); `SequentialLR` calls it on its first child."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state, in torch's format (torch: `scheduler.state_dict()`).

        Returns:
          Every attribute but the optimizer, by torch's names (`last_epoch`,
          `base_lrs`, `_last_lr`, `_step_count` and the class's own), as a
          dict that `torch.save` and a torch scheduler's `load_state_dict`
          take. A function a scheduler holds (`lr_lambda`, `scale_fn`) is
          saved as torch saves it: `None` for a plain function, the `__dict__`
          of a callable object.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> sched = lucid.optim.lr_scheduler.StepLR(opt, step_size=2)
          >>> sd = sched.state_dict()
          >>> sd["last_epoch"], sd["step_size"], sd["base_lrs"]
          (0, 2, [1.0])
        """
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state [state_dict][lucid.optim.lr_scheduler.LRScheduler.state_dict]
        saved (lucid's or torch's).

        The optimizer's groups are not touched: load the optimizer's own
        state_dict for its `lr`s. A scheduler holding functions must be
        constructed with the same functions before it loads.

        Args:
          state_dict: a scheduler's `state_dict()` of the same class.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.lr_scheduler import StepLR
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> sched = StepLR(opt, step_size=2)
          >>> for _ in range(3):
          ...     opt.step()
          ...     sched.step()
          >>> resumed = StepLR(opt, step_size=2)
          >>> resumed.load_state_dict(sched.state_dict())
          >>> resumed.last_epoch
          3
        """
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list[Any]:
        """The learning rates the last step wrote (torch: `scheduler.get_last_lr()`).

        Returns:
          One lr per parameter group, a list of Python floats.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> lucid.optim.lr_scheduler.ConstantLR(opt, factor=0.5).get_last_lr()
          [0.5]
        """
        return self._last_lr

    def get_lr(self) -> list[Any]:
        """Each group's lr at the current `last_epoch` (what `step()` writes).

        Subclasses write it (as in torch: the recursive schedules scale the
        group's current `lr`). `step()` calls it; called directly it warns, as
        torch's does: read `get_last_lr()` instead.

        Returns:
          One lr per parameter group.

        Raises:
          NotImplementedError: in this base class.
        """
        raise NotImplementedError

    def _warn_if_called_directly(self) -> None:
        if not self._get_lr_called_within_step:
            warnings.warn(
                "To get the last learning rate computed by the scheduler, "
                "please use `get_last_lr()`.",
                UserWarning,
                stacklevel=3,
            )

    def step(self, epoch: int | None = None) -> None:
        """Advance the schedule one step and write each group's new `lr` (torch: `step()`).

        Call it after `optimizer.step()`: torch warns, as here, when the first
        call comes before any optimizer step (the schedule's first value
        would be skipped).

        Args:
          epoch: deprecated in torch (it warns, as here): jump to step `epoch`
            instead of the next one, using the class's closed form where it has
            one. `None` (the default) takes the next step.

        Warns:
          UserWarning: the first call comes before `optimizer.step()`, or
            `epoch` is given.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(1))], lr=1.0)
          >>> sched = lucid.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
          >>> opt.step()
          >>> sched.step()
          >>> opt.param_groups[0]["lr"]
          0.5
        """
        if self._step_count == 1 and not _has_stepped(self.optimizer):
            warnings.warn(ORDER_WARNING, UserWarning, stacklevel=2)
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self.update_lr(epoch)

    def update_lr(self, epoch: int | None = None) -> None:
        """Advance `last_epoch` (or set it to `epoch`) and write the new lrs, without
        `step()`'s order checks and warnings (`SequentialLR` restarts a child so).

        Args:
          epoch: `None` for the next epoch (the chainable form), or the epoch to
            jump to (the closed form where the scheduler has one).
        """
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                closed_form = getattr(self, "_get_closed_form_lr", None)
                values = closed_form() if closed_form is not None else self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        self._write_lrs(values)

    def _write_lrs(self, values: Sequence[Any]) -> None:
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = group_values(self.optimizer, "lr")

    def _current_lrs(self) -> list[Any]:
        return group_values(self.optimizer, "lr")
