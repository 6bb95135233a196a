"""The compiled backend: every bucket of parameters updated by one XLA executable.

Parameters are laid out into buckets (`lucid.optim._engine.buckets`) whose
values, gradients and state live in flat buffers. One program per device
domain (`lucid.optim._engine.programs`) applies the rule to every bucket, with:

* hyper-parameters read from the groups at every step and fed as one runtime
  vector, placed where the buckets live, so schedulers and hand edits never
  recompile;
* states begun by `lucid.optim._engine.state.begin`, exactly as the eager
  backend does; the value and state buffers donated, so the update is in place;
* the layout following the groups it is given: when the parameters of the
  groups are not those it was laid out for (appended, removed, replaced,
  reordered; groups added, deleted, reordered), or a bucket's parameters stop
  having gradients together, it is laid out again, and only a change of
  structure builds a new program;
* with ``shard_state_over`` (ZeRO-1), the state of buckets of replicated
  parameters sharded over that mesh axis (`lucid.optim._engine.sharding`).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from ..._parameter import Parameter
from ..._platform import flat_blocks
from ..._storage import OwnArrays, check_grad, run_time_offsets
from ...functional._apply import check_sparse_grad, is_sparse
from ...functional._sparse import stored_entries
from ...functional.rule import Present, Rule
from . import buckets as layout
from .buckets import Bucket
from .flat_store import Borrowed, FlatStore
from .interface import Group
from .programs import (
    Plan,
    checked_gradients,
    constant_layouts,
    fused_program,
    step_program,
    transformed_step_program,
)
from .sharding import Axes
from .state import begin, packed_hyper

Params = tuple[list[Parameter], ...]


class CompiledBackend:
    """Runs an optimizer's steps as compiled executables (see the module docstring).

    Args:
      rule: the optimizer's rule.
      states: the states to adopt (what eager steps built).
      groups: the parameters of each group, to lay out now.
      shard_state_over: the mesh axis (or axes) to shard replicated parameters'
        state over, or ``None``.
    """

    def __init__(
        self,
        rule: Rule,
        states: Mapping[Parameter, Any],
        groups: Sequence[Sequence[Parameter]],
        shard_state_over: Axes | None = None,
    ) -> None:
        self.rule = rule
        self.shard_state_over = shard_state_over
        self._buckets: list[Bucket] = []
        self._params: Params = ()
        self._orphans: dict[Parameter, Any] = {}  # state of parameters no group lists
        self._where: dict[Parameter, tuple[Bucket, int]] = {}
        self._device_vectors: dict[Any, tuple[list[float], jax.Array]] = {}
        # the groups' static options the layout was made for (a rule over blocks
        # lays parameters out by them; None: not known before the first step)
        self._flags: list[dict[str, Any]] | None = None
        self._lay_out(_params_of(groups), dict(states))

    # ------------------------------------------------------ Backend protocol
    def states(self) -> dict[Parameter, Any]:
        return {**self._orphans, **layout.states_of(self._buckets)}

    def state_of(self, param: Parameter) -> Any:
        if param in self._orphans:
            return self._orphans[param]
        found = self._where.get(param)
        if found is None or found[0].state is None:
            return None
        return layout.state_at(*found)

    def state_arrays(self) -> list[jax.Array]:
        """Every array of state the backend holds (the buckets' buffers and scalars)."""
        held = [
            value
            for bucket in self._buckets
            if bucket.state is not None
            for value in bucket.state
            if value is not None
        ]
        for state in self._orphans.values():
            held.extend(v for v in state if isinstance(v, jax.Array))
        return held

    def load(self, states: Mapping[Parameter, Any]) -> None:
        self._lay_out(self._params, dict(states), self._flags)

    def release(self) -> None:
        states = self.states()
        layout.release(self._buckets)
        # laid out for no parameters: the next step lays the groups out again
        self._buckets, self._where, self._params = [], {}, ()
        self._orphans = states

    def step(self, groups: Sequence[Group]) -> None:
        """One update of every bucket whose parameters all have gradients."""
        # [Step 1] the layout follows the groups and the gradients
        self._follow(groups)
        active = [b for b in self._buckets if b.store.has_grad.all()]
        if not active:
            return
        # [Step 2] check every gradient and begin every bucket's state; may raise,
        # and nothing has changed until every bucket passed
        for bucket in active:
            self._check_grads(bucket, groups[bucket.group])
        states = self._begin(active, groups)
        # [Step 3] one executable per device domain
        for domain, members in layout.by_domain(active):
            chosen = [active[i] for i in members]
            plans, hyper32, hyper64 = self._hyper(chosen, domain, groups)
            run = step_program(self.rule, plans)
            values, new_states = run(
                hyper32,
                hyper64,
                [b.store.values for b in chosen],
                [self._gradient(b) for b in chosen],
                [states[i] for i in members],
            )
            self._commit(chosen, values, new_states)

    # -------------------------------------------------------------- fused
    def fused(
        self,
        groups: Sequence[Group],
        loss_fn: Callable,
        call: tuple[Any, tuple, dict],
        grad_transform: Any,
        transform_state: Any,
        has_aux: bool = False,
        accumulate: int | None = None,
    ) -> tuple[Any, Any]:
        """Forward, backward, ``grad_transform`` (an optax transform applied to the
        list of gradients in the optimizer's parameter order) and update of every
        bucket in one executable (two with a ``grad_transform``: the gradients, then
        the transform and the update, `transformed_step_program`). Returns the loss
        (``(loss, aux)`` with ``has_aux``)
        and the transform's new state. With ``accumulate=N`` the arrays of ``args``
        and ``kwargs`` hold N micro-batches along their leading axis (see
        `fused_program`).

        Where one executable cannot hold the step (parameters on several device
        domains or borrowed from another optimizer, or parameters of the
        optimizer the loss does not take), it runs as its meaning: `backward`,
        the transform and a step, leaving every ``.grad`` as it was."""
        from ..._backward import array_count, parameters_in, partition, refuse_tracers

        self._follow(groups, gradients=False)
        tree, args, kwargs = call
        traced = partition(tree, args, kwargs)
        refuse_tracers(traced, "a fused step")
        position = {id(b.store): i for i, b in enumerate(self._buckets)}
        domains = {b.domain for b in self._buckets} - {None}
        borrowed = any(isinstance(b.store, Borrowed) for b in self._buckets)
        taken = {id(p) for p in parameters_in(call)}
        missing = any(id(p) not in taken for params in self._params for p in params)
        if len(domains) > 1 or borrowed or missing:
            return self._fused_in_steps(
                groups, loss_fn, call, grad_transform, transform_state, has_aux, accumulate
            )
        # the loss's storages: our buckets (differentiated) and others (constants)
        sources = tuple(
            ("bucket", position[id(s)]) if id(s) in position else ("const", i)
            for i, s in enumerate(traced.storages)
        )
        consts = [b for s, b in zip(sources, traced.buffers) if s[0] == "const"]
        states = self._begin(self._buckets, groups)
        domain = next(iter(domains), None)
        plans, hyper32, hyper64 = self._hyper(self._buckets, domain, groups)
        zero = self._on_device([0], np.uint32, domain, _vector_sharding(self._buckets))
        layouts = tuple(b.store.layout for b in self._buckets)
        values = [b.store.values for b in self._buckets]
        fixed = array_count(tree) if accumulate is not None else 0
        key = (self.rule, loss_fn, (traced.static, sources, layouts), plans, has_aux, accumulate)
        # flat buffers cut at run-time offsets (one compiled cut per distinct shape)
        bucket_offsets = tuple(map(run_time_offsets, layouts, values))
        const_layouts = constant_layouts(traced.static, sources)
        offsets = (bucket_offsets, tuple(map(run_time_offsets, const_layouts, consts)))
        if grad_transform is None:
            run = fused_program(*key, fixed)
            loss, values, new_states = run(
                hyper32, hyper64, zero, values, states, consts, traced.arrays, offsets
            )
        else:  # two programs: the transform reads the gradients as program inputs
            gradients = fused_program(*key, fixed, False)
            loss, grads = gradients(zero, values, consts, traced.arrays, offsets)
            run = transformed_step_program(
                self.rule, plans, grad_transform, layouts, self._parameter_order()
            )
            values, new_states, transform_state = run(
                hyper32, hyper64, zero, values, grads, states, transform_state, bucket_offsets
            )
        self._commit(self._buckets, values, new_states)
        return loss, transform_state

    def _parameter_order(self) -> tuple[tuple[int, int], ...]:
        """``(bucket, index in its store)`` of each parameter, in the groups' order."""
        where = {
            id(p): (b, i)
            for b, bucket in enumerate(self._buckets)
            for i, p in enumerate(bucket.store.params)
        }
        return tuple(where[id(p)] for params in self._params for p in params)

    def _fused_in_steps(
        self,
        groups: Sequence[Group],
        loss_fn: Callable,
        call: tuple[Any, tuple, dict],
        grad_transform: Any,
        transform_state: Any,
        has_aux: bool = False,
        accumulate: int | None = None,
    ) -> tuple[Any, Any]:
        """The fused step's meaning, as backward + transform + step: ``.grad`` is left
        as it was. With ``accumulate=N``, N backwards of ``loss / N``, one per
        micro-batch (torch's accumulation loop)."""
        from ..._backward import backward, parameters_in
        from ..._placement import on_one_domain

        params = [p for params in self._params for p in params]
        # every Parameter the loss sees keeps its .grad (only ours are updated)
        touched = {id(p): p for p in parameters_in(call)}
        touched.update((id(p), p) for p in params)
        saved = {key: p.grad for key, p in touched.items()}
        for p in touched.values():
            p.grad = None
        try:
            tree, args, kwargs = call
            if accumulate is None:
                loss = backward(loss_fn, tree, *args, has_aux=has_aux, **kwargs)
            else:
                scaled = ScaledLoss(loss_fn, accumulate, has_aux)
                outs = []
                for i in range(accumulate):
                    micro_args, micro_kwargs = jax.tree_util.tree_map(
                        lambda x, i=i: x[i] if isinstance(x, jax.Array | np.ndarray) else x,
                        (args, kwargs),
                        is_leaf=lambda x: isinstance(x, Parameter),
                    )
                    outs.append(
                        backward(scaled, tree, *micro_args, has_aux=True, **micro_kwargs)[1]
                    )
                total = outs[0][0]
                for out in outs[1:]:  # in order, as the loop's running sum
                    total = total + out[0]
                aux = jax.tree_util.tree_map(lambda *xs: jax.numpy.stack(xs), *[o[1] for o in outs])
                loss = (total, aux) if has_aux else total
            if grad_transform is not None:
                stepped = [p for p in params if p.grad is not None]
                grads = [p.grad for p in stepped]
                # gradients on several device domains meet on one (lucid._placement)
                new, transform_state = on_one_domain(
                    grad_transform.update, grads, transform_state, [p.data for p in stepped]
                )
                for p, grad in zip(stepped, checked_gradients(new, grads)):
                    p.grad = grad
            self.step(groups)
        finally:
            for key, p in touched.items():
                p.grad = saved[key]
        return loss, transform_state

    # ------------------------------------------------------------ layout
    def _follow(self, groups: Sequence[Group], gradients: bool = True) -> None:
        """Lay out again when the groups' parameters are not those of the layout, or
        (``gradients``) a bucket's parameters stopped having gradients together."""
        params = self._params
        # a rule over blocks lays parameters out by their groups' static options
        flags = None if not flat_blocks(self.rule.execution) else [g.hyper.flags for g in groups]
        # lists compared element by element, by identity, in C: no copies per step
        if len(groups) != len(params) or any(g.params != held for g, held in zip(groups, params)):
            self._lay_out(_params_of(g.params for g in groups), self.states(), flags)
        elif flags != self._flags or (gradients and any(b.partly for b in self._buckets)):
            self._lay_out(params, self.states(), flags)

    def _lay_out(
        self, params: Params, states: dict[Parameter, Any], flags: list | None = None
    ) -> None:
        """Release everything, then lay ``params`` out with ``states`` (``flags``: the
        groups' static options, for a rule over blocks)."""
        layout.release(self._buckets)
        listed = {p for group in params for p in group}
        self._orphans = {p: s for p, s in states.items() if p not in listed}
        self._params = params
        self._flags = flags
        self._buckets = layout.build(
            self.rule, layout.entries(params, states), self.shard_state_over, flags
        )
        self._where = {
            p: (bucket, index)
            for bucket in self._buckets
            for index, p in enumerate(bucket.store.params)
        }
        for bucket in self._buckets:
            # adopted or loaded scalars placed as the program returns them
            bucket.state = _scalars_placed(bucket.state, _vector_sharding([bucket]))
            if isinstance(bucket.store, FlatStore):
                # weakly: the parameters keep their store, which must not keep us
                bucket.store.on_restructure = weakref.WeakMethod(self._restructure)

    def _restructure(self, store: FlatStore, index: int, value: jax.Array) -> None:
        """A parameter got a value of a new shape or dtype: lay everything out again."""
        p = store.param(index)
        states = self.states()
        if states.get(p) is not None:
            raise ValueError(
                f"this parameter has optimizer state for shape {store.shapes[index]} "
                f"{store.value_dtype}; a {tuple(value.shape)} {value.dtype} value does not fit it"
            )
        layout.release(self._buckets)
        self._buckets = []
        p.relocate(OwnArrays(value, None))
        self._lay_out(self._params, states, self._flags)

    # ------------------------------------------------------------ running
    @staticmethod
    def _sparse_grads(bucket: Bucket) -> dict[int, Any]:
        """The bucket's gradients that were given sparse, by index in its store."""
        if isinstance(bucket.store, Borrowed):
            grad = bucket.store.param(0).grad
            return {0: grad} if is_sparse(grad) else {}
        return bucket.store.sparse

    def _check_grads(self, bucket: Bucket, group: Group) -> None:
        if isinstance(bucket.store, Borrowed):
            p = bucket.store.param(0)
            check_grad(p.grad, p.shape, p.dtype)
        for index, grad in self._sparse_grads(bucket).items():
            check_sparse_grad(self.rule, group.options, grad, bucket.store.params[index].shape)

    def _gradient(self, bucket: Bucket) -> Any:
        """The bucket's gradient buffer; where it holds a sparse gradient and the rule's
        sparse numbers are not its dense ones, as a `Present` gradient: the buffer and
        the mask of the stored entries (ones over the dense gradients)."""
        store = bucket.store
        if self.rule.sparse is None or self.rule.sparse.masked_update is None:
            return store.grads
        sparse = self._sparse_grads(bucket)
        if not sparse:
            return store.grads
        masks = [
            stored_entries(sparse[i]) if i in sparse else jnp.ones(shape, bool)
            for i, shape in enumerate(store.layout.shapes)
        ]
        return Present(store.grads, store.like(masks))

    def _begin(self, buckets: list[Bucket], groups: Sequence[Group]) -> list[Any]:
        """Each bucket's state for this step (`lucid.optim._engine.state.begin`)."""
        states = []
        for bucket in buckets:
            group = groups[bucket.group]
            start = packed_hyper(self.rule, group.start) if bucket.state is None else {}
            store = bucket.store
            creates = bucket.state is None or self.rule.fields.start_optional is not None
            template = store.state_template() if creates else store.values
            flags = {**group.hyper.flags, **dict(bucket.flags)}
            state = begin(self.rule, flags, start, bucket.state, template)
            if creates:  # new fields placed as the program returns them
                state = _scalars_placed(state, _vector_sharding([bucket]))
            states.append(state)
        return states

    def _hyper(
        self, buckets: list[Bucket], domain: Any, groups: Sequence[Group]
    ) -> tuple[tuple[Plan, ...], Any, Any]:
        """The buckets' hyper-parameters as one float32 (and one float64) vector."""
        plans, narrow, wide = [], [], []
        for bucket in buckets:
            names, values, flags = groups[bucket.group].hyper
            flags = {**flags, **dict(bucket.flags)}
            store = bucket.store
            target = wide if store.wide else narrow
            shard: Any = bucket.rows_over  # a rule over whole parameters: by rows
            if store.state_sharding is not None:
                length = sum(store.sizes)
                shard = (length, store.state_length, store.state_sharding, store.sharding)
            plans.append(Plan(tuple(sorted(flags.items())), store.wide, len(target), names, shard))
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

    def _commit(self, buckets: list[Bucket], values: list, states: list) -> None:
        for bucket, value, state in zip(buckets, values, states):
            bucket.store.replace_values(value)
            bucket.state = state


def _params_of(groups: Any) -> Params:
    return tuple(list(params) for params in groups)


def _scalars_placed(state: Any, where: Any) -> Any:
    """``state`` with its 0-d fields (``step``...) replicated where the bucket lives, as
    the program returns them: a scalar made on the default device (a new state, one
    adopted or loaded) would otherwise make the next step compile again (one new
    executable for the same structure, on a mesh)."""
    if where is None or state is None:
        return state
    fields = [
        jax.device_put(np.asarray(v), where)
        if isinstance(v, jax.Array) and v.ndim == 0 and v.sharding != where
        else v
        for v in state
    ]
    return type(state)(*fields)


def _vector_sharding(buckets: list[Bucket]) -> Any:
    """Where a hyper-parameter vector for ``buckets`` goes: replicated over their devices."""
    for bucket in buckets:
        if bucket.domain is None:
            continue
        store = bucket.store
        # a flat store's buffer says where it lives without cutting a parameter's slice
        holder = store.values if isinstance(store, FlatStore) else store.param(0).data
        sharding = holder.sharding
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec())
        if len(sharding.device_set) == 1:
            return SingleDeviceSharding(next(iter(sharding.device_set)))
    return None


@dataclasses.dataclass(frozen=True)
class ScaledLoss:
    """``loss_fn``'s loss divided by ``n`` (one micro-batch of ``n``), returned as
    ``(loss / n, (loss / n, aux))``; equal for equal arguments, so it keys one
    compiled program."""

    loss_fn: Callable
    n: int
    has_aux: bool

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        from ..._backward import split_aux

        loss, aux = split_aux(self.loss_fn(*args, **kwargs), self.has_aux)
        loss = loss / self.n
        return loss, (loss, aux)
