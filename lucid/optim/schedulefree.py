"""The `schedulefree` package's optimizers (1.4.1) behind torch's stateful API.

`SGDScheduleFree`, `AdamWScheduleFree` and `RAdamScheduleFree` keep the training
sequence $y$ in the parameters while in train mode and the average $x$ in eval mode,
exactly as the package's classes: `train()` and `eval()` move the parameters between
the two ($y = \\mathrm{lerp}(x, z, 1-\\beta)$, $x = \\mathrm{lerp}(y, z, 1-1/\\beta)$), the
optimizer starts in eval mode (`train_mode=False` in every group), and `step()` outside
train mode raises. The `...Closure` forms keep $x$ in the parameters at all times and
evaluate the closure at $y$. The rules are `lucid.functional.schedulefree`'s.

Where the package keeps each quantity, lucid keeps it: per parameter `z` (and
`exp_avg_sq` for the Adam forms) in the state; per group `k`, `lr_max`, `weight_sum`,
`scheduled_lr` and `train_mode` in `param_groups`, so a state_dict moves between the
package and lucid both ways.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..functional import schedulefree as _sf
from ..functional._rule import Rule, compute_dtype
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "AdamWScheduleFree",
    "AdamWScheduleFreeClosure",
    "RAdamScheduleFree",
    "RAdamScheduleFreeClosure",
    "SGDScheduleFree",
    "SGDScheduleFreeClosure",
]

_NOT_TRAINING = (
    "Optimizer was not in train mode when step is called. Please insert .train() and "
    ".eval() calls on the optimizer. See documentation for details."
)

_STEPPING = threading.local()


def _in_class_step(options: Any) -> None:
    """A step that does not come through the class's `step()` (a fused step) would skip
    the group bookkeeping the package does on the host: refuse it before anything moves."""
    if not getattr(_STEPPING, "active", False):
        raise RuntimeError(
            "schedule-free optimizers update their groups' k, lr_max and weight_sum on the "
            "host at every step, which fused_step does not run; use compile_optimizer(opt) "
            "and opt.step() (one compiled executable per step) instead"
        )


def _class_rule(rule: Rule) -> Rule:
    return dataclasses.replace(rule, check_at_step=_in_class_step)


@jax.jit
def _lerp_all(params: list, zs: list, weights: list) -> list:
    """Every parameter's ``lerp(p, z, w)`` in one executable (weights are runtime values:
    switching modes reuses it)."""
    return [
        _sf._lerp(p.astype(w.dtype), z.astype(w.dtype), w).astype(p.dtype)
        for p, z, w in zip(params, zs, weights)
    ]


class _ScheduleFree(Optimizer):
    """What the Schedule-Free classes share: the host bookkeeping of each step, and the
    moves of the parameters between the sequences."""

    _closure_form = False

    def _move(self, groups: list[dict[str, Any]], to_eval: bool) -> None:
        """Move the parameters of ``groups`` that have state along ``lerp(p, z, w)``."""
        states = self.backend.states()
        params, zs, weights = [], [], []
        for group in groups:
            weight = _sf.switch_weight(group, to_eval)
            for p in group["params"]:
                state = states.get(p)
                if state is None:
                    continue
                params.append(p)
                zs.append(state.z)
                weights.append(jnp.asarray(weight, compute_dtype(p.dtype)))
        if not params:
            return
        for p, value in zip(params, _lerp_all([p.data for p in params], zs, weights)):
            p.data = value

    def _advance_groups(self) -> None:
        for group in self.param_groups:
            group.update(_sf.host_scalars(self.rule, group))

    def _run_rule(self, closure: Callable[[], Any] | None) -> Any:
        _STEPPING.active = True
        try:
            loss = Optimizer.step(self, closure)
        finally:
            _STEPPING.active = False
        self._advance_groups()
        return loss


class _TrainEval(_ScheduleFree):
    """The package's default form: `y` in the parameters in train mode, `x` in eval mode."""

    def train(self) -> None:
        """Switch to train mode: every group in eval mode moves its parameters to y
        (`p ← lerp(p, z, 1-β)`) and sets `train_mode`; a group in train mode is left
        as it is. Parameters without state (never stepped) do not move.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.schedulefree.SGDScheduleFree([lucid.Parameter(jnp.ones(2))])
          >>> opt.param_groups[0]["train_mode"]
          False
          >>> opt.train()
          >>> opt.param_groups[0]["train_mode"]
          True
        """
        groups = [g for g in self.param_groups if not g["train_mode"]]
        self._move(groups, to_eval=False)
        for group in groups:
            group["train_mode"] = True

    def eval(self) -> None:
        """Switch to eval mode: every group in train mode moves its parameters to x
        (`p ← lerp(p, z, 1-1/β)`), the weights to evaluate and save, and clears
        `train_mode`.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
          >>> opt = lucid.optim.schedulefree.SGDScheduleFree([w], lr=0.1)
          >>> opt.train()
          >>> for _ in range(2):
          ...     w.grad = jnp.array([0.5, -1.0])
          ...     opt.step()
          >>> [round(v, 4) for v in w.data.tolist()]  # y
          [0.9225, -1.845]
          >>> opt.eval()
          >>> [round(v, 4) for v in w.data.tolist()]  # x
          [0.925, -1.85]
        """
        groups = [g for g in self.param_groups if g["train_mode"]]
        self._move(groups, to_eval=True)
        for group in groups:
            group["train_mode"] = False

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Schedule-Free step of every parameter that has a gradient; every group's
        `k`, `lr_max`, `weight_sum` and `scheduled_lr` advance (also a group none of
        whose parameters has a gradient, as the package's).

        Args:
          closure: an optional function that recomputes the loss, called once first.

        Returns:
          What `closure()` returned, or `None`.

        Raises:
          RuntimeError: the first group is not in train mode (the package raises an
            `Exception` with the same message).
          ValueError: a gradient that does not fit its parameter (nothing has moved).
        """
        if not self.param_groups[0]["train_mode"]:
            raise RuntimeError(_NOT_TRAINING)
        return self._run_rule(closure)


class _Closure(_ScheduleFree):
    """The package's closure form: `x` in the parameters; `step(closure)` moves them to
    y, evaluates the closure there and comes back."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One Schedule-Free step: the parameters (x) move to y, `closure()` recomputes
        the gradients there, then every parameter with a gradient takes the step back
        to its new x, and every group's `k`, `lr_max`, `weight_sum` advance.

        Args:
          closure: a function that zeroes the gradients, computes the loss with
            [backward][lucid.backward] and returns it (required).

        Returns:
          What `closure()` returned.

        Raises:
          TypeError: no closure (the package requires one).
          ValueError: a gradient that does not fit its parameter (the parameters are
            put back, nothing has moved).
        """
        if closure is None:
            raise TypeError(f"{type(self).__name__}.step() requires a closure")
        saved = [(p, p.data) for group in self.param_groups for p in group["params"]]
        self._move(self.param_groups, to_eval=False)  # x -> y (z is the package's clone: p)
        try:
            return self._run_rule(closure)
        except BaseException:
            for p, value in saved:
                p.data = value
            raise


def _examples(cls: str, kwargs: str, y: str, x: str) -> str:
    return f"""
    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.schedulefree.{cls}([w], {kwargs})
      >>> opt.train()
      >>> for _ in range(2):
      ...     w.grad = jnp.array([0.5, -1.0])
      ...     opt.step()
      >>> [round(v, 4) for v in w.data.tolist()]  # train mode: y
      {y}
      >>> opt.eval()
      >>> [round(v, 4) for v in w.data.tolist()]  # eval mode: x
      {x}
    """


def _closure_examples(cls: str, kwargs: str, x: str) -> str:
    return f"""
    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.schedulefree.{cls}([w], {kwargs})
      >>> def closure():
      ...     opt.zero_grad()
      ...     return lucid.backward(lambda w: (w**2).sum(), w)
      >>> for _ in range(2):
      ...     loss = opt.step(closure)
      >>> [round(v, 4) for v in w.data.tolist()]  # always x
      {x}
    """


@torch_optimizer(_sf.SGD_SCHEDULEFREE_SIGNATURE, step_example=False, reference="schedulefree")
class SGDScheduleFree(_TrainEval):
    __doc__ = """`schedulefree.SGDScheduleFree`: Schedule-Free SGD with momentum, warm-up and
    polynomial weighting; `train()` / `eval()` switch the parameters between y and x.
    """ + _examples(
        "SGDScheduleFree",
        "lr=0.1",
        "[0.9225, -1.845]",
        "[0.925, -1.85]",
    )
    rule = _class_rule(_sf.SGD_SCHEDULEFREE)


@torch_optimizer(_sf.ADAMW_SCHEDULEFREE_SIGNATURE, step_example=False, reference="schedulefree")
class AdamWScheduleFree(_TrainEval):
    __doc__ = """`schedulefree.AdamWScheduleFree`: Schedule-Free AdamW (the gradient divided by
    √v, bias-corrected; weight decay at y); `train()` / `eval()` switch the parameters
    between y and x.
    """ + _examples(
        "AdamWScheduleFree",
        "lr=0.1",
        "[0.845, -1.845]",
        "[0.85, -1.85]",
    )
    rule = _class_rule(_sf.ADAMW_SCHEDULEFREE)


@torch_optimizer(_sf.RADAM_SCHEDULEFREE_SIGNATURE, step_example=False, reference="schedulefree")
class RAdamScheduleFree(_TrainEval):
    __doc__ = """`schedulefree.RAdamScheduleFree`: Schedule-Free RAdam (no warm-up parameter:
    RAdam's rectification is the warm-up); `train()` / `eval()` switch the parameters
    between y and x.
    """ + _examples(
        "RAdamScheduleFree",
        "lr=0.1, silent_sgd_phase=False",
        "[0.9225, -1.845]",
        "[0.925, -1.85]",
    )
    rule = _class_rule(_sf.RADAM_SCHEDULEFREE)


@torch_optimizer(
    _sf.SGD_SCHEDULEFREE_CLOSURE_SIGNATURE, step_example=False, reference="schedulefree"
)
class SGDScheduleFreeClosure(_Closure):
    __doc__ = """`schedulefree.SGDScheduleFreeClosure`: Schedule-Free SGD whose parameters
    always hold x; `step(closure)` evaluates the gradient at y.
    """ + _closure_examples("SGDScheduleFreeClosure", "lr=0.1", "[0.72, -1.44]")
    rule = _class_rule(_sf.SGD_SCHEDULEFREE_CLOSURE)


@torch_optimizer(
    _sf.ADAMW_SCHEDULEFREE_CLOSURE_SIGNATURE, step_example=False, reference="schedulefree"
)
class AdamWScheduleFreeClosure(_Closure):
    __doc__ = """`schedulefree.AdamWScheduleFreeClosure`: Schedule-Free AdamW whose parameters
    always hold x; `step(closure)` evaluates the gradient at y.
    """ + _closure_examples("AdamWScheduleFreeClosure", "lr=0.1", "[0.8527, -1.8513]")
    rule = _class_rule(_sf.ADAMW_SCHEDULEFREE_CLOSURE)


@torch_optimizer(
    _sf.RADAM_SCHEDULEFREE_CLOSURE_SIGNATURE, step_example=False, reference="schedulefree"
)
class RAdamScheduleFreeClosure(_Closure):
    __doc__ = """`schedulefree.RAdamScheduleFreeClosure`: Schedule-Free RAdam whose parameters
    always hold x; `step(closure)` evaluates the gradient at y.
    """ + _closure_examples(
        "RAdamScheduleFreeClosure",
        "lr=0.1, silent_sgd_phase=False",
        "[0.72, -1.44]",
    )
    rule = _class_rule(_sf.RADAM_SCHEDULEFREE_CLOSURE)
