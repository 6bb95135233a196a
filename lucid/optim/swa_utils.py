"""`torch.optim.swa_utils` for lucid: averaged copies of Parameter pytrees, and SWALR.

[AveragedModel][lucid.optim.swa_utils.AveragedModel] keeps an averaged copy
of a model (any pytree holding [Parameter][lucid.Parameter] objects) and
updates it from the live model with torch's averaging functions;
[SWALR][lucid.optim.swa_utils.SWALR] anneals each group's learning rate to a
fixed SWA value. The averaging math is
[lucid.functional.averaging][]'s, which also offers it as pure functions.

One difference follows from JAX arrays being immutable: a `multi_avg_fn`
returns the new averaged values (a list) instead of updating them in place.
`update_bn` has no counterpart: lucid has no modules with batch-norm buffers;
average such statistics with `use_buffers=True` instead.
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
    """The exponential moving average over lists of arrays (torch's `get_ema_multi_avg_fn`).

    For each pair of arrays, $\\bar w \\leftarrow \\mathrm{lerp}(\\bar w, w, 1 - \\text{decay})
    = \\text{decay} \\cdot \\bar w + (1 - \\text{decay}) \\, w$, computed as torch's `lerp`.

    Args:
      decay: the weight the average keeps at each update, in $[0, 1]$.

    Returns:
      `multi_avg_fn(averaged, current, n_averaged) -> new averaged`, over lists
      of arrays (`n_averaged` is unused), for
      [AveragedModel][lucid.optim.swa_utils.AveragedModel].

    Raises:
      ValueError: `decay` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim.swa_utils import get_ema_multi_avg_fn
      >>> ema = get_ema_multi_avg_fn(0.5)
      >>> [a.tolist() for a in ema([jnp.array([0.0])], [jnp.array([2.0])], 1)]
      [[1.0]]
    """
    check_decay(decay)

    fold = ema_fold(decay)

    def ema_update(ema: list[Array], current: list[Array], _: Any) -> list[Array]:
        return [fold(e, c) for e, c in zip(ema, current)]

    return ema_update


def get_swa_multi_avg_fn() -> MultiAvgFn:
    """Stochastic weight averaging over lists of arrays (torch's `get_swa_multi_avg_fn`).

    For each pair of arrays, the running mean of the $n$ sets averaged so far
    and the current one: $\\bar w \\leftarrow \\mathrm{lerp}(\\bar w, w, 1 / (n + 1))$.

    Returns:
      `multi_avg_fn(averaged, current, n_averaged) -> new averaged`, over lists
      of arrays, for [AveragedModel][lucid.optim.swa_utils.AveragedModel].

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim.swa_utils import get_swa_multi_avg_fn
      >>> swa = get_swa_multi_avg_fn()
      >>> [a.tolist() for a in swa([jnp.array([1.0])], [jnp.array([4.0])], 2)]
      [[2.0]]
    """

    def swa_update(averaged: list[Array], current: list[Array], n: Array) -> list[Array]:
        return [swa_lerp_fold(a, c, n) for a, c in zip(averaged, current)]

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> AvgFn:
    """The exponential moving average of one array (torch's `get_ema_avg_fn`).

    $\\bar w \\leftarrow \\text{decay} \\cdot \\bar w + (1 - \\text{decay}) \\, w$.

    Args:
      decay: the weight the average keeps at each update, in $[0, 1]$.

    Returns:
      `avg_fn(averaged, current, n_averaged) -> new averaged`, one array at a
      time (`n_averaged` is unused), for
      [AveragedModel][lucid.optim.swa_utils.AveragedModel].

    Raises:
      ValueError: `decay` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim.swa_utils import get_ema_avg_fn
      >>> get_ema_avg_fn(0.75)(jnp.array([0.0]), jnp.array([4.0]), 1).tolist()
      [1.0]
    """
    check_decay(decay)

    def ema_update(ema: Array, current: Array, n: Any) -> Array:
        return decay * ema + (1 - decay) * current

    return ema_update


def get_swa_avg_fn() -> AvgFn:
    """Stochastic weight averaging of one array (torch's `get_swa_avg_fn`).

    The running mean of the $n$ arrays averaged so far and the current one:
    $\\bar w \\leftarrow \\bar w + (w - \\bar w) / (n + 1)$. What
    [AveragedModel][lucid.optim.swa_utils.AveragedModel] uses when given no
    averaging function (torch's default off CUDA).

    Returns:
      `avg_fn(averaged, current, n_averaged) -> new averaged`, one array at a
      time.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim.swa_utils import get_swa_avg_fn
      >>> get_swa_avg_fn()(jnp.array([1.0]), jnp.array([4.0]), 2).tolist()
      [2.0]
    """

    return swa_fold


def _is_parameter(x: Any) -> bool:
    return isinstance(x, Parameter)


class AveragedModel:
    """An averaged copy of a model: SWA by default, or an EMA (torch's `AveragedModel`).

    `module` is a pytree shaped like `model`, with new Parameters (and, for
    plain array leaves, copies: torch's buffers). The first
    [update_parameters][lucid.optim.swa_utils.AveragedModel.update_parameters]
    copies the model; each later one averages the model's current values in,
    with `multi_avg_fn` (lists of arrays, new values returned) or `avg_fn`
    (one array at a time); SWA, the running mean
    $\\bar w_{n+1} = \\bar w_n + (w - \\bar w_n) / (n + 1)$, when neither is
    given. Without `use_buffers` the plain arrays are copied from the model at
    every update, as torch keeps buffers in sync.

    Args:
      model: a pytree holding Parameters (and possibly plain arrays).
      device: the `jax.Device` to keep the averaged copy on; `None` keeps it
        where the model's values are.
      avg_fn: `avg_fn(averaged, current, n_averaged) -> new averaged`, applied
        to one array at a time ([get_ema_avg_fn][lucid.optim.swa_utils.get_ema_avg_fn],
        [get_swa_avg_fn][lucid.optim.swa_utils.get_swa_avg_fn] or your own).
      multi_avg_fn: `multi_avg_fn(averaged, current, n_averaged) -> new
        averaged`, applied to the lists of every averaged array at once
        ([get_ema_multi_avg_fn][lucid.optim.swa_utils.get_ema_multi_avg_fn],
        [get_swa_multi_avg_fn][lucid.optim.swa_utils.get_swa_multi_avg_fn]);
        it takes precedence over `avg_fn`.
      use_buffers: also average the plain array leaves (torch: the buffers)
        instead of copying them.

    Attributes:
      module: the averaged copy, a pytree shaped like `model`.
      n_averaged: the number of updates so far, a 0-d int32 array.

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
        """Fold `model`'s current values into the average (torch: `update_parameters`).

        The first call copies the values; each later one averages them in,
        and `n_averaged` grows by one.

        Args:
          model: the live model, a pytree shaped like the one the average was
            made from.

        Raises:
          ValueError: `model` is not shaped like the averaged copy.
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
        """The averaged model's state.

        Returns:
          `{"module": [value, ...], "n_averaged": n}`: the averaged values in
          leaf order, and the number of updates.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.swa_utils import AveragedModel
          >>> w = lucid.Parameter(jnp.array([1.0]))
          >>> swa = AveragedModel([w])
          >>> swa.update_parameters([w])
          >>> sd = swa.state_dict()
          >>> [a.tolist() for a in sd["module"]], int(sd["n_averaged"])
          ([[1.0]], 1)
        """
        leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        return {"module": [_value(leaf) for leaf in leaves], "n_averaged": self.n_averaged}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what [state_dict][lucid.optim.swa_utils.AveragedModel.state_dict]
        returned (checked first: all or nothing).

        Args:
          state_dict: `{"module": [value, ...], "n_averaged": n}`, from an
            averaged model of the same structure.

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
    """Anneal each group's lr to a fixed `swa_lr`, then hold it there (torch's `SWALR`).

    With $\\eta_0$ the group's lr when the annealing starts, $T$ =
    `anneal_epochs` and $\\alpha_t = a(\\min(1, t / T))$, after $t$ steps

    $$
    \\eta_t = \\alpha_t \\, \\text{swa\\_lr} + (1 - \\alpha_t) \\, \\eta_0,
    $$

    where $a(x) = (1 - \\cos \\pi x) / 2$ (`"cos"`) or $a(x) = x$
    (`"linear"`); reached as torch's recursive step does, from the group's
    current lr. Used for the SWA phase of training, with
    [AveragedModel][lucid.optim.swa_utils.AveragedModel].

    Args:
      optimizer: the optimizer (or anything with torch-style `param_groups`).
      swa_lr: the lr to anneal to and hold, one value or a list with one per
        group (written into each group as `swa_lr`).
      anneal_epochs: the number of steps $T$ of the annealing (`>= 0`; with
        0 the lr is `swa_lr` from construction on).
      anneal_strategy: `"cos"` or `"linear"`, the shape $a$ of the annealing.
      last_epoch: the index of the last step taken; `-1` starts the schedule, `>= 0`
        resumes it (see [LRScheduler][lucid.optim.lr_scheduler.LRScheduler]).

    Raises:
      ValueError: an unknown strategy, a negative or non-integer `anneal_epochs`,
        or `swa_lr` of the wrong length.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.swa_utils import SWALR
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(1))], lr=1.0)
      >>> sched = SWALR(opt, swa_lr=0.1, anneal_epochs=3, anneal_strategy="linear")
      >>> lrs = [round(sched.get_last_lr()[0], 4)]
      >>> for _ in range(4):
      ...     opt.step()
      ...     sched.step()
      ...     lrs.append(round(sched.get_last_lr()[0], 4))
      >>> lrs
      [1.0, 0.7, 0.4, 0.1, 0.1]
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
        """Each group's lr at the current step, in torch's recursive form: undo the last
        annealing step, take the next one.

        Returns:
          One lr per parameter group.
        """
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
