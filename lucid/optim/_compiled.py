"""The compiled backend: every bucket of parameters updated by one XLA executable.

Parameters are grouped into *buckets* -- same param group, dtype and device,
and identical per-parameter scalar state (``step``, ``eta``...) -- and each
bucket keeps its values, gradients and state in flat buffers
(`FlatStore`; parameters with a sharding no flat
buffer can keep stay alone). One jitted function per device domain applies the
rule to every bucket, with:

* hyper-parameters read from ``param_groups`` at every step and fed as one
  runtime vector, placed where the buckets live, so schedulers and hand edits
  never recompile;
* states begun by `lucid.optim._state.begin`, exactly as the eager
  backend does (at a parameter's first step with a gradient, from its group's
  values then); the value and state buffers donated, so the update is in place;
* a parameter that already lives in another compiled optimizer's store
  *borrowed* (`Borrowed`), never moved, so both
  optimizers see each other's updates;
* only a change of structure (a new group, shape, dtype, flag or state field,
  or a bucket whose parameters stop having gradients together) building a new
  executable;
* with ``shard_state_over`` (ZeRO-1), the state of buckets of replicated
  parameters sharded over that mesh axis: inside the executable each device
  updates its piece of the parameters and the state, and the new values are
  gathered back to every device (XLA's collectives, placed by sharding
  constraints). Sharded parameters' state follows their sharding either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from .._layout import join_views, views_of
from .._parameter import Parameter
from .._storage import OwnArrays, check_grad
from .._trace import device_domain, partition, rebuild_from_views
from ..functional._rule import Rule, apply_leaf, check_sparse_grad, hyper_values, is_sparse
from ._backend import OptimizerView, start_hyper
from ._state import begin
from ._store import Borrowed, FlatStore, dense, placement


@dataclasses.dataclass(eq=False)  # buckets compare by identity
class _Bucket:
    """Parameters updated together, and their state laid out as their store's values."""

    store: FlatStore | Borrowed
    group: int
    state: Any  # the rule's state NamedTuple (buffers and 0-d scalars); None before a step
    domain: Any  # the devices it lives on (None: not committed to any)


class _Plan(NamedTuple):
    """What the executable needs to know about one bucket (hashable: part of the cache key)."""

    flags: tuple
    wide: bool  # hyper-parameters from the float64 vector
    start: int
    names: tuple[str, ...]
    shard: Any = None  # sharded state: (length, padded length, state sharding, value sharding)


class _Entry(NamedTuple):
    param: Parameter
    group: int
    value: jax.Array
    grad: Any
    state: Any
    borrowed: bool


class CompiledBackend:
    """Runs an optimizer's steps as compiled executables (see the module docstring)."""

    def __init__(
        self,
        optimizer: OptimizerView,
        states: Mapping[Parameter, Any],
        shard_state_over: str | tuple[str, ...] | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.rule: Rule = optimizer.rule
        self.shard_state_over = shard_state_over
        self._buckets: list[_Bucket] = []
        self._executables: dict[Any, Callable] = {}
        self._device_vectors: dict[Any, tuple[list[float], jax.Array]] = {}
        self._build(self._entries(states))

    # ------------------------------------------------------ Backend protocol
    def states(self) -> dict[Parameter, Any]:
        """Each stepped parameter's state, cut from the buckets (fresh arrays)."""
        states: dict[Parameter, Any] = {}
        for bucket in self._buckets:
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

    def state_arrays(self) -> list[jax.Array]:
        """Every array of state the backend holds (the buckets' buffers and scalars)."""
        return [
            value
            for bucket in self._buckets
            if bucket.state is not None
            for value in bucket.state
            if value is not None
        ]

    def load(self, states: dict[Parameter, Any]) -> None:
        self._rebuild(states)

    def groups_changed(self) -> None:
        self._rebuild()

    def step(self) -> None:
        """One update of every bucket whose parameters all have gradients."""
        # [Step 1] the layout follows the gradients: split buckets whose
        # parameters stopped having gradients together
        if any(_partly(b) for b in self._buckets):
            self._rebuild()
        active = [b for b in self._buckets if b.store.has_grad.all()]
        if not active:
            return
        # [Step 2] begin every bucket's state for this step; may raise, and
        # nothing has changed until every bucket passed
        for bucket in active:
            if isinstance(bucket.store, Borrowed):
                p = bucket.store.params[0]
                check_grad(p.grad, p.shape, p.dtype)
                sparse = {0: p.grad} if is_sparse(p.grad) else {}
            else:
                sparse = bucket.store.sparse
            group = self.optimizer.param_groups[bucket.group]
            for index, grad in sparse.items():
                check_sparse_grad(self.rule, group, grad, bucket.store.params[index].shape)
        groups = self._group_hyper(active)
        states = self._begin(active, groups)
        # [Step 3] one executable per device domain
        for domain, members in _by_domain(active):
            buckets = [active[i] for i in members]
            plans, hyper32, hyper64 = self._hyper(buckets, domain, groups)
            key = ("step", plans, tuple(jax.tree_util.tree_structure(states[i]) for i in members))
            run = self._executable(key, lambda plans=plans: _step_function(self.rule, plans))
            values, new_states = run(
                hyper32,
                hyper64,
                [b.store.values for b in buckets],
                [b.store.grads for b in buckets],
                [states[i] for i in members],
            )
            self._commit(buckets, values, new_states)

    # -------------------------------------------------------------- fused
    def fused(
        self,
        loss_fn: Callable,
        tree: Any,
        args: tuple,
        kwargs: dict,
        grad_transform: Any = None,
        transform_state: Any = None,
    ) -> tuple[jax.Array, Any]:
        """Forward, backward, ``grad_transform`` (an optax transform applied to the
        list of gradients in the optimizer's parameter order) and update of every
        bucket in one executable. Returns the loss and the transform's new state."""
        traced = partition(tree, args, kwargs)
        position = {id(b.store): i for i, b in enumerate(self._buckets)}
        domains = {b.domain for b in self._buckets} - {None}
        if len(domains) > 1 or any(isinstance(b.store, Borrowed) for b in self._buckets):
            return self._fused_in_steps(
                loss_fn, tree, args, kwargs, grad_transform, transform_state
            )
        # the loss's storages: our buckets (differentiated) and others (constants)
        sources = tuple(
            ("bucket", position[id(s)]) if id(s) in position else ("const", i)
            for i, s in enumerate(traced.storages)
        )
        consts = [b for s, b in zip(sources, traced.buffers) if s[0] == "const"]
        groups = self._group_hyper(self._buckets)
        states = self._begin(self._buckets, groups)
        plans, hyper32, hyper64 = self._hyper(self._buckets, next(iter(domains), None), groups)
        order = self._parameter_order() if grad_transform is not None else ()
        structure = (traced.static, sources, tuple(b.store.layout for b in self._buckets), order)
        key = (
            "fused",
            loss_fn,
            grad_transform,
            structure,
            plans,
            jax.tree_util.tree_structure(states),
        )
        run = self._executable(
            key, lambda: _fused_function(self.rule, loss_fn, grad_transform, structure, plans)
        )
        loss, values, new_states, transform_state = run(
            hyper32,
            hyper64,
            [b.store.values for b in self._buckets],
            states,
            consts,
            traced.arrays,
            transform_state,
        )
        self._commit(self._buckets, values, new_states)
        return loss, transform_state

    def parameters(self) -> list[Parameter]:
        """The optimizer's parameters, in its groups' order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _parameter_order(self) -> tuple[tuple[int, int], ...]:
        """``(bucket, index in its store)`` of each parameter, in the optimizer's order."""
        where = {
            id(p): (b, i)
            for b, bucket in enumerate(self._buckets)
            for i, p in enumerate(bucket.store.params)
        }
        return tuple(where[id(p)] for p in self.parameters())

    def _fused_in_steps(
        self,
        loss_fn: Callable,
        tree: Any,
        args: tuple,
        kwargs: dict,
        grad_transform: Any,
        transform_state: Any,
    ) -> tuple[Any, Any]:
        """The fused step's meaning, as backward + step (parameters on several device
        domains, or borrowed from another optimizer): ``.grad`` is left as it was."""
        from .._trace import backward

        params = self.parameters()
        # every Parameter the loss sees keeps its .grad (only ours are updated)
        touched = {id(p): p for p in _parameters_in((tree, args, kwargs))}
        touched.update((id(p), p) for p in params)
        saved = {key: p.grad for key, p in touched.items()}
        for p in touched.values():
            p.grad = None
        try:
            loss = backward(loss_fn, tree, *args, **kwargs)
            grads = [jnp.zeros(p.shape, p.dtype) if p.grad is None else p.grad for p in params]
            if grad_transform is not None:
                grads, transform_state = grad_transform.update(
                    grads, transform_state, [p.data for p in params]
                )
            for p in touched.values():
                p.grad = None
            for p, grad in zip(params, grads):
                p.grad = grad
            for group in self.optimizer.param_groups:
                self.rule.check_step(group)
            self.step()
        finally:
            for key, p in touched.items():
                p.grad = saved[key]
        return loss, transform_state

    # ------------------------------------------------------------ layout
    def _entries(self, states: Mapping[Parameter, Any]) -> list[_Entry]:
        """Every parameter with its value, gradient and state (ours released first)."""
        entries = []
        for index, group in enumerate(self.optimizer.param_groups):
            for p in group["params"]:
                storage = p.location[0]
                borrowed = not isinstance(storage, OwnArrays)
                value = p.data
                grad = None if borrowed else p.grad
                entries.append(_Entry(p, index, value, grad, states.get(p), borrowed))
        return entries

    def _bucket_key(self, entry: _Entry) -> tuple:
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
        # alone: a sharding no flat buffer can keep, or a rule that is not elementwise
        # (it reduces over each parameter, and its state fields have shapes of their own)
        if where[0] is None or not self.rule.elementwise:
            where = (("alone", id(entry.param)), 1, None)
        return (entry.group, str(entry.value.dtype), where, signature, entry.grad is not None)

    def _build(self, entries: list[_Entry]) -> None:
        """Lay ``entries`` out into buckets and move the parameters into their stores."""
        keyed: dict[tuple, list[_Entry]] = {}
        for entry in entries:
            keyed.setdefault(self._bucket_key(entry), []).append(entry)
        buckets = []
        for key, members in keyed.items():
            first = members[0]
            domain = device_domain(first.value)
            if first.borrowed:
                store: Any = Borrowed(first.param)
            else:
                where, rows, sharding = key[2]
                flat = where[0] != "alone"
                store = FlatStore(
                    [e.param for e in members],
                    [e.value for e in members],
                    flat,
                    rows,
                    sharding,
                    self._state_sharding(where),
                )
                grads = [e.grad for e in members]
                if all(g is not None for g in grads):
                    store.grads = store.like(
                        [jnp.asarray(dense(g), store.value_dtype) for g in grads]
                    )
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
            buckets.append(_Bucket(store, first.group, state, domain))
        self._buckets = buckets
        for bucket in buckets:
            if isinstance(bucket.store, FlatStore):
                for index, p in enumerate(bucket.store.params):
                    p.relocate(bucket.store, index)
                bucket.store.on_restructure = self._restructure

    def _state_sharding(self, where: Any) -> Any:
        """The sharding of a bucket's state buffers under ``shard_state_over`` (None: laid
        out as the values). Only buckets of parameters replicated over a mesh shard
        their state; parameters sharded already keep state shaped as they are."""
        if self.shard_state_over is None or where[0] != "replicated":
            return None
        mesh = where[1]
        axes = self.shard_state_over
        named = axes if isinstance(axes, tuple) else (axes,)
        unknown = [a for a in named if a not in mesh.axis_names]
        if unknown:
            raise ValueError(
                f"shard_state_over={axes!r}: the parameters are replicated over a mesh with "
                f"axes {tuple(mesh.axis_names)}, which has no axis {unknown[0]!r}"
            )
        return NamedSharding(mesh, PartitionSpec(axes))

    def _release_all(self) -> None:
        """Give every parameter we hold its value and gradient back as its own arrays."""
        for bucket in self._buckets:
            store = bucket.store
            if not isinstance(store, FlatStore):
                continue
            values = store.views(store.values)
            grads = store.views(store.grads) if store.grads is not None else [None] * len(values)
            for i, p in enumerate(store.params):
                grad = store.sparse.get(i, grads[i]) if store.has_grad[i] else None
                p.relocate(OwnArrays(values[i], grad))
        self._buckets = []

    def _rebuild(self, states: Mapping[Parameter, Any] | None = None) -> None:
        """Lay everything out again (after a change of structure, or a load)."""
        states = self.states() if states is None else states
        self._release_all()
        self._build(self._entries(states))

    def _restructure(self, store: FlatStore, index: int, value: jax.Array) -> None:
        """A parameter got a value of a new shape or dtype: lay everything out again."""
        p = store.params[index]
        states = self.states()
        if states.get(p) is not None:
            raise ValueError(
                f"this parameter has optimizer state for shape {store.shapes[index]} "
                f"{store.value_dtype}; a {tuple(value.shape)} {value.dtype} value does not fit it"
            )
        self._release_all()
        p.relocate(OwnArrays(value, None))
        self._build(self._entries(states))

    # ------------------------------------------------------------ running
    def _group_hyper(self, buckets: list[_Bucket]) -> dict[int, tuple]:
        """``hyper_values`` of each group these buckets belong to, read once per step."""
        groups = self.optimizer.param_groups
        return {g: hyper_values(self.rule, groups[g]) for g in {b.group for b in buckets}}

    def _begin(self, buckets: list[_Bucket], groups: dict[int, tuple]) -> list[Any]:
        """Each bucket's state for this step (`lucid.optim._state.begin`)."""
        states = []
        for bucket in buckets:
            group = self.optimizer.param_groups[bucket.group]
            flags = groups[bucket.group][2]
            start = start_hyper(self.optimizer, group) if bucket.state is None else {}
            store = bucket.store
            creates = bucket.state is None or self.rule.start_optional is not None
            template = store.state_template() if creates else store.values
            states.append(begin(self.rule, flags, start, bucket.state, template))
        return states

    def _hyper(
        self, buckets: list[_Bucket], domain: Any, groups: dict[int, tuple]
    ) -> tuple[tuple[_Plan, ...], Any, Any]:
        """The buckets' hyper-parameters as one float32 (and one float64) vector."""
        plans, narrow, wide = [], [], []
        for bucket in buckets:
            names, values, flags = groups[bucket.group]
            store = bucket.store
            is_wide = store.wide
            target = wide if is_wide else narrow
            shard = None
            if store.state_sharding is not None:
                length = sum(store.sizes)
                shard = (length, store.state_length, store.state_sharding, store.sharding)
            plans.append(_Plan(tuple(sorted(flags.items())), is_wide, len(target), names, shard))
            target.extend(values)
        where = _vector_sharding(buckets)
        return (
            tuple(plans),
            self._on_device(narrow, np.float32, domain, where),
            self._on_device(wide, np.float64, domain, where),
        )

    def _on_device(self, values: list[float], dtype: type, domain: Any, where: Any) -> Any:
        """``values`` as a device array placed with the buckets, reusing the last one when
        nothing changed (a host-to-device copy is the largest fixed cost of a small step)."""
        if not values:
            return None
        cached = self._device_vectors.get((dtype, domain))
        if cached is not None and cached[0] == values:
            return cached[1]
        array = jax.device_put(np.asarray(values, dtype), where)
        self._device_vectors[(dtype, domain)] = (values, array)
        return array

    def _executable(self, key: Any, make: Callable[[], Callable]) -> Callable:
        if key not in self._executables:
            self._executables[key] = make()
        return self._executables[key]

    def _commit(self, buckets: list[_Bucket], values: list, states: list) -> None:
        for bucket, value, state in zip(buckets, values, states):
            bucket.store.replace_values(value)
            bucket.state = state


def _parameters_in(tree: Any) -> list[Parameter]:
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, Parameter))
    return [leaf for leaf in leaves if isinstance(leaf, Parameter)]


def _partly(bucket: _Bucket) -> bool:
    """Some, not all, of a bucket's parameters have a gradient."""
    has = bucket.store.has_grad
    return bool(has.any()) and not bool(has.all())


def _by_domain(buckets: list[_Bucket]) -> list[tuple[Any, list[int]]]:
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


def _vector_sharding(buckets: list[_Bucket]) -> Any:
    """Where a hyper-parameter vector for ``buckets`` goes: replicated over their devices."""
    for bucket in buckets:
        if bucket.domain is None:
            continue
        sharding = bucket.store.params[0].data.sharding
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec())
        if len(sharding.device_set) == 1:
            return SingleDeviceSharding(next(iter(sharding.device_set)))
    return None


def _hyper_of(plan: _Plan, hyper32: jax.Array, hyper64: Any) -> dict[str, jax.Array]:
    vector = hyper64 if plan.wide else hyper32
    return {name: vector[plan.start + i] for i, name in enumerate(plan.names)}


def _apply_sharded(rule: Rule, plan: _Plan, hyper: dict, value, grad, state):
    """One bucket with sharded state (ZeRO-1): the replicated value and gradient are cut
    to the state's pieces (padded as it is), each device updates its piece, and the new
    value is gathered back to every device; the collectives are XLA's."""
    length, padded, over, whole = plan.shard
    constrain = jax.lax.with_sharding_constraint

    def spread(x: jax.Array) -> jax.Array:
        return constrain(jnp.pad(x, (0, padded - length)), over)

    new_value, new_state = apply_leaf(
        rule, dict(plan.flags), hyper, spread(value), spread(grad), state
    )
    new_state = jax.tree_util.tree_map(lambda s: constrain(s, over) if s.ndim else s, new_state)
    return constrain(new_value, whole)[:length], new_state


def _apply(rule: Rule, plans: tuple, hyper32: Any, hyper64: Any, values, grads, states):
    new_values, new_states = [], []
    for plan, value, grad, state in zip(plans, values, grads, states):
        hyper = _hyper_of(plan, hyper32, hyper64)
        if plan.shard is not None:
            new_value, new_state = _apply_sharded(rule, plan, hyper, value, grad, state)
        else:
            new_value, new_state = apply_leaf(rule, dict(plan.flags), hyper, value, grad, state)
        new_values.append(new_value)
        new_states.append(new_state)
    return new_values, new_states


def _step_function(rule: Rule, plans: tuple[_Plan, ...]) -> Callable:
    def step(hyper32, hyper64, values, grads, states):
        return _apply(rule, plans, hyper32, hyper64, values, grads, states)

    return jax.jit(step, donate_argnums=(2, 4))


def _fused_function(
    rule: Rule, loss_fn: Callable, grad_transform: Any, structure: tuple, plans: tuple
) -> Callable:
    static, sources, layouts, order = structure
    const_layouts = [static[3][i] for i, source in enumerate(sources) if source[0] == "const"]

    def fused(hyper32, hyper64, values, states, consts, arrays, transform_state):
        const_views = [views_of(c, layout) for c, layout in zip(consts, const_layouts)]

        def loss_of(bucket_views):
            const_it = iter(const_views)
            views = [
                bucket_views[source[1]] if source[0] == "bucket" else next(const_it)
                for source in sources
            ]
            tree, args, kwargs = rebuild_from_views(static, views, arrays)
            return loss_fn(tree, *args, **kwargs)

        bucket_views = [views_of(buffer, layout) for buffer, layout in zip(values, layouts)]
        loss, view_grads = jax.value_and_grad(loss_of)(bucket_views)
        if grad_transform is not None:  # on per-parameter gradients, the optimizer's order
            grads_list = [view_grads[b][i] for b, i in order]
            params_list = [bucket_views[b][i] for b, i in order]
            grads_list, transform_state = grad_transform.update(
                grads_list, transform_state, params_list
            )
            view_grads = [list(views) for views in view_grads]
            for (b, i), grad in zip(order, grads_list):
                view_grads[b][i] = grad
        grads = [join_views(g, layout) for g, layout in zip(view_grads, layouts)]
        new_values, new_states = _apply(rule, plans, hyper32, hyper64, values, grads, states)
        return loss, new_values, new_states, transform_state

    return jax.jit(fused, donate_argnums=(2, 3))
