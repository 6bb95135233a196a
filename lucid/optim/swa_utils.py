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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import is_torch_tensor, torch_to_numpy
from .._parameter import Parameter
from .._trees import UNBOXED, named_leaves
from ..functional.averaging import check_decay, ema_fold, swa_fold, swa_lerp_fold
from ._schedulers.base import LRScheduler, param_groups_of, per_group

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


def _is_array(x: Any) -> bool:
    return isinstance(x, Parameter | jax.Array | np.ndarray)


def _value(leaf: Any) -> Any:
    return leaf.data if isinstance(leaf, Parameter) else leaf


def _host(value: Any) -> np.ndarray:
    """A state_dict value as NumPy: torch tensors (bfloat16 included) through their bits."""
    return torch_to_numpy(value) if is_torch_tensor(value) else np.asarray(value)


def _keys(keys: list[str]) -> str:
    """State_dict keys as torch's `load_state_dict` lists them: double-quoted."""
    return ", ".join(f'"{key}"' for key in keys)


def _fitted(value: Any, like: Array, where: str, what: str) -> Array:
    """`value` written into an array shaped and typed as `like`, as torch's in-place
    `copy_` writes it: broadcast to `like`'s shape (never changing it), cast to its dtype.

    Raises:
      TypeError: `value` is not an array or a number.
      ValueError: `value`'s shape does not broadcast to `like`'s.
    """
    if isinstance(value, Parameter):
        value = value.data
    if isinstance(value, bool) or not isinstance(
        value, jax.Array | np.ndarray | np.generic | int | float
    ):
        raise TypeError(f"{what} for {where} must be an array, but got {type(value).__name__}")
    value = jnp.asarray(value)
    shape = tuple(like.shape)
    try:
        fits = np.broadcast_shapes(value.shape, shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{what} for {where} has shape {tuple(value.shape)}, which does not fit the "
            f"averaged copy's {shape} (torch's in-place copy refuses it too)"
        )
    return jnp.broadcast_to(value, shape).astype(like.dtype)


class AveragedModel:
    """An averaged copy of a model: SWA by default, or an EMA (torch's `AveragedModel`).

    `module` is a pytree shaped like `model`, with new Parameters (and, for
    plain array leaves, copies: torch's buffers); a Parameter `model` holds in
    several places (tied weights) is one Parameter in `module`, averaged once,
    as torch's `deepcopy` keeps the tie. The first
    [update_parameters][lucid.optim.swa_utils.AveragedModel.update_parameters]
    copies the model; each later one averages the model's current values in,
    with `multi_avg_fn` (lists of arrays, new values returned) or `avg_fn`
    (one array at a time); SWA, the running mean
    $\\bar w_{n+1} = \\bar w_n + (w - \\bar w_n) / (n + 1)$, when neither is
    given. Without `use_buffers` the plain arrays are copied from the model at
    every update, as torch keeps buffers in sync.

    As torch writes each result into the averaged tensor in place, every
    averaged array keeps its shape and dtype: a model value or an averaging
    function's result is broadcast to the averaged shape and cast to the
    averaged dtype (a float32 average of a float64 model stays float32), and
    one that does not broadcast is an error. Every value is checked before
    any is written: an update that fails changes nothing.

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
        [get_swa_multi_avg_fn][lucid.optim.swa_utils.get_swa_multi_avg_fn]).
        It returns the new values (a list as long as `averaged`), where
        torch's updates them in place.
      use_buffers: also average the plain array leaves (torch: the buffers)
        instead of copying them.

    Attributes:
      module: the averaged copy, a pytree shaped like `model`.
      n_averaged: the number of updates so far, a 0-d int32 array.

    Raises:
      ValueError: both `avg_fn` and `multi_avg_fn` (torch's message; torch
        raises an `AssertionError`).

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

    # the attributes' types (the API reference's Attributes table reads them)
    module: Any
    n_averaged: jax.Array

    def __init__(
        self,
        model: Any,
        device: Any = None,
        avg_fn: AvgFn | None = None,
        multi_avg_fn: MultiAvgFn | None = None,
        use_buffers: bool = False,
    ) -> None:
        if avg_fn is not None and multi_avg_fn is not None:
            raise ValueError("Only one of avg_fn and multi_avg_fn should be provided")
        leaves, self._treedef = jax.tree_util.tree_flatten(model, is_leaf=_is_parameter)
        if not any(isinstance(leaf, Parameter) for leaf in leaves) and any(
            isinstance(leaf, jax.Array | np.ndarray) and jnp.issubdtype(leaf.dtype, jnp.inexact)
            for leaf in leaves
        ):
            raise TypeError(f"AveragedModel: {UNBOXED}")
        copies = []
        made: dict[int, Any] = {}  # torch's deepcopy keeps a tie: a leaf held twice, one copy
        for leaf in leaves:
            if _is_array(leaf) and id(leaf) in made:
                copies.append(made[id(leaf)])
                continue
            value = leaf.data if isinstance(leaf, Parameter) else leaf
            if isinstance(value, jax.Array | np.ndarray):
                value = jnp.array(value, copy=True)
                if device is not None:
                    value = jax.device_put(value, device)
            copies.append(Parameter(value) if isinstance(leaf, Parameter) else value)
            if _is_array(leaf):
                made[id(leaf)] = copies[-1]
        self.module = jax.tree_util.tree_unflatten(self._treedef, copies)
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers
        self.device = device
        # torch's buffer lives with the averaged copy (`device`)
        self.n_averaged = self._placed(jnp.asarray(0, jnp.int32))

    def _paths(self) -> list[str]:
        """Each leaf's path in the averaged copy, as torch's dotted names."""
        return [name or "<root>" for name, _ in named_leaves(self.module)]

    def update_parameters(self, model: Any) -> None:
        """Fold `model`'s current values into the average (torch: `update_parameters`).

        The first call copies the values; each later one averages them in,
        and `n_averaged` grows by one. Every value (the model's, and what the
        averaging function returns) is checked before any is written, so an
        update that raises changes nothing.

        Args:
          model: the live model, a pytree shaped like the one the average was
            made from.

        Raises:
          ValueError: `model` is not structured like the averaged copy, a
            Parameter of the copy is not one in `model` (or a tied one is two
            different Parameters there), or a value (the
            model's or the averaging function's) has a shape that does not
            broadcast to the averaged array's; `multi_avg_fn` returned a
            list of the wrong length.
          TypeError: an averaging function returned something that is not an
            array (`None`: lucid's `multi_avg_fn` returns the new values).

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.swa_utils import AveragedModel
          >>> w = lucid.Parameter(jnp.zeros(2))
          >>> swa = AveragedModel([w])
          >>> swa.update_parameters([lucid.Parameter(jnp.zeros(3))])
          Traceback (most recent call last):
          ...
          ValueError: the model's value for 0 has shape (3,), which does not fit ...
        """
        model_leaves, treedef = jax.tree_util.tree_flatten(model, is_leaf=_is_parameter)
        if treedef != self._treedef:
            raise ValueError(
                f"update_parameters: the model's structure {treedef} differs from the "
                f"averaged copy's {self._treedef}"
            )
        own_leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        paths = self._paths()
        for path, own, theirs in zip(paths, own_leaves, model_leaves):
            if isinstance(own, Parameter) and not isinstance(theirs, Parameter):
                raise ValueError(
                    f"update_parameters: {path} is a Parameter in the averaged copy, but "
                    f"the model holds a {type(theirs).__name__} there"
                )
        ties = self._ties(own_leaves, model_leaves, paths)
        positions = [
            i
            for i in ties
            if isinstance(own_leaves[i], Parameter)
            or (self.use_buffers and isinstance(own_leaves[i], jax.Array | np.ndarray))
        ]
        averaged = [_value(own_leaves[i]) for i in positions]
        current = []
        for i, like in zip(positions, averaged):
            value = _value(model_leaves[i])
            _fitted(value, like, paths[i], "the model's value")  # checked before averaging
            current.append(self._placed(jnp.asarray(value)))
        n = self.n_averaged
        if int(n) == 0:
            results = current
        elif self.multi_avg_fn is not None:
            results = self.multi_avg_fn(list(averaged), list(current), n)
            if not isinstance(results, list | tuple):
                raise TypeError(
                    "multi_avg_fn must return the new averaged values, a list of arrays, but "
                    f"returned {type(results).__name__} (torch's updates them in place; JAX "
                    "arrays cannot be)"
                )
            if len(results) != len(averaged):
                raise ValueError(
                    f"multi_avg_fn returned {len(results)} arrays for {len(averaged)} averaged ones"
                )
        else:  # torch's default off CUDA is the one-array SWA, one parameter at a time
            avg_fn = self.avg_fn or get_swa_avg_fn()
            results = [avg_fn(a, c, n) for a, c in zip(averaged, current)]
        what = "the model's value" if int(n) == 0 else "the averaging function's result"
        new = {
            i: _fitted(result, like, paths[i], what)
            for i, like, result in zip(positions, averaged, results)
        }
        if not self.use_buffers:  # torch keeps the buffers in sync with the model's
            for i, leaf in enumerate(own_leaves):
                if not isinstance(leaf, Parameter) and isinstance(leaf, jax.Array | np.ndarray):
                    value = self._placed(jnp.asarray(_value(model_leaves[i])))
                    new[i] = _fitted(value, jnp.asarray(leaf), paths[i], "the model's buffer")
        for i, value in new.items():  # everything checked: write (a tie's every place)
            if isinstance(own_leaves[i], Parameter):
                own_leaves[i].data = value
            else:
                for j in ties.get(i, [i]):
                    own_leaves[j] = value
        self.module = jax.tree_util.tree_unflatten(self._treedef, own_leaves)
        self.n_averaged = n + 1

    @staticmethod
    def _ties(own_leaves: list, model_leaves: list, paths: list[str]) -> dict[int, list[int]]:
        """The averaged copy's array leaves, each once (as torch's `parameters()` and
        `buffers()` yield a tied one once): `{first position: every position}`.

        Raises:
          ValueError: a Parameter the copy holds in several places (tied, as in the
            model it was made from) is not one Parameter in ``model_leaves``.
        """
        ties: dict[int, list[int]] = {}
        first: dict[int, int] = {}
        for i, leaf in enumerate(own_leaves):
            if not _is_array(leaf):
                continue
            j = first.setdefault(id(leaf), i)
            ties.setdefault(j, []).append(i)
            if j != i and isinstance(leaf, Parameter) and model_leaves[i] is not model_leaves[j]:
                raise ValueError(
                    f"update_parameters: {paths[j]} and {paths[i]} are one Parameter in the "
                    "averaged copy (tied, as in the model it was made from), but the model "
                    "holds two different Parameters there; tie them in the model, or make "
                    "the AveragedModel from a model without the tie"
                )
        return ties

    def _placed(self, value: Array) -> Array:
        return value if self.device is None else jax.device_put(value, self.device)

    def _entries(self) -> dict[str, int]:
        """`{state_dict key: leaf position}` for the array leaves, keyed as torch's
        `AveragedModel.state_dict()` keys its module's entries (`module.<name>`)."""
        leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        entries: dict[str, int] = {}
        for i, (path, leaf) in enumerate(zip(self._paths(), leaves)):
            if not _is_array(leaf):
                continue
            key = f"module.{path}"
            if key in entries:
                raise ValueError(
                    f"two leaves of the averaged model are both named {key!r}: torch's "
                    "dotted names cannot tell them apart"
                )
            entries[key] = i
        return entries

    def state_dict(self) -> dict[str, Any]:
        """The averaged model's state, keyed as torch's `AveragedModel.state_dict()`.

        Each array leaf is named by its path in the pytree, as torch names a
        module's parameters and buffers: `{"w": ..., "layer": [a, b]}` gives
        `module.w`, `module.layer.0`, `module.layer.1`. A pytree keyed as a
        torch model's `named_parameters()` (and buffers) thus gives torch's
        keys, and `torch_averaged.load_state_dict(lucid.optim.to_torch(sd))`
        takes the result.

        Returns:
          `{"n_averaged": n, "module.<name>": value, ...}`.

        Raises:
          ValueError: two leaves have the same dotted name.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.swa_utils import AveragedModel
          >>> w = lucid.Parameter(jnp.array([1.0]))
          >>> swa = AveragedModel({"layer": {"weight": w}})
          >>> swa.update_parameters({"layer": {"weight": w}})
          >>> sd = swa.state_dict()
          >>> sorted(sd), int(sd["n_averaged"]), sd["module.layer.weight"].tolist()
          (['module.layer.weight', 'n_averaged'], 1, [1.0])
        """
        leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        state: dict[str, Any] = {"n_averaged": self.n_averaged}
        for key, i in self._entries().items():
            state[key] = _value(leaves[i])
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state_dict of [state_dict][lucid.optim.swa_utils.AveragedModel.state_dict]
        or of torch's `AveragedModel` (checked first: all or nothing).

        As torch's strict `load_state_dict`: the keys must be exactly this
        model's, each value of the same shape; values are cast to the averaged
        arrays' dtypes. torch tensors (bfloat16 included) are read as arrays.
        The positional form of earlier lucid versions
        (`{"module": [value, ...], "n_averaged": n}`) loads too.

        Args:
          state_dict: `{"n_averaged": n, "module.<name>": value, ...}`.

        Raises:
          RuntimeError: missing or unexpected keys, a shape that does not
            fit, or an `n_averaged` that is not a non-negative integer (torch
            raises `RuntimeError` for a module's state_dict too).

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> from lucid.optim.swa_utils import AveragedModel
          >>> w = lucid.Parameter(jnp.zeros(2))
          >>> swa = AveragedModel({"w": w})
          >>> swa.load_state_dict({"n_averaged": 3, "module.w": jnp.array([1.0, 2.0])})
          >>> swa.module["w"].data.tolist(), int(swa.n_averaged)
          ([1.0, 2.0], 3)
        """
        if not isinstance(state_dict, Mapping):
            raise RuntimeError(
                f"an AveragedModel state_dict must be a dict, but got {type(state_dict).__name__}"
            )
        leaves = jax.tree_util.tree_flatten(self.module, is_leaf=_is_parameter)[0]
        entries = self._entries()
        if isinstance(state_dict.get("module"), list | tuple):  # earlier lucid: positional
            saved_list = list(state_dict["module"])
            if len(saved_list) != len(leaves):
                raise RuntimeError(
                    "Error(s) in loading state_dict for AveragedModel:\n\tthe positional "
                    f"state_dict's 'module' holds {len(saved_list)} values, the averaged "
                    f"model has {len(leaves)} leaves."
                )
            saved = {
                key: saved_list[i] for key, i in entries.items()
            }  # non-array leaves were saved as they were; they are not loaded
            saved["n_averaged"] = state_dict.get("n_averaged")
        else:
            saved = dict(state_dict)
        errors = []
        missing = [k for k in ["n_averaged", *entries] if k not in saved]
        unexpected = [k for k in saved if k != "n_averaged" and k not in entries]
        # torch's words (`nn.Module.load_state_dict`), a shape shown as a tuple
        if missing:
            errors.append(f"Missing key(s) in state_dict: {_keys(missing)}. ")
        if unexpected:
            errors.append(f"Unexpected key(s) in state_dict: {_keys(unexpected)}. ")
        values: dict[int, Array] = {}
        for key, i in entries.items():
            if key not in saved:
                continue
            value = _host(saved[key])
            like = _value(leaves[i])
            if value.shape != tuple(like.shape):
                errors.append(
                    f"size mismatch for {key}: copying a param with shape {value.shape} from "
                    f"checkpoint, the shape in current model is {tuple(like.shape)}."
                )
                continue
            values[i] = jnp.asarray(value).astype(like.dtype)
        n_averaged = None
        if "n_averaged" in saved:
            n = _host(saved["n_averaged"])
            if n.shape != () or not np.issubdtype(n.dtype, np.integer) or int(n) < 0:
                errors.append(
                    f"n_averaged must be a non-negative integer, but the state_dict holds {n!r}."
                )
            else:
                n_averaged = jnp.asarray(int(n), jnp.int32)
        if errors:
            raise RuntimeError(
                "Error(s) in loading state_dict for AveragedModel:\n\t" + "\n\t".join(errors)
            )
        for i, value in values.items():
            if isinstance(leaves[i], Parameter):
                leaves[i].data = self._placed(value)
            else:
                leaves[i] = self._placed(value)
        self.module = jax.tree_util.tree_unflatten(self._treedef, leaves)
        self.n_averaged = self._placed(n_averaged)


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
        param_groups_of(optimizer, "SWALR")  # torch's AttributeError for anything else
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
