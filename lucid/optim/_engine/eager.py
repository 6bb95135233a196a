"""The eager backend: jitted calls of the rule per parameter group and device.

A parameter's state is its rule's NamedTuple, begun by
`lucid.optim._engine.state.begin`, the same function the compiled backend begins
states with, so compiling changes speed, never numbers.

A step costs what its host code costs when the arrays are small, and on the
host every array a call takes, and more every array it returns, costs time of
its own. So, on the CPU (with jax 0.10 or later: `Policy.flat`), an elementwise rule's
small parameters (at most `Policy.small` elements) whose states share a structure run
*laid end to end* (`flat_program`): a call takes their values and gradients,
lays them end to end inside the program and applies the rule to the flat
buffers; their values and states stay flat between steps (a 0-d field such as
``step`` once, which every member shares: members are grouped by its value), the
values in a `lucid.optim._engine.pieces.PieceStore` the members live in, which
cuts them per parameter only when read. A member that lives in another live
optimizer's storage keeps it: its call takes its value and gives it back cut.
Elementwise math gives every element its own parameter's numbers, bit for bit
as XLA compiles it in jax 0.10 (the tests check every elementwise family against
the per-parameter program; older XLA differs in the last bit, hence `Policy.flat`).
Such calls hold at most `Policy.chunk` parameters (XLA compiles each cut as a kernel of
its own; calls of the same shapes share one executable); the last call of a step
donates its flat state buffers and value pieces to the new ones (the backend's
own: `states()` and a store's reads copy; only the last, since a call refused for
its arguments runs nothing and the checking path then needs the inputs of the
calls before it).

Two rules of XLA:CPU decide what such a call costs on the host, and the layout
follows them. It runs a program's kernels one after another only when the
program has at most 8 of them or none of its buffers exceeds 512 bytes, and
otherwise hands them to its thread pool (about 1.6 us more per kernel, and a
call has a kernel per parameter): so each flat state field is held in pieces of
at most `Policy.piece_bytes` bytes (`FlatLayout.starts`). And it runs a program on the
calling thread only when its cost analysis counts under 1000 floating-point
operations, and otherwise on a pool thread that the step must then wait for
(tens of microseconds on a busy machine); that analysis counts each cut of a
flat buffer as the whole buffer's work, so a call the analysis would otherwise
put under the threshold (its parameters' elements times the update's operations
per element, `_update_flops`, below `Policy.inline_flops`) keeps each member's fields
apart (pieces of one). `states()` cuts the flat states per parameter on demand,
once per step. Other parameters (a rule that is not elementwise, a large or
sharded parameter, a sparse gradient) run through `group_program`, one call per
group, device domain and state structure.

Everything that depends only on the step's *structure* (which parameters,
which of them have gradients, their shapes, dtypes and devices, the static
flags, the states' structure) is planned once (`_Plan`) and checked again,
cheaply, at the next step: the same parameters in the same groups with
gradients in the same places, the same flags, no state loaded since; the
executables compiled for the last step (``jax.jit(...).lower(...).compile()``)
then check the shapes, dtypes and placements of every array as they are
called, before anything runs. Any difference falls back to the full, checking
path, which gives torch's errors and plans again.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._arrays import device_domain
from ..._parameter import Parameter, grads_of, located_in, set_values, values_of
from ..._storage import check_grad
from ...functional._apply import (
    apply_leaf,
    apply_leaves,
    check_sparse_grad,
    compute_dtype,
    is_sparse,
)
from ...functional.rule import Rule
from . import policy
from .interface import Group
from .layout import join_views, views_of
from .pieces import FlatLayout, PieceStore, flat_piece, free, held_piece, joiner
from .programs import PROGRAMS_KEPT, jit_placed
from .state import begin, packed_hyper


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def group_program(
    rule: Rule, flags: tuple[tuple[str, Any], ...], names: tuple[str, ...]
) -> Callable:
    """One jitted function per (rule, static flags, hyper-parameter names): the rule over
    a list of parameters, the hyper-parameters arriving as one vector (one transfer);
    for a ``batched`` rule, same-shaped parameters placed alike in one batched call."""
    options = dict(flags)

    def run(vector, params, grads, states, places=None):
        hyper = {name: vector[i] for i, name in enumerate(names)}
        n = len(params)
        return apply_leaves(rule, [options] * n, [hyper] * n, params, grads, states, places)

    return jit_placed(rule, run, 1)


class Segment(NamedTuple):
    """A flat call's part for one group (hashable: part of `flat_program`'s key).

    Attributes:
      flags: the group's static options, sorted ``(name, value)`` pairs.
      names: the hyper-parameters' names, in vector order.
      layout: how the members lie in the flat buffers.
      held: the values arrive (and leave) as the pieces of a `PieceStore`.
    """

    flags: tuple[tuple[str, Any], ...]
    names: tuple[str, ...]
    layout: FlatLayout
    held: bool


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def flat_program(rule: Rule, segments: tuple[Segment, ...], donate: bool = False) -> Callable:
    """One jitted function per (elementwise rule, segments), a segment being the
    static flags, hyper-parameter names and layout of some parameters of one group:
    per piece of a segment, its members' values and gradients laid end to end, the
    rule applied once to the flat buffers with the members' state as one flat state
    (elementwise math: every element's numbers are those of its own parameter's
    update). The state stays flat between steps: one output per state field and
    piece, not one per parameter and field (each output is an array the host must
    wrap), a 0-d field once per segment (every piece computes the same value from the
    same input). A segment whose values a `PieceStore` holds (``held``) takes and
    returns them as pieces too; another takes its members' values and returns them
    cut back. Several groups' segments share a call (each call has a cost of its
    own)."""

    def run(vectors, params, grads, states):
        new_values, new_states = [], []
        for (flags, names, layout, held), vector, p, g, state in zip(
            segments, vectors, params, grads, states
        ):
            hyper = {name: vector[i] for i, name in enumerate(names)}
            options = dict(flags)
            values, pieces = [], []
            for k, (a, b, piece) in enumerate(layout.pieces):
                fields = (
                    f if f is None or scalar else f[k] for f, scalar in zip(state, layout.scalar)
                )
                flat = flat_piece(p[k], piece) if held else join_views(p[a:b], piece)
                value, new = apply_leaf(
                    rule, options, hyper, flat, join_views(g[a:b], piece), type(state)(*fields)
                )
                if held:
                    values.append(held_piece(value, piece))
                else:
                    values.extend(views_of(value, piece))
                pieces.append(new)
            first = pieces[0]
            new_states.append(
                type(first)(
                    *(
                        f if f is None or scalar else tuple(new[j] for new in pieces)
                        for j, (f, scalar) in enumerate(zip(first, layout.scalar))
                    )
                )
            )
            new_values.append(tuple(values) if held else values)
        return new_values, new_states

    if not donate:
        return jax.jit(run)
    # with ``donate``, the flat state buffers (the backend's own, made by `_state_joiner`
    # or a step) give their memory to the new ones, and so do the values where every
    # segment's are a store's pieces (the store's own: `joiner` copies, a read cuts)
    held = all(segment.held for segment in segments)
    return jax.jit(run, donate_argnums=(1, 3) if held else 3)


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _field_splitter(layout: FlatLayout) -> Callable:
    """Cuts a flat state's per-value fields (one tuple of pieces per field) and copies
    its 0-d fields, in one call: arrays of their own (the flat buffers are donated to
    the next step)."""
    return jax.jit(
        lambda fields, scalars: (
            [[jnp.copy(x) for x in layout.split_field(f)] for f in fields],
            [jnp.copy(x) for x in scalars],
        )
    )


def _split_states(layout: FlatLayout, state: Any) -> list[Any]:
    """`FlatLayout.split_states` as one call, into new arrays (a 0-d field: one copy,
    which every member's state shares)."""
    present = [(f, scalar) for f, scalar in zip(state, layout.scalar) if f is not None]
    cut, copied = _field_splitter(layout)(
        [f for f, scalar in present if not scalar], [f for f, scalar in present if scalar]
    )
    cut, copied = iter(cut), iter(copied)
    per_field = [
        None if f is None else (next(copied), None) if scalar else (None, next(cut))
        for f, scalar in zip(state, layout.scalar)
    ]
    return [
        type(state)(*(None if c is None else c[0] if c[1] is None else c[1][i] for c in per_field))
        for i in range(len(layout.shapes))
    ]


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _state_joiner(layout: FlatLayout) -> Callable:
    """`FlatLayout.join_states` as one call, into new arrays (donated by the step, so
    never an array a caller holds: a loaded state's, say)."""
    return jax.jit(lambda states: jax.tree_util.tree_map(jnp.copy, layout.join_states(states)))


def _flat_kind(rule: Rule, state: Any, value: Any) -> tuple | None:
    """What members of one flat call must share (their state's structure, dtypes and
    0-d values, the value's dtype), or ``None`` where a parameter's state cannot be
    laid flat: a rule that is not elementwise, an array spread over several
    devices or on an accelerator (where the flat numbers have not been checked
    against the per-parameter program's, and a step is not host-bound the same
    way), a field that is neither the value's shape nor 0-d, a weakly typed or
    host array."""
    if not rule.execution.elementwise or not isinstance(value, jax.Array):
        return None
    devices = value.sharding.device_set
    if len(devices) != 1 or next(iter(devices)).platform != "cpu":
        return None
    kind: list[Any] = [value.dtype, type(state)]
    for name, field in zip(state._fields, state):
        if field is None:
            kind.append(None)
            continue
        if not isinstance(field, jax.Array) or field.weak_type:
            return None
        if len(field.sharding.device_set) != 1:
            return None
        if name in rule.fields.scalar and field.shape == ():
            # every member must hold the same 0-d value: read once, at planning
            kind.append((field.dtype, np.asarray(field).tobytes()))
        elif field.shape == value.shape:
            kind.append(field.dtype)
        else:
            return None
    return tuple(kind)


# the length of the 1-D parameter whose update `_update_flops` counts
_PROXY = 64


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _update_flops_of(
    rule: Rule, flags: tuple, names: tuple[str, ...], vector: Any, value: Any, state: Any
) -> float:
    def update(vector, value, grad, state):
        hyper = {name: vector[i] for i, name in enumerate(names)}
        return apply_leaf(rule, dict(flags), hyper, value, grad, state)

    try:
        analysis = jax.jit(update).lower(vector, value, value, state).cost_analysis()
    except Exception:  # an estimate only: without one, the call is not inline
        return math.inf
    if isinstance(analysis, list | tuple):  # older jax: one dict per program
        analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", math.inf)) / _PROXY


def _update_flops(
    rule: Rule, flags: tuple, names: tuple[str, ...], vector: Any, value: Any, state: Any
) -> float:
    """XLA's count of floating-point operations per element of one parameter's update
    (of ``value``'s dtype and ``state``'s structure), from the update of a 1-D
    parameter of `_PROXY` elements (a flat call's members are elementwise: the count
    does not depend on their shapes), cached by the rule, flags, names and dtypes."""
    fields = [
        None
        if f is None
        else jax.ShapeDtypeStruct(
            () if name in rule.fields.scalar and np.shape(f) == () else (_PROXY,), f.dtype
        )
        for name, f in zip(state._fields, state)
    ]
    return _update_flops_of(
        rule,
        flags,
        names,
        jax.ShapeDtypeStruct(np.shape(vector), vector.dtype),
        jax.ShapeDtypeStruct((_PROXY,), value.dtype),
        type(state)(*fields),
    )


def _starts(params: Sequence[Parameter]) -> tuple[int, ...]:
    """Where the pieces of a flat call's buffers start: each piece holds consecutive
    members, at most `Policy.piece_bytes` of them (a larger member: a piece of its own)."""
    limit = policy.EAGER.piece_bytes
    starts, size = [], limit
    for i, p in enumerate(params):
        nbytes = p.size * np.dtype(p.dtype).itemsize
        if not starts or size + nbytes > limit:  # the first member opens a piece
            starts.append(i)
            size = 0
        size += nbytes
    return tuple(starts)


class _Batch:
    """One call of a group's program: the group's parameters (with gradients) on one
    device domain whose states share a structure, the executable compiled for their
    last step (``None`` until that step ran) and, where the states live in flat
    buffers (``layout``), those buffers and, where the values live in a `PieceStore`
    of this backend (``held``), that store."""

    __slots__ = (
        "dtype",
        "held",
        "layout",
        "members",
        "params",
        "place",
        "run",
        "segment",
        "slot",
        "span",
        "state",
        "store",
        "values",
        "vector",
    )

    def __init__(
        self,
        members: list[int],
        params: list[Parameter],
        dtype: Any,
        layout: FlatLayout | None,
    ) -> None:
        self.members = members  # positions in the group's parameter list
        self.params = params
        self.dtype = dtype  # of the hyper-parameter vector
        self.layout = layout  # None: the states stay per parameter
        first = members[0] if members else 0
        # the members are consecutive in the group: their gradients are a slice
        self.span = (
            (first, first + len(members))
            if members == list(range(first, first + len(members)))
            else None
        )
        self.run: Any = None
        self.state: Any = None  # the flat state buffers (with a layout)
        self.segment: Segment | None = None  # with a layout: its part of a flat call
        self.slot = 0  # with a layout: its position among the step's flat batches
        self.place: Any = None  # with a layout: where its members live
        self.held = False  # with a layout: its values are (to be) a PieceStore's pieces
        self.store: PieceStore | None = None  # that store, once the first step made it
        self.values: Any = None  # the hyper-parameter values of ``vector``
        self.vector: Any = None  # with a layout: those values, on the members' device

    def vector_of(self, values: tuple) -> Any:
        """The hyper-parameter vector of ``values`` on the members' device (one transfer
        while the values stay the same; the optimizer hands the same tuple then)."""
        if values is not self.values:
            if values != self.values:
                self.vector = jax.device_put(np.asarray(values, self.dtype), self.place)
            self.values = values
        return self.vector


class Arguments(NamedTuple):
    """What one executable call of a step takes: for a `_Batch`, its hyper-parameter
    vector, its members' values, gradients and states; for a `_Call`, one list of each,
    an entry per flat batch."""

    vector: Any
    values: Any
    grads: Any
    states: Any


class Work(NamedTuple):
    """One executable call of a step: ``run(*arguments)`` updates ``unit`` (a `_Batch`
    through `group_program`, or a `_Call` of flat batches through `flat_program`)."""

    run: Callable
    unit: Any
    arguments: Arguments


class _Flat(NamedTuple):
    """A flat batch while the checking path plans: where its members live, the batch,
    its arguments, its segment's flags and names with the state's field names, and the
    floating-point operations of its update (XLA:CPU's inline threshold)."""

    domain: Any
    batch: Any
    arguments: Arguments
    flags: tuple[tuple[str, Any], ...]
    names: tuple[str, ...]
    fields: tuple[str, ...]
    flops: float


class _Call:
    """One call of `flat_program`: flat batches of one device domain, of one or
    several groups, and the executable compiled for their last step."""

    __slots__ = ("batches", "run")

    def __init__(self, batches: list[_Batch]) -> None:
        self.batches = batches
        self.run: Any = None


class _Plan:
    """What one group's last step ran, reusable while the step's structure is the same:
    the group's parameters, which had gradients, the names and flags, the calls."""

    __slots__ = ("batches", "flags", "has_grad", "names", "nones", "params")

    def __init__(
        self,
        params: list[Parameter],
        has_grad: list[bool],
        names: tuple[str, ...],
        flags: dict[str, Any],
        batches: list[_Batch],
    ) -> None:
        self.params = params
        self.has_grad = has_grad
        self.nones = [None] * len(params)
        self.names = names
        self.flags = flags
        self.batches = batches


class EagerBackend:
    """Jitted calls of the rule per parameter group and device; state per parameter
    (held, between steps, in flat buffers per call)."""

    def __init__(self, rule: Rule, states: Mapping[Parameter, Any] | None = None) -> None:
        self.rule = rule
        # the states no batch holds in its flat buffers
        self._states: dict[Parameter, Any] = dict(states or {})
        self._packed: list[_Batch] = []  # the batches holding their members' states
        self._snapshot: dict[Parameter, Any] | None = None  # every state, until a step
        # one plan per group position, as the last step ran it; None: plan again
        self._plans: list[_Plan] | None = None
        self._calls: list[_Call] = []  # the flat calls of the plans
        self._stores: list[PieceStore] = []  # where the flat calls' values live
        self.calls = 0  # executables called by steps (for tests of the structure)

    def _all_states(self) -> dict[Parameter, Any]:
        """Every state, the flat buffers split (once until the next step)."""
        if self._snapshot is None:
            merged = dict(self._states)
            for batch in self._packed:
                merged.update(zip(batch.params, _split_states(batch.layout, batch.state)))
            self._snapshot = merged
        return self._snapshot

    def states(self) -> dict[Parameter, Any]:
        return dict(self._all_states())

    def state_of(self, param: Parameter) -> Any:
        state = self._states.get(param)
        if state is None and self._packed:
            state = self._all_states().get(param)
        return state

    def load(self, states: Mapping[Parameter, Any]) -> None:
        self._states = dict(states)
        self._packed = []
        self._snapshot = None
        self._plans = None  # new states may have another structure: plan again

    def _unpack(self) -> None:
        """Every state per parameter again, and every value in its parameter's own
        array (the checking path plans from them)."""
        if self._packed:
            self._states = self._all_states()
            self._packed = []
            self._snapshot = None
        self._release_values()

    def _release_values(self) -> None:
        for store in self._stores:
            store.release()
        self._stores = []

    def release(self) -> None:
        """Every value this backend holds back in its parameter's own array (before
        another backend takes the steps); the next step plans anew."""
        self._release_values()
        self._plans = None

    def step(self, groups: Sequence[Group]) -> None:
        work = self._replan(groups)
        if work is not None:
            try:
                # the executables check every array's shape, dtype and placement
                # before running; nothing is written until every call has returned
                results = [item.run(*item.arguments) for item in work]
            except (TypeError, ValueError):  # not the arrays they were compiled for
                work = None
        if work is None:
            self._plans = None
            self._unpack()
            work, plans = self._plan(groups)
            results = [item.run(*item.arguments) for item in work]
            self._plans = self._compile(plans, work)
            store = self._states
            calls = [item.unit for item in work if type(item.unit) is _Call]
            self._packed = [b for call in calls for b in call.batches]
            for batch in self._packed:
                for p in batch.params:
                    store.pop(p, None)
        self.calls += len(work)
        # write back
        store = self._states
        for item, (new_values, new_states) in zip(work, results):
            unit = item.unit
            if type(unit) is _Call:
                for batch, values, state in zip(unit.batches, new_values, new_states):
                    if batch.store is not None:
                        batch.store.commit(values)
                    elif batch.held:
                        self._hold(batch, values)
                    else:
                        set_values(batch.params, values)
                    batch.state = state
            else:
                set_values(unit.params, new_values)
                store.update(zip(unit.params, new_states))
        self._snapshot = None

    def _hold(self, batch: _Batch, pieces: tuple[jax.Array, ...]) -> None:
        """After the checking path's step: the batch's new values as a `PieceStore`'s
        pieces, its members moved there with their gradients."""
        assert batch.layout is not None
        params = batch.params
        store = PieceStore(params, batch.layout, pieces, grads_of(params), self)
        for index, p in enumerate(params):
            p.relocate(store, index)
        batch.store = store
        self._stores.append(store)

    def _replan(self, groups: Sequence[Group]) -> list[Work] | None:
        """The calls of a step whose structure is the last step's (``None`` if it is not
        certainly so): per batch, the executable, the batch, the hyper-parameter
        vector, the parameters' values, their gradients and states."""
        plans = self._plans
        if plans is None or len(plans) != len(groups):
            return None
        states = self._states
        work: list[Work] = []
        flat: list[Any] = [None] * len(self._packed)
        for group, plan in zip(groups, plans):
            names, values, flags = group.hyper
            params = group.params
            if not isinstance(params, list):
                params = list(params)
            if params != plan.params or names != plan.names or flags != plan.flags:
                return None
            grads = grads_of(params)
            if list(map(operator.is_not, grads, plan.nones)) != plan.has_grad:
                return None
            for batch in plan.batches:
                span = batch.span
                if span is None:
                    batch_grads = [grads[i] for i in batch.members]
                else:
                    batch_grads = grads[span[0] : span[1]]
                if batch.layout is not None:
                    vector = batch.vector if values is batch.values else batch.vector_of(values)
                    store = batch.store
                    if store is None:
                        members = values_of(batch.params)
                    elif located_in(batch.params, store):
                        members = store.pieces
                    else:  # a member moved out (a value of another shape, say)
                        return None
                    flat[batch.slot] = Arguments(vector, members, batch_grads, batch.state)
                    continue
                vector = np.asarray(values, batch.dtype)
                arguments = Arguments(
                    vector, values_of(batch.params), batch_grads, [states[p] for p in batch.params]
                )
                work.append(Work(batch.run, batch, arguments))
        for call in self._calls:
            batches = call.batches
            if len(batches) == 1:
                vector, values_, grads_, state = flat[batches[0].slot]
                work.append(Work(call.run, call, Arguments([vector], [values_], [grads_], [state])))
                continue
            parts = [flat[b.slot] for b in batches]
            work.append(Work(call.run, call, Arguments(*(list(x) for x in zip(*parts)))))
        return work

    def _plan(self, groups: Sequence[Group]) -> tuple[list[Work], list[_Plan | None]]:
        """The checking path: every gradient checked, states begun (may raise, before
        anything moved), the calls planned; the plans are ``None`` where a step must
        always take this path (sparse gradients: their indices are checked at every
        step)."""
        rule = self.rule
        tuning = policy.EAGER
        work: list[Work] = []
        plans = []
        flat: list[_Flat] = []
        calls_args: list[tuple[_Call, list[_Flat]]] = []
        for group in groups:
            all_params = list(group.params)
            grads = [p.grad for p in all_params]
            has_grad = [g is not None for g in grads]
            names, values, flags = group.hyper
            sparse = False
            for p, grad in zip(all_params, grads):
                if grad is None:
                    continue
                check_grad(grad, p.shape, p.dtype)
                if is_sparse(grad):
                    sparse = True
                    check_sparse_grad(rule, group.options, grad, p.shape)
            positions = [i for i, has in enumerate(has_grad) if has]
            params = [all_params[i] for i in positions]
            batches_: list[_Batch] = []
            plans.append(None if sparse else _Plan(all_params, has_grad, names, flags, batches_))
            if not params:
                continue
            fresh = any(p not in self._states for p in params)
            start = packed_hyper(rule, group.start) if fresh else {}
            states = [begin(rule, flags, start, self._states.get(p), p.data) for p in params]
            key = tuple(sorted(flags.items()))
            program = group_program(rule, key, names)
            # one call per device domain (arrays on different devices cannot meet); an
            # elementwise rule's parameters whose states can be laid end to end, per kind
            calls: dict[Any, list[int]] = {}
            for i, p in enumerate(params):
                kind = None
                if tuning.flat and not sparse and p.size <= tuning.small:
                    kind = _flat_kind(rule, states[i], p.data)
                members = calls.setdefault((device_domain(p.data), kind), [])
                members.append(i)
            for key_, members in list(calls.items()):
                if key_[1] is not None and len(members) > tuning.chunk:
                    del calls[key_]
                    for k in range(0, len(members), tuning.chunk):
                        calls[(*key_, k)] = members[k : k + tuning.chunk]
            wide = set()
            for (domain, *_), members in calls.items():
                if any(compute_dtype(params[i].dtype) == np.float64 for i in members):
                    wide.add(domain)
            for (domain, kind, *_), members in calls.items():
                dtype = np.float64 if domain in wide else np.float32
                member_states = [states[i] for i in members]
                batch = _Batch(
                    [positions[i] for i in members],
                    [params[i] for i in members],
                    dtype,
                    None,
                )
                batches_.append(batch)
                args = Arguments(
                    np.asarray(values, dtype),
                    [p.data for p in batch.params],
                    [grads[positions[i]] for i in members],
                    member_states,
                )
                if kind is None:
                    work.append(Work(program, batch, args))
                else:
                    first = members[0]
                    flops = sum(p.size for p in batch.params) * _update_flops(
                        rule, key, names, args.vector, params[first].data, states[first]
                    )
                    fields = states[first]._fields
                    flat.append(_Flat(domain, batch, args, key, names, fields, flops))
        # the flat batches in calls of at most `Policy.chunk` parameters, per device domain, in
        # order (several small groups share one call)
        self._calls = []
        open_calls: dict[Any, tuple[_Call, list[_Flat]]] = {}
        for slot, entry in enumerate(flat):
            batch = entry.batch
            batch.slot = slot
            current = open_calls.get(entry.domain)
            if (
                current is None
                or sum(len(b.params) for b in current[0].batches) + len(batch.params) > tuning.chunk
            ):
                current = (_Call([]), [])
                open_calls[entry.domain] = current
                self._calls.append(current[0])
                calls_args.append(current)
            current[0].batches.append(batch)
            current[1].append(entry)
        for call, parts in calls_args:
            # a call XLA:CPU would run inline (on this thread) keeps every member's state
            # fields apart (XLA counts a cut of a flat buffer as the whole buffer's work)
            inline = sum(entry.flops for entry in parts) < tuning.inline_flops
            arguments = []
            for batch, entry in zip(call.batches, parts):
                vector, values_, grads_, member_states = entry.arguments
                layout = FlatLayout(
                    tuple(tuple(p.shape) for p in batch.params),
                    tuple(name in rule.fields.scalar for name in entry.fields),
                    tuple(range(len(batch.params))) if inline else _starts(batch.params),
                )
                batch.layout = layout
                # the values go to a store of this backend's, unless a member lives in
                # another live optimizer's storage (then it is read and written there)
                batch.held = all(free(p.location[0]) for p in batch.params)
                batch.segment = Segment(entry.flags, entry.names, layout, batch.held)
                batch.place = values_[0].sharding
                if batch.held:
                    values_ = joiner(layout)(values_)
                joined = _state_joiner(layout)(member_states)
                arguments.append(Arguments(vector, values_, grads_, joined))
            segments = tuple(b.segment for b in call.batches)
            # donated: this path's flat states and pieces are new copies (`self._states`
            # is not touched until every call has returned)
            program = flat_program(rule, segments, True)
            work.append(Work(program, call, Arguments(*(list(x) for x in zip(*arguments)))))
        return work, plans

    def _compile(self, plans: list[_Plan | None], work: list[Work]) -> list[_Plan] | None:
        """The plans for the next step, their executables the programs this step ran,
        compiled for its arrays (jax's caches make this a look-up); ``None`` where a
        group must take the checking path at every step."""
        if any(plan is None for plan in plans):
            return None
        last = len(work) - 1
        for k, (program, unit, args) in enumerate(work):
            if type(unit) is _Call and k != last:
                # only a step's last call donates its states: a call refused for its
                # arguments (a gradient of another shape, say) runs nothing, so the
                # calls before it must leave their inputs intact for the checking path
                program = flat_program(self.rule, tuple(b.segment for b in unit.batches))
            unit.run = program.lower(*args).compile()
        return plans  # type: ignore[return-value]
