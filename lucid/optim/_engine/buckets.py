"""Buckets: the compiled backend's parameters, grouped to share flat buffers.

A bucket is parameters of one param group, dtype and placement with identical
per-parameter scalar state (``step``, ``eta``...) whose gradients come and go
together; its values, gradients and state live in one `FlatStore`. A
parameter whose sharding no flat buffer can keep, or whose rule is not
elementwise, is a bucket alone; one held by another compiled optimizer's store
is *borrowed* (`Borrowed`): read and written through the Parameter, never moved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._arrays import device_domain
from ..._parameter import Parameter
from ..._platform import flat_blocks
from ..._storage import OwnArrays
from ...functional._apply import is_sparse
from ...functional.rule import Rule
from .flat_store import Borrowed, FlatStore, dense
from .pieces import free
from .sharding import Axes, RowShard, placement, sharded_state


@dataclasses.dataclass(eq=False)  # buckets compare by identity
class Bucket:
    """Parameters updated together, and their state laid out as their store's values.

    Attributes:
      store: where the values and gradients live.
      group: the position of the parameters' group.
      state: the rule's state NamedTuple (buffers and 0-d scalars); None before a step.
      domain: the devices it lives on (None: not committed to any).
      rows_over: for a parameter replicated over a mesh whose rule is not elementwise,
        with ``shard_state_over``: the replicated sharding and the axes its state is
        cut over along each array's first axis (`lucid.optim._engine.sharding.RowShard`);
        else None.
      flags: for a rule over blocks (`Execution.blocks`), the static options that differ
        from the group's for this bucket, as sorted ``(name, value)`` pairs.
    """

    store: FlatStore | Borrowed
    group: int
    state: Any
    domain: Any
    rows_over: RowShard | None = None
    flags: tuple = ()

    @property
    def partly(self) -> bool:
        """Some, not all, of the bucket's parameters have a gradient."""
        has = self.store.has_grad
        return bool(has.any()) and not bool(has.all())


class Entry(NamedTuple):
    """One parameter as the layout sees it."""

    param: Parameter
    group: int
    value: jax.Array
    grad: Any
    state: Any
    borrowed: bool


def entries(params_by_group: Sequence[Sequence[Parameter]], states: Mapping) -> list[Entry]:
    """Every parameter with its value, gradient and state (ours released first)."""
    found = []
    for index, params in enumerate(params_by_group):
        for p in params:
            storage = p.location[0]
            # in another live optimizer's store: borrowed; in our own, in a store whose
            # optimizer is gone, or in arrays of its own: taken over
            borrowed = not free(storage)
            grad = None if borrowed else p.grad
            found.append(Entry(p, index, p.data, grad, states.get(p), borrowed))
    return found


def _key(rule: Rule, entry: Entry, flags: Mapping[str, Any] | None, sharded: bool) -> tuple:
    """What parameters must share to share a bucket; a rule over blocks also keys by
    its block and flags (``flags``: the group's, if known; ``sharded``: state is
    sharded)."""
    if entry.borrowed:
        return ("borrowed", id(entry.param))
    state = entry.state
    if state is None:
        signature: Any = None
    else:
        signature = tuple(
            (name, None if value is None else float(value) if np.ndim(value) == 0 else "array")
            for name, value in zip(state._fields, state)
        )
    where = placement(entry.value)
    blocks: Any = (1, ())
    if not rule.execution.elementwise:
        # a rule over blocks of a flattened parameter may lay parameters of one
        # device (or replicated, with whole state) end to end, each of whole blocks
        found = None
        whole = where[0] is not None and where[1] == 1 and not sharded
        if flat_blocks(rule.execution) and flags is not None and whole:
            found = rule.execution.blocks(entry.value, flags, state)  # type: ignore[misc]
        # alone: a rule that reduces over each parameter (its state fields have
        # shapes of their own)
        blocks = (1, ()) if found is None else (found[0], tuple(sorted(found[1].items())))
        if found is None:
            where = (("alone", id(entry.param)), 1, None)
    elif where[0] is None:  # a sharding no flat buffer can keep
        where = (("alone", id(entry.param)), 1, None)
    return (entry.group, str(entry.value.dtype), where, signature, entry.grad is not None, blocks)


def build(
    rule: Rule,
    found: list[Entry],
    shard_state_over: Axes | None,
    flags: Sequence[Mapping[str, Any]] | None = None,
) -> list[Bucket]:
    """Lay ``found`` out into buckets and move the parameters into their stores
    (``flags``: each group's static options, which a rule over blocks reads to lay
    its parameters end to end; ``None``, not known yet: each parameter alone)."""
    keyed: dict[tuple, list[Entry]] = {}
    sharded = shard_state_over is not None
    for entry in found:
        group_flags = None if flags is None else flags[entry.group]
        keyed.setdefault(_key(rule, entry, group_flags, sharded), []).append(entry)
    buckets = []
    for key, members in keyed.items():
        first = members[0]
        rows_over = None
        if first.borrowed:
            store: Any = Borrowed(first.param)
        else:
            where, rows, sharding = key[2]
            state_sharding = None
            if shard_state_over is not None and where[0] == "replicated":
                state_sharding = sharded_state(where[1], shard_state_over)
            own, _, whole = placement(first.value)
            replicated = own is not None and own[0] == "replicated"
            if shard_state_over is not None and where[0] == "alone" and replicated:
                # a rule over whole parameters (block-wise state): cut by rows
                sharded_state(own[1], shard_state_over)  # checks the axes
                rows_over = RowShard(whole, shard_state_over)
            align, _ = key[5]  # a rule over blocks: every size a multiple of it
            store = FlatStore(
                [e.param for e in members],
                [e.value for e in members],
                where[0] != "alone",
                rows,
                sharding,
                state_sharding,
                align,
            )
            grads = [e.grad for e in members]
            if all(g is not None for g in grads):
                store.grads = store.like([jnp.asarray(dense(g), store.value_dtype) for g in grads])
                store.has_grad[:] = True
                store.sparse = {i: g for i, g in enumerate(grads) if is_sparse(g)}
        state = None
        if first.state is not None:
            state = type(first.state)(
                *(
                    None
                    if value is None
                    else jnp.array(value, copy=True)
                    if np.ndim(value) == 0
                    else store.like_state([getattr(e.state, name) for e in members])
                    for name, value in zip(first.state._fields, first.state)
                )
            )
        overrides = () if first.borrowed else key[5][1]
        domain = device_domain(first.value)
        buckets.append(Bucket(store, first.group, state, domain, rows_over, overrides))
    for bucket in buckets:
        if isinstance(bucket.store, FlatStore):
            for index, p in enumerate(bucket.store.params):
                p.relocate(bucket.store, index)
    return buckets


def release(buckets: list[Bucket]) -> None:
    """Give every parameter the buckets hold its value and gradient back as its own arrays."""
    for bucket in buckets:
        store = bucket.store
        if not isinstance(store, FlatStore):
            continue
        values = store.views(store.values)
        grads = store.views(store.grads) if store.grads is not None else [None] * len(values)
        for i, p in enumerate(store.params):
            if p is None or p.location != (store, i):  # gone, or moved elsewhere since
                continue
            grad = store.sparse.get(i, grads[i]) if store.has_grad[i] else None
            p.relocate(OwnArrays(values[i], grad))
        store.on_restructure = None


def states_of(buckets: list[Bucket]) -> dict[Parameter, Any]:
    """Each stepped parameter's state, cut from the buckets (fresh arrays)."""
    states: dict[Parameter, Any] = {}
    for bucket in buckets:
        if bucket.state is None:
            continue
        n = len(bucket.store.params)
        columns = [
            None
            if value is None
            else [jnp.array(value, copy=True)] * n
            if value.ndim == 0
            else bucket.store.views(value)
            for value in bucket.state
        ]
        for i, p in enumerate(bucket.store.params):
            fields = [None if column is None else column[i] for column in columns]
            states[p] = type(bucket.state)(*fields)
    return states


def state_at(bucket: Bucket, index: int) -> Any:
    """The state of the bucket's ``index``-th parameter, cut from its buffers."""
    fields = [
        None
        if value is None
        else jnp.array(value, copy=True)
        if value.ndim == 0
        else bucket.store.views(value)[index]
        for value in bucket.state
    ]
    return type(bucket.state)(*fields)


def by_domain(buckets: list[Bucket]) -> list[tuple[Any, list[int]]]:
    """Bucket positions grouped by the devices they live on; uncommitted buckets join
    the first committed domain (jit places them there)."""
    groups: dict[Any, list[int]] = {}
    loose = []
    for i, bucket in enumerate(buckets):
        if bucket.domain is None:
            loose.append(i)
        else:
            groups.setdefault(bucket.domain, []).append(i)
    if not groups:
        return [(None, loose)]
    first = next(iter(groups))
    groups[first] = sorted(groups[first] + loose)
    return list(groups.items())
