"""Where arrays live, for the few places lucid meets arrays of several device domains.

Arrays committed to different devices (a parameter sharded over a mesh, another
on one device) cannot meet in one jitted call. lucid's steps already run one
call per device domain (`lucid._arrays.device_domain`); what is here serves the
rest: a gradient assigned on other devices than its parameter's is refused as
torch refuses it, and the operations that combine every gradient (clipping's
total norm, a fused step's `grad_transform`) group them by domain as torch's
clipping groups tensors by device.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from ._arrays import device_domain

Array = jax.Array


def by_domain(arrays: list[Any]) -> list[list[int]]:
    """The positions of ``arrays`` grouped by device domain, the groups in order of first
    appearance; arrays committed nowhere join the first group (jit places them there)."""
    groups: dict[Hashable, list[int]] = {}
    loose = []
    for i, array in enumerate(arrays):
        domain = device_domain(array)
        if domain is None:
            loose.append(i)
        else:
            groups.setdefault(domain, []).append(i)
    if not groups:
        return [loose]
    ordered = list(groups.values())
    ordered[0] = sorted(ordered[0] + loose)
    return ordered


def replicated(array: Array) -> Any:
    """A sharding that holds a whole (e.g. 0-d) array on every device ``array`` lives on,
    in ``array``'s device order, so the two can meet in one jitted call."""
    sharding = array.sharding
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    devices = sharding.device_set
    if len(devices) == 1:
        return SingleDeviceSharding(next(iter(devices)))
    # jax's own shardings over several devices are NamedShardings; another (an old jax's
    # GSPMDSharding output) is taken to order its devices by id, as `jax.devices()` does
    order = sorted(devices, key=lambda d: d.id)
    return NamedSharding(Mesh(np.array(order), ("devices",)), PartitionSpec())


def described(array: Any) -> str:
    """Where ``array`` lives, in words: ``cpu:3``, ``mesh ('data': 8) as P('data')``..."""
    if not isinstance(array, jax.Array):
        return f"a {type(array).__name__} (host memory)"
    if not getattr(array, "committed", True):
        return "no device in particular (an uncommitted array)"
    sharding = array.sharding
    if isinstance(sharding, NamedSharding):
        axes = ", ".join(f"'{name}': {size}" for name, size in sharding.mesh.shape.items())
        return f"mesh ({axes}) as {sharding.spec}"
    ids = sorted(sharding.device_set, key=lambda d: d.id)
    shown = ", ".join(f"{d.platform}:{d.id}" for d in ids)
    return shown if len(ids) == 1 else f"devices [{shown}]"


def check_grad_placement(param: Any, grad: Array) -> None:
    """torch's refusal of a gradient assigned on other devices than its parameter's.

    Only committed arrays on different device sets are refused: an uncommitted array
    (made without `jax.device_put`) goes wherever the step runs, and the same devices
    under another sharding meet in one call.

    Raises:
      RuntimeError: ``grad`` and ``param``'s value are committed to different devices;
        the message names both placements and the fix (`jax.device_put`).
    """
    held = param.location[0].buffer  # the storage's own array(s): no slice is cut
    if not isinstance(held, jax.Array):
        leaves = jax.tree_util.tree_leaves(held)
        if not leaves:
            return
        held = leaves[0]
    if held.sharding.device_set == grad.sharding.device_set or not held.committed:
        return
    raise RuntimeError(
        f"attempting to assign a gradient on {described(grad)} to a parameter of shape "
        f"{tuple(param.shape)} on {described(held)}. Please ensure that the gradient and "
        "the tensor are on the same device: put it where the parameter is, "
        "`p.grad = jax.device_put(grad, p.data.sharding)`"
    )


def on_one_domain(
    update: Callable[[Any, Any, Any], tuple[Any, Any]],
    grads: list[Array],
    state: Any,
    params: list[Array],
) -> tuple[list[Array], Any]:
    """``update(grads, state, params)`` (an optax transform's) over gradients that may
    live on several device domains.

    On one domain it is the call itself. Otherwise every array off the domain holding
    the most gradient bytes is copied there, replicated (a sharded gradient stays
    sharded: it is never gathered), the update runs there, and each new gradient goes
    back where its gradient was; the new state stays on that domain.
    """
    groups = by_domain(grads)
    if len(groups) < 2:
        return update(grads, state, params)
    main = max(groups, key=lambda group: sum(grads[i].nbytes for i in group))
    home = device_domain(grads[main[0]])
    target = replicated(grads[main[0]])

    def moved(tree: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda x: (
                jax.device_put(x, target)
                if isinstance(x, jax.Array) and device_domain(x) not in (home, None)
                else x
            ),
            tree,
        )

    new, state = update(moved(grads), moved(state), moved(params))
    if isinstance(new, list | tuple) and len(new) == len(grads):  # else refused by the caller
        new = [
            jax.device_put(n, g.sharding) if isinstance(n, jax.Array) else n
            for n, g in zip(new, grads)
        ]
    return new, state
