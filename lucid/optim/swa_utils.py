"""``torch.optim.swa_utils`` for lucid: averaged copies of Parameter pytrees and SWALR.

:class:`AveragedModel` keeps an averaged copy of a model (any pytree holding
:class:`~lucid.Parameter` objects) and updates it from the live model with
torch's averaging functions; :class:`SWALR` anneals each group's learning rate
to a fixed SWA value. The averaging math is :mod:`lucid.functional.averaging`'s.

One difference follows from JAX arrays being immutable: a ``multi_avg_fn``
returns the new averaged values (a list) instead of updating them in place.
``update_bn`` has no counterpart: lucid has no modules with batch-norm buffers;
average such statistics with ``use_buffers=True`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from .._parameter import Parameter
from ..functional.averaging import check_decay, ema_fold, swa_fold, swa_lerp_fold
from ._schedulers.base import LRScheduler, per_group

Array = jax.Array
MultiAvgFn = Callable[[list[Array], list[Array], Array], list[Array]]
AvgFn = Callable[[Array, Array, Array], Array]

__all__ = [
    "SWALR",
    "AveragedModel",
    "get_ema_avg_fn",
    "get_ema_multi_avg_fn",
    "get_swa_avg_fn",
    "get_swa_multi_avg_fn",
]


def get_ema_multi_avg_fn(decay: float = 0.999) -> MultiAvgFn:
    """torch's EMA over lists: ``lerp(ema, current, 1 - decay)``; returns the new list.

    Raises:
      ValueError: ``decay`` outside ``[0, 1]``.
    """
    check_decay(decay)

    fold = ema_fold(decay)

    def ema_update(ema: list[Array], current: list[Array], _: Any) -> list[Array]:
        return [fold(e, c) for e, c in zip(ema, current)]

    return ema_update


def get_swa_multi_avg_fn() -> MultiAvgFn:
    """torch's SWA over lists: ``lerp(avg, current, 1 / (n + 1))``; returns the new list."""

    def swa_update(averaged: list[Array], current: list[Array], n: Array) -> list[Array]:
        return [swa_lerp_fold(a, c, n) for a, c in zip(averaged, current)]

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> AvgFn:
    """torch's single-array EMA: ``decay * ema + (1 - decay) * current``.

    Raises:
      ValueError: ``decay`` outside ``[0, 1]``.
    """
    check_decay(decay)

    def ema_update(ema: Array, current: Array, n: Any) -> Array:
        return decay * ema + (1 - decay) * current

    return ema_update


def get_swa_avg_fn() -> AvgFn:
    """torch's single-array SWA: ``avg + (current - avg) / (n + 1)``."""

    return swa_fold


def _is_parameter(x: Any) -> bool:
    return isinstance(x, Parameter)


class AveragedModel:
    """An averaged copy of ``model`` (SWA by default, or EMA with ``get_ema_*``).

    ``module`` is a pytree shaped like ``model`` with new Parameters (and, for
    plain array leaves, copies: torch's buffers). The first
    :meth:`update_parameters` copies the model; each later one averages with
    ``multi_avg_fn`` (lists of arrays, new values returned) or ``avg_fn`` (one
    array at a time), SWA when neither is given. ``n_averaged`` counts updates.
    Without ``use_buffers`` the plain arrays are copied from the model at every
    update, as torch keeps buffers in sync.

    Args:
      model: a pytree holding Parameters.
      device: if given, the averaged copy lives there (``jax.Device``).
      avg_fn: ``avg_fn(averaged, current, n_averaged) -> new averaged``.
      multi_avg_fn: ``multi_avg_fn(averaged_list, current_list, n_averaged) -> new list``.
      use_buffers: also average the plain array leaves (torch: buffers).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
      >>> w = lucid.Parameter(jnp.array([1.0]))
      >>> ema = AveragedModel({"w": w}, multi_avg_fn=get_ema_multi_avg_fn(0.5))
      >>> ema.update_parameters({"w": w})
      >>> w.data = jnp.array([3.0])
      >>> ema.update_parameters({"w": w})
      >>> ema.module["w"].data.tolist(), int(ema.n_averaged)
      ([2.0], 2)
    """

    def __init__(
        self,
        model: Any,
        device: Any = None,
        avg_fn: AvgFn | None = None,
        multi_avg_fn: MultiAvgFn | None = None,
        use_buffers: bool = False,
    ) -> None:
        leaves, self._treedef = jax.tree_util.tree_flatten(model, is_leaf=_is_parameter)
        copies = []
        for leaf in leaves:
            value = leaf.data if isinstance(leaf, Parameter) else leaf
            if isinstance(value, jax.Array | np.ndarray):
                value = jnp.array(value, copy=True)
                if device is not None:
                    value = jax.device_put(value, device)
            copies.append(Parameter(value) if isinstance(leaf, Parameter) else value)
        self.module = jax.tree_util.tree_unflatten(self._treedef, copies)
        self.n_averaged = jnp.asarray(0, jnp.int32)
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers
        self.device = device

    def update_parameters(self, model: Any) -> None:
        """Fold ``model``'s current values into the average (the first call copies).

        Raises:
          ValueError: ``model`` is not shaped like the averaged copy.
        """
        model_leaves, treedef = jax.tree_util.tree_flatten(model, is_leaf=_is_parameter)
        if treedef != self._treedef:
            raise ValueError(
                f"update_parameters: the model's structure {treedef} differs from the "
                f"averaged copy's {self._treedef}"
            )
        own_leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        positions = [
            i
            for i, leaf in enumerate(own_leaves)
            if isinstance(leaf, Parameter)
            or (self.use_buffers and isinstance(leaf, jax.Array | np.ndarray))
        ]
        averaged = [_value(own_leaves[i]) for i in positions]
        current = [self._placed(_value(model_leaves[i])) for i in positions]
        if int(self.n_averaged) == 0:
            new = [jnp.array(c, copy=True).astype(a.dtype) for a, c in zip(averaged, current)]
        elif self.multi_avg_fn is not None:
            new = list(self.multi_avg_fn(averaged, current, self.n_averaged))
        else:  # torch's default off CUDA is the one-array SWA, one parameter at a time
            avg_fn = self.avg_fn or get_swa_avg_fn()
            new = [avg_fn(a, c, self.n_averaged) for a, c in zip(averaged, current)]
        for i, value in zip(positions, new):
            if isinstance(own_leaves[i], Parameter):
                own_leaves[i].data = value
            else:
                own_leaves[i] = value
        if not self.use_buffers:  # torch keeps the buffers in sync with the model's
            for i, leaf in enumerate(model_leaves):
                if not isinstance(leaf, Parameter) and isinstance(leaf, jax.Array | np.ndarray):
                    own_leaves[i] = self._placed(jnp.array(leaf, copy=True))
        self.module = jax.tree_util.tree_unflatten(self._treedef, own_leaves)
        self.n_averaged = self.n_averaged + 1

    def _placed(self, value: Array) -> Array:
        return value if self.device is None else jax.device_put(value, self.device)

    def state_dict(self) -> dict[str, Any]:
        """The averaged values (leaf order) and ``n_averaged``, as arrays."""
        leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        return {"module": [_value(leaf) for leaf in leaves], "n_averaged": self.n_averaged}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (checked first, all or nothing).

        Raises:
          ValueError: a different number of leaves, or a shape that does not fit.
        """
        leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        saved = list(state_dict["module"])
        if len(saved) != len(leaves):
            raise ValueError(f"expected {len(leaves)} leaves, the state_dict has {len(saved)}")
        for leaf, value in zip(leaves, saved):
            if np.shape(value) != np.shape(_value(leaf)):
                raise ValueError(
                    f"a saved leaf of shape {np.shape(value)} does not fit {np.shape(_value(leaf))}"
                )
        for i, value in enumerate(saved):
            if isinstance(leaves[i], Parameter):
                leaves[i].data = jnp.asarray(value, leaves[i].dtype)
            else:
                leaves[i] = jnp.asarray(value)
        self.module = jax.tree_util.tree_unflatten(self._treedef, leaves)
        self.n_averaged = jnp.asarray(state_dict["n_averaged"], jnp.int32)


def _value(leaf: Any) -> Any:
    return leaf.data if isinstance(leaf, Parameter) else leaf


def _cosine_anneal(t: float) -> float:
    return (1 - math.cos(math.pi * t)) / 2


def _linear_anneal(t: float) -> float:
    return t


class SWALR(LRScheduler):
    """Anneal each group's learning rate to ``swa_lr`` over ``anneal_epochs`` steps
    (``cos`` or ``linear``), then hold it there: torch's SWALR.

    Args:
      optimizer: the optimizer (or anything with torch-style ``param_groups``).
      swa_lr: the final learning rate, one value or one per group.
      anneal_epochs: steps of the annealing phase (``>= 0``).
      anneal_strategy: ``"cos"`` or ``"linear"``.
      last_epoch: the index of the last step (-1: start).

    Raises:
      ValueError: an unknown strategy, a negative or non-integer ``anneal_epochs``,
        or ``swa_lr`` of the wrong length.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(1))], lr=1.0)
      >>> sched = lucid.optim.swa_utils.SWALR(opt, swa_lr=0.1, anneal_epochs=2)
      >>> [round(g["lr"], 4) for g in opt.param_groups]
      [1.0]
    """

    def __init__(
        self,
        optimizer: Any,
        swa_lr: float | Sequence[float],
        anneal_epochs: int = 10,
        anneal_strategy: Literal["cos", "linear"] = "cos",
        last_epoch: int = -1,
    ) -> None:
        swa_lrs = per_group("swa_lr", optimizer, swa_lr)
        for value, group in zip(swa_lrs, optimizer.param_groups):
            group["swa_lr"] = value
        if anneal_strategy not in ["cos", "linear"]:
            raise ValueError(
                f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}"
            )
        self._anneal_strategy = anneal_strategy
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    def _anneal(self, t: float) -> float:
        return _cosine_anneal(t) if self._anneal_strategy == "cos" else _linear_anneal(t)

    @staticmethod
    def _get_initial_lr(lr: float, swa_lr: float, alpha: float) -> float:
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self) -> list[Any]:
        """torch's recursive form: undo the last annealing step, take the next one."""
        self._warn_if_called_directly()
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self._anneal(prev_t)
        prev_lrs = [
            self._get_initial_lr(group["lr"], group["swa_lr"], prev_alpha)
            for group in self.optimizer.param_groups
        ]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self._anneal(t)
        return [
            group["swa_lr"] * alpha + lr * (1 - alpha)
            for group, lr in zip(self.optimizer.param_groups, prev_lrs)
        ]
