"""torch optimizer checkpoints matched by parameter name, with per-parameter layouts.

A model ported from torch to flax.nnx or equinox keeps torch's weights in other
layouts: an nnx `Linear` kernel is torch's weight transposed, an equinox conv
bias is `(out, 1, 1)` where torch's is `(out,)`, and its parameters come in
another order. `from_torch` reads a torch optimizer's state_dict into the order
and layouts of a lucid optimizer with named parameters (torch's `param_names`,
or the names given for a checkpoint without them, and a renaming), applying a
`StateLayout` declared once per parameter to every state entry of that
parameter's shape; `to_torch_by_name` is its inverse. A parameter whose shape
has axes of equal length (a square weight) loads the same way whether or not
lucid's array is torch's transposed, so its layout must be declared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._arrays import to_array
from ._torch_format import to_torch

Array = np.ndarray


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """How one parameter's arrays are laid out in lucid relative to torch.

    Applied to the parameter's state entries of its own shape (moments,
    momentum buffers); 0-d entries (`step`) are left as they are.

    Attributes:
      to_lucid: `to_lucid(torch_array) -> lucid_array`.
      to_torch: the inverse, `to_torch(lucid_array) -> torch_array`.

    Examples:
      >>> import numpy as np, lucid
      >>> layout = lucid.optim.StateLayout.transpose()  # an nnx kernel is torch's weight.T
      >>> layout.to_lucid(np.zeros((4, 3))).shape, layout.to_torch(np.zeros((3, 4))).shape
      ((3, 4), (4, 3))
    """

    to_lucid: Callable[[Array], Array]
    to_torch: Callable[[Array], Array]

    @classmethod
    def identity(cls) -> StateLayout:
        """lucid's array is torch's as it is (equinox keeps torch's `Linear` and `Conv`
        layouts; a model built from torch's own arrays does too).

        Returns:
          The layout.

        Examples:
          >>> import numpy as np, lucid
          >>> lucid.optim.StateLayout.identity().to_lucid(np.zeros((3, 3))).shape
          (3, 3)
        """
        return cls(np.asarray, np.asarray)

    @classmethod
    def transpose(cls, axes: Sequence[int] | None = None) -> StateLayout:
        """lucid's array is torch's transposed (`axes` as for `np.transpose`; reversed
        by default).

        Args:
          axes: the permutation taking torch's axes to lucid's, or `None` to reverse.

        Returns:
          The layout.
        """
        order = None if axes is None else tuple(axes)
        inverse = None if order is None else tuple(np.argsort(order))
        return cls(lambda a: np.transpose(a, order), lambda a: np.transpose(a, inverse))

    @classmethod
    def reshape(cls, lucid_shape: Sequence[int], torch_shape: Sequence[int]) -> StateLayout:
        """lucid's array is torch's reshaped (an equinox conv bias `(out, 1, 1)` for
        torch's `(out,)`).

        Args:
          lucid_shape: the parameter's shape in lucid.
          torch_shape: its shape in torch.

        Returns:
          The layout.
        """
        ours, theirs = tuple(lucid_shape), tuple(torch_shape)
        return cls(lambda a: np.reshape(a, ours), lambda a: np.reshape(a, theirs))


def _names_of(group: Mapping[str, Any], where: str) -> list[str]:
    names = group.get("param_names")
    if names is None:
        raise ValueError(
            f"{where}: matching by name needs named parameters (`param_names` in every "
            "group: build the optimizer from (name, Parameter) pairs, or from "
            "lucid.named_parameters)"
        )
    return list(names)


def _torch_names(groups: Sequence[Mapping[str, Any]], names: Sequence[str] | None) -> list:
    """Each torch group's parameter names: its `param_names`, or its share of ``names``
    (torch's names in the order its optimizer listed them, one group after another)."""
    counts = [len(group["params"]) for group in groups]
    saved = [group.get("param_names") for group in groups]
    if names is None:
        if any(group_names is None for group_names in saved):
            raise ValueError(
                "the torch state_dict's groups have no `param_names`: torch saves them only "
                "for an optimizer built from (name, parameter) pairs, and most code (nanoGPT's "
                "included) passes the parameters alone. Pass names=, torch's parameter names "
                "in the order its optimizer listed them: names=[n for n, _ in "
                "model.named_parameters()] for torch.optim.AdamW(model.parameters()); for "
                "several groups, each group's names, one group after another"
            )
        return [list(group_names) for group_names in saved]  # type: ignore[arg-type]
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError("names must be a sequence of torch's parameter names (strings)")
    names = list(names)
    if len(names) != sum(counts):
        raise ValueError(
            f"names holds {len(names)} names, but the torch state_dict's groups list "
            f"{sum(counts)} parameters ({counts} by group): give one name per parameter, in "
            "the order torch's optimizer listed them"
        )
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"names lists {twice} more than once")
    split, start = [], 0
    for count, group_names in zip(counts, saved):
        mine = names[start : start + count]
        start += count
        if group_names is not None and list(group_names) != mine:
            raise ValueError(
                f"names gives {mine}, but the torch state_dict's group saved the names "
                f"{list(group_names)}: leave names out, or give the saved ones"
            )
        split.append(mine)
    return split


def _repeats(shape: tuple) -> bool:
    """Whether ``shape`` has two or more axes of equal length (a square weight): torch's
    array and its transpose then have the same shape."""
    return len(shape) >= 2 and len(set(shape)) < len(shape)


def _ambiguous(entry: Mapping[str, Any], shape: tuple | None) -> tuple | None:
    """The shape that makes a missing layout ambiguous for one parameter's state entry,
    or ``None``: the parameter's ``shape`` when its axes repeat and the entry holds an
    array (Adafactor's factored moments too); without the parameter's shape (a lucid
    state_dict alone), the shape of an entry array whose axes repeat."""
    shapes = [tuple(getattr(to_array(value), "shape", ())) for value in entry.values()]
    if shape is not None:
        return shape if _repeats(shape) and any(shapes) else None
    return next((found for found in shapes if _repeats(found)), None)


def _undeclared(name: str, shape: tuple) -> ValueError:
    return ValueError(
        f"{name!r} has shape {shape}, with axes of equal length: its state loads the same "
        "way whether lucid's array is torch's as it is or transposed (an nnx kernel is "
        "torch's weight transposed), so a forgotten layout would load its moments "
        "transposed without a word. Say which: layouts={"
        f"{name!r}: StateLayout.transpose()}} (or StateLayout.identity(), or the axes "
        "of your layout), or default_layout= for every parameter without a layout"
    )


def _convert(entry: Mapping[str, Any], layout: Any, shape: tuple, name: str, way: str) -> dict:
    """One parameter's entry with ``layout`` applied to each array of the parameter's
    (pre-conversion) shape."""
    out = {}
    for key, value in entry.items():
        array = to_array(value)
        if layout is not None and getattr(array, "ndim", 0) > 0:
            try:
                moved = np.asarray(getattr(layout, way)(np.asarray(array)))
            except (ValueError, TypeError) as error:  # a reshape or transpose that cannot be
                raise ValueError(
                    f"state {key!r} of {name!r}: its layout does not apply to shape "
                    f"{tuple(array.shape)} ({error})"
                ) from None
            if way == "to_lucid" and tuple(moved.shape) != tuple(shape):
                raise ValueError(
                    f"state {key!r} of {name!r}: its layout gives shape {tuple(moved.shape)}, "
                    f"but the lucid parameter's is {tuple(shape)}"
                )
            out[key] = moved
        else:
            out[key] = value
    return out


def from_torch(
    state_dict: Mapping[str, Any],
    optimizer: Any,
    *,
    names: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None,
    layouts: Mapping[str, StateLayout] | None = None,
    default_layout: StateLayout | None = None,
) -> dict[str, Any]:
    """A torch optimizer's state_dict in the order and layouts of a lucid optimizer.

    Parameters are matched by name, not position: torch's names (its
    `param_names`, which torch >= 2.6 saves for an optimizer built from
    `(name, parameter)` pairs, or `names`), renamed by `rename`, against the
    lucid optimizer's `param_names`; groups by position. Each parameter's
    entries of its torch shape go through its `layouts` entry (or
    `default_layout`). The result is what `optimizer.load_state_dict` takes
    (which then checks everything as for any checkpoint).

    A parameter whose state has the lucid parameter's shape, with axes of
    equal length (a square weight), loads the same way whether or not lucid's
    array is torch's transposed: without a layout for it, `from_torch` refuses
    rather than guess (a rectangular one without its layout fails the load's
    shape check).

    Args:
      state_dict: a torch optimizer's `state_dict()` (tensors or arrays).
      optimizer: the lucid optimizer (or CompiledOptimizer), built with named
        parameters.
      names: torch's parameter names, for a state_dict whose groups have no
        `param_names` (an optimizer built from `model.parameters()`, as most
        code does): one per parameter, in the order torch's optimizer listed
        them, one group after another (`[n for n, _ in
        model.named_parameters()]` for `AdamW(model.parameters())`). Where the
        groups have `param_names`, `names` must equal them.
      rename: torch's name -> lucid's, for the names that differ.
      layouts: torch's name -> the `StateLayout` of that parameter.
      default_layout: the layout of every parameter not in `layouts`
        (`StateLayout.identity()` for a model kept in torch's layouts).

    Returns:
      A state_dict for `optimizer`, arrays as NumPy.

    Raises:
      ValueError: unnamed parameters (the message says how to give torch's
        names), `names` of the wrong length or other than the saved ones, a
        different number of groups, names that do not correspond one to one, a
        layout that does not give the lucid parameter's shape, or a parameter
        with axes of equal length and no layout (each message names the
        parameter).
      TypeError: `names` is not a sequence of strings.

    Examples:
      >>> import numpy as np, torch, jax.numpy as jnp, lucid
      >>> tw = torch.nn.Parameter(torch.ones(4, 3))  # torch's Linear weight (out, in)
      >>> topt = torch.optim.Adam([("fc.weight", tw)], lr=0.1)
      >>> tw.grad = torch.ones(4, 3); topt.step()
      >>> kernel = lucid.Parameter(jnp.ones((3, 4)))  # an nnx kernel (in, out)
      >>> opt = lucid.optim.Adam([("fc.kernel", kernel)], lr=0.1)
      >>> sd = lucid.optim.from_torch(
      ...     topt.state_dict(), opt, rename={"fc.weight": "fc.kernel"},
      ...     layouts={"fc.weight": lucid.optim.StateLayout.transpose()})
      >>> opt.load_state_dict(sd)
      >>> opt.state[kernel]["exp_avg"].shape
      (3, 4)
    """
    rename = dict(rename or {})
    layouts = dict(layouts or {})
    ours = optimizer.param_groups
    theirs = state_dict["param_groups"]
    if len(theirs) != len(ours):
        raise ValueError(
            f"the torch state_dict has {len(theirs)} parameter groups, the optimizer {len(ours)}"
        )
    position: dict[str, int] = {}
    shapes: dict[str, tuple] = {}
    for group in ours:
        for name, p in zip(_names_of(group, "the lucid optimizer"), group["params"]):
            position[name] = len(position)
            shapes[name] = tuple(p.shape)
    by_group = _torch_names(theirs, names)
    unknown = set(layouts) - {n for group_names in by_group for n in group_names}
    if unknown:
        raise ValueError(f"layouts for names the torch state_dict does not have: {sorted(unknown)}")
    state: dict[Any, Any] = {}
    groups = []
    for index, (group, saved, torch_names) in enumerate(zip(ours, theirs, by_group)):
        targets = [rename.get(n, n) for n in torch_names]
        mine = _names_of(group, "the lucid optimizer")
        if sorted(targets) != sorted(mine):
            missing, extra = sorted(set(mine) - set(targets)), sorted(set(targets) - set(mine))
            raise ValueError(
                f"group {index}: the names do not correspond (lucid's without a torch "
                f"counterpart: {missing}; torch's, renamed, without a lucid one: {extra})"
            )
        for torch_id, torch_name, name in zip(saved["params"], torch_names, targets):
            entry = state_dict["state"].get(torch_id)
            if entry:
                layout = layouts.get(torch_name, default_layout)
                if layout is None and (square := _ambiguous(entry, shapes[name])) is not None:
                    raise _undeclared(torch_name, square)
                state[position[name]] = _convert(entry, layout, shapes[name], name, "to_lucid")
        options = {k: v for k, v in saved.items() if k not in ("params", "param_names")}
        groups.append({**options, "params": [position[n] for n in mine], "param_names": mine})
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def to_torch_by_name(
    state_dict: Mapping[str, Any],
    *,
    rename: Mapping[str, str] | None = None,
    layouts: Mapping[str, StateLayout] | None = None,
    default_layout: StateLayout | None = None,
) -> dict[str, Any]:
    """A named lucid optimizer's state_dict in torch's names and layouts, as tensors.

    The inverse of [from_torch][lucid.optim.from_torch] with the same `rename`
    and `layouts` (keyed by torch's names): each group's `param_names` become
    torch's, each parameter's entries go through its layout's `to_torch`, and
    the arrays become tensors ([to_torch][lucid.optim.to_torch]). torch's
    `load_state_dict` matches parameters by position, so build the torch
    optimizer with its named parameters in the order the result's
    `param_names` list them (the lucid optimizer's order).

    As for `from_torch`, a state entry with axes of equal length (a square
    weight's moments) needs its layout declared: it would go to torch the same
    way transposed or not.

    Args:
      state_dict: the lucid optimizer's `state_dict()` (named parameters).
      rename: torch's name -> lucid's, as given to `from_torch`.
      layouts: torch's name -> `StateLayout`, as given to `from_torch`.
      default_layout: the layout of every parameter not in `layouts`, as given
        to `from_torch`.

    Returns:
      The state_dict torch's optimizer takes.

    Raises:
      ValueError: unnamed parameters, or a state entry with axes of equal length
        whose parameter has no layout (the message names it).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> kernel = lucid.Parameter(jnp.ones((3, 4)))
      >>> opt = lucid.optim.Adam([("fc.kernel", kernel)], lr=0.1)
      >>> kernel.grad = jnp.ones((3, 4)); opt.step()
      >>> sd = lucid.optim.to_torch_by_name(
      ...     opt.state_dict(), rename={"fc.weight": "fc.kernel"},
      ...     layouts={"fc.weight": lucid.optim.StateLayout.transpose()})
      >>> sd["param_groups"][0]["param_names"], tuple(sd["state"][0]["exp_avg"].shape)
      (['fc.weight'], (4, 3))
    """
    back = {lucid: torch for torch, lucid in (rename or {}).items()}
    layouts = dict(layouts or {})
    state: dict[Any, Any] = dict(state_dict["state"])
    groups = []
    for group in state_dict["param_groups"]:
        names = [back.get(n, n) for n in _names_of(group, "the state_dict")]
        for index, name in zip(group["params"], names):
            if state.get(index):
                layout = layouts.get(name, default_layout)
                if layout is None and (square := _ambiguous(state[index], None)) is not None:
                    raise _undeclared(name, square)
                state[index] = _convert(state[index], layout, (), name, "to_torch")
        groups.append({**group, "param_names": names})
    return to_torch({"state": state, "param_groups": groups})
