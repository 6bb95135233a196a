"""torch optimizer checkpoints matched by parameter name, with per-parameter layouts.

A model ported from torch to flax.nnx or equinox keeps torch's weights in other
layouts: an nnx `Linear` kernel is torch's weight transposed, an equinox conv
bias is `(out, 1, 1)` where torch's is `(out,)`, and its parameters come in
another order. `from_torch` reads a torch optimizer's state_dict into the order
and layouts of a lucid optimizer with named parameters (torch's `param_names`,
or a renaming), applying a `StateLayout` declared once per parameter to every
state entry of that parameter's shape; `to_torch_by_name` is its inverse.
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
    rename: Mapping[str, str] | None = None,
    layouts: Mapping[str, StateLayout] | None = None,
) -> dict[str, Any]:
    """A torch optimizer's state_dict in the order and layouts of a lucid optimizer.

    Parameters are matched by name, not position: torch's `param_names`
    (torch >= 2.6 saves them for named parameters), renamed by `rename`,
    against the lucid optimizer's `param_names`; groups by position. Each
    parameter's entries of its torch shape go through its `layouts` entry.
    The result is what `optimizer.load_state_dict` takes (which then checks
    everything as for any checkpoint).

    Args:
      state_dict: a torch optimizer's `state_dict()` (tensors or arrays).
      optimizer: the lucid optimizer (or CompiledOptimizer), built with named
        parameters.
      rename: torch's name -> lucid's, for the names that differ.
      layouts: torch's name -> the `StateLayout` of that parameter.

    Returns:
      A state_dict for `optimizer`, arrays as NumPy.

    Raises:
      ValueError: unnamed parameters, a different number of groups, or names
        that do not correspond one to one, or a layout that does not give the
        lucid parameter's shape (the message names the parameter).

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
    unknown = set(layouts) - {n for g in theirs for n in _names_of(g, "the torch state_dict")}
    if unknown:
        raise ValueError(f"layouts for names the torch state_dict does not have: {sorted(unknown)}")
    state: dict[Any, Any] = {}
    groups = []
    for index, (group, saved) in enumerate(zip(ours, theirs)):
        torch_names = _names_of(saved, "the torch state_dict")
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
                layout = layouts.get(torch_name)
                state[position[name]] = _convert(entry, layout, shapes[name], name, "to_lucid")
        options = {k: v for k, v in saved.items() if k not in ("params", "param_names")}
        groups.append({**options, "params": [position[n] for n in mine], "param_names": mine})
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def to_torch_by_name(
    state_dict: Mapping[str, Any],
    *,
    rename: Mapping[str, str] | None = None,
    layouts: Mapping[str, StateLayout] | None = None,
) -> dict[str, Any]:
    """A named lucid optimizer's state_dict in torch's names and layouts, as tensors.

    The inverse of [from_torch][lucid.optim.from_torch] with the same `rename`
    and `layouts` (keyed by torch's names): each group's `param_names` become
    torch's, each parameter's entries go through its layout's `to_torch`, and
    the arrays become tensors ([to_torch][lucid.optim.to_torch]). torch's
    `load_state_dict` matches parameters by position, so build the torch
    optimizer with its named parameters in the order the result's
    `param_names` list them (the lucid optimizer's order).

    Args:
      state_dict: the lucid optimizer's `state_dict()` (named parameters).
      rename: torch's name -> lucid's, as given to `from_torch`.
      layouts: torch's name -> `StateLayout`, as given to `from_torch`.

    Returns:
      The state_dict torch's optimizer takes.

    Raises:
      ValueError: unnamed parameters.

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
                state[index] = _convert(state[index], layouts.get(name), (), name, "to_torch")
        groups.append({**group, "param_names": names})
    return to_torch({"state": state, "param_groups": groups})
