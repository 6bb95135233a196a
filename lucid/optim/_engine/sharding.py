"""Where arrays live, and the one rule for sharding optimizer state over a mesh axis.

`placement` says which parameters can share a flat buffer. The state-sharding
rule (ZeRO-1) is written once here and read by the compiled backend (which keeps
state so) and by `lucid.optim.checkpoint` (which restores it so): the state of a
parameter *replicated* over a mesh is sharded along its first axis over
``shard_state_over``; a parameter sharded already keeps state shaped as itself.

Elementwise rules keep such state in flat buffers, padded and cut in equal pieces.
A rule over whole parameters (``elementwise=False``: bitsandbytes' and torchao's
block-wise quantized state, Adafactor, Muon...) keeps each parameter alone: with
`RowShard`, its program cuts the parameter, its gradient and every state array
along their first axis (`state_entry_sharding`, where that axis divides evenly),
so each device updates its rows and keeps their state; XLA's partitioner does the
rest (a reduction over the parameter, a quantization block that straddles two
devices' rows).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

Axes = str | tuple[str, ...]


def placement(array: jax.Array) -> tuple[Any, int, Any]:
    """Where ``array`` lives, as ``(key, rows, buffer sharding)``.

    Arrays with equal keys can share a buffer: arrays on one device (``rows``
    1, no sharding to impose); arrays replicated over the same devices; arrays
    sharded along their first axis only, over the same mesh axes, with that
    axis divisible by the number of shards (``rows``). Any other sharding gets
    a key of its own (``None``): that parameter keeps its own arrays.
    """
    sharding = getattr(array, "sharding", None)
    if sharding is None or len(sharding.device_set) == 1:
        devices = None if sharding is None else tuple(sorted(d.id for d in sharding.device_set))
        return ("device", devices), 1, None
    if not isinstance(sharding, NamedSharding):
        return None, 1, None
    spec = tuple(sharding.spec) + (None,) * (array.ndim - len(sharding.spec))
    if any(entry is not None for entry in spec[1:]):
        return None, 1, None
    mesh, first = sharding.mesh, spec[0] if spec else None
    if first is None:
        return ("replicated", mesh), 1, NamedSharding(mesh, PartitionSpec())
    axes = first if isinstance(first, tuple) else (first,)
    rows = int(np.prod([mesh.shape[a] for a in axes]))
    if array.shape[0] % rows:
        return None, 1, None
    return ("rows", mesh, first), rows, NamedSharding(mesh, PartitionSpec(first, None))


def _named(axes: Axes) -> tuple[str, ...]:
    return axes if isinstance(axes, tuple) else (axes,)


def sharded_state(mesh: Any, axes: Axes) -> NamedSharding:
    """The sharding of the state of parameters replicated over ``mesh``: along the
    first axis, over ``axes``.

    Raises:
      ValueError: ``mesh`` has no such axis.
    """
    unknown = [a for a in _named(axes) if a not in mesh.axis_names]
    if unknown:
        raise ValueError(
            f"shard_state_over={axes!r}: the parameters are replicated over a mesh with "
            f"axes {tuple(mesh.axis_names)}, which has no axis {unknown[0]!r}"
        )
    return NamedSharding(mesh, PartitionSpec(axes))


def shard_count(sharding: Any) -> int:
    """How many pieces ``sharding`` cuts a 1-D buffer into (1 for None)."""
    if sharding is None:
        return 1
    first = sharding.spec[0]
    return int(np.prod([sharding.mesh.shape[a] for a in _named(first)]))


def state_entry_sharding(param_sharding: Any, shape: tuple[int, ...], axes: Axes | None) -> Any:
    """Where one state entry of a parameter placed by ``param_sharding`` lives: sharded
    over ``axes`` when the parameter is replicated over a mesh with those axes and the
    entry's first axis divides evenly, else as the parameter (0-d entries replicated)."""
    if not isinstance(param_sharding, NamedSharding):
        return SingleDeviceSharding(next(iter(param_sharding.device_set)))
    mesh = param_sharding.mesh
    if not shape:
        return NamedSharding(mesh, PartitionSpec())
    replicated = axes is not None and param_sharding.is_fully_replicated
    if replicated and all(a in mesh.axis_names for a in _named(axes)):
        state = NamedSharding(mesh, PartitionSpec(axes))
        if shape[0] % shard_count(state) == 0:
            return state
    return param_sharding


class RowShard(NamedTuple):
    """How a program shards a replicated parameter whose rule is not elementwise, and
    its state (hashable: part of a program's key).

    Attributes:
      whole: the parameter's sharding (replicated over a mesh); the new value is
        gathered back to it.
      axes: ``shard_state_over``: every array of the step whose first axis divides
        evenly over these mesh axes is cut along it (`state_entry_sharding`).
    """

    whole: NamedSharding
    axes: Axes

    def cut(self, array: jax.Array) -> jax.Array:
        """``array`` (traced) constrained to where its state lives: along its first axis
        over ``axes`` when that divides evenly, else replicated."""
        where = state_entry_sharding(self.whole, tuple(array.shape), self.axes)
        return jax.lax.with_sharding_constraint(array, where)
