"""The compiled backend's programs: the rule over buckets, as one jitted function.

A program is made from hashable descriptions only (the rule, one `Plan` per
bucket, the loss function and its call structure for a fused step), never
from a backend, so identical structures share one program and its compiled
executables across optimizers (a bounded cache), and nothing a program holds
keeps an optimizer alive.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ..._platform import shard_map
from ..._storage import cut_views
from ...functional._apply import apply_leaf, apply_leaves, apply_stacked, batch_key, stack_class
from ...functional.rule import Rule
from .sharding import RowShard, shard_count, state_entry_sharding

PROGRAMS_KEPT = 64  # distinct structures whose programs stay compiled


class Plan(NamedTuple):
    """What a program needs to know about one bucket (hashable: part of its key).

    Attributes:
      flags: the group's static options, sorted ``(name, value)`` pairs.
      wide: the hyper-parameters come from the float64 vector.
      start: the position of the bucket's first hyper-parameter in its vector.
      names: the hyper-parameters' names, in vector order.
      shard: for sharded state (ZeRO-1), ``(length, padded length, state
        sharding, value sharding)``, or, for a rule over whole parameters, a
        `lucid.optim._engine.sharding.RowShard`; else ``None``.
    """

    flags: tuple
    wide: bool
    start: int
    names: tuple[str, ...]
    shard: Any = None


def _hyper_of(plan: Plan, hyper32: jax.Array, hyper64: Any) -> dict[str, jax.Array]:
    vector = hyper64 if plan.wide else hyper32
    return {name: vector[plan.start + i] for i, name in enumerate(plan.names)}


def _apply_sharded(rule: Rule, plan: Plan, hyper: dict, value, grad, state):
    """One bucket with sharded state (ZeRO-1): the replicated value and gradient are cut
    to the state's pieces (padded as it is), each device updates its piece, and the new
    value is gathered back to every device; the collectives are XLA's."""
    if isinstance(plan.shard, RowShard):
        return _apply_by_rows(rule, plan, hyper, value, grad, state)
    length, padded, over, whole = plan.shard
    constrain = jax.lax.with_sharding_constraint

    def spread(x: jax.Array) -> jax.Array:
        return constrain(jnp.pad(x, (0, padded - length)), over)

    spread_grad = jax.tree_util.tree_map(spread, grad)  # a `Present` gradient: both parts
    new_value, new_state = apply_leaf(
        rule, dict(plan.flags), hyper, spread(value), spread_grad, state
    )
    new_state = jax.tree_util.tree_map(lambda s: constrain(s, over) if s.ndim else s, new_state)
    return constrain(new_value, whole)[:length], new_state


def _apply_by_rows(rule: Rule, plan: Plan, hyper: dict, value, grad, state):
    """A parameter alone (a rule over whole parameters: block-wise quantized state...),
    replicated, with sharded state: the value, the gradient and every state array cut
    along their first axis where it divides evenly (`RowShard.cut`), the rule
    partitioned by XLA, the new value gathered back to every device."""
    cut = functools.partial(jax.tree_util.tree_map, plan.shard.cut)
    new_value, new_state = apply_leaf(
        rule, dict(plan.flags), hyper, cut(value), cut(grad), cut(state)
    )
    return jax.lax.with_sharding_constraint(new_value, plan.shard.whole), cut(new_state)


def _apply_whole_per_device(
    rule: Rule, flags: dict, shard: RowShard, hypers: list, values, grads, states
) -> list[tuple[Any, Any]]:
    """Same-shaped parameters (one `batch_key` class), replicated, with sharded state, of a
    rule that updates them whole (`Execution.whole_per_device`: Muon, SOAP, Shampoo, Kron):

    [Step 1] the ``K`` members are stacked (`stack_class`) with zero matrices to make a
    multiple of the ``D`` devices of ``shard.axes``;
    [Step 2] device ``d`` takes members ``d·K'/D … (d+1)·K'/D - 1`` (``K'`` padded) whole,
    and updates them (`apply_stacked`) inside `shard_map`: no collective inside the
    update; the state moves from its rows (as it is kept) to these members and back;
    [Step 3] the new values are gathered to every device, once for the class.

    Returns each member's ``(new value, new state)``."""
    mesh, axes = shard.whole.mesh, shard.axes
    dealt = NamedSharding(mesh, PartitionSpec(axes))
    count, devices = len(values), shard_count(dealt)
    padded = -(-count // devices) * devices
    constrain = jax.lax.with_sharding_constraint

    def by_rows(x: jax.Array) -> jax.Array:
        """A stacked state field placed as its members' are kept: each member's rows
        spread (`RowShard.cut`), so that one all-to-all moves it to or from `dealt`."""
        kept = state_entry_sharding(shard.whole, tuple(x.shape[1:]), axes)
        return constrain(x, NamedSharding(mesh, PartitionSpec(None, *kept.spec)))

    # zero matrices (with zero states and the first member's hyper-parameters) fill the
    # batch up to `padded`; their updates are dropped
    fill = padded - count
    stacked = stack_class(
        [*hypers, *[hypers[0]] * fill],
        [*values, *[jnp.zeros_like(values[0])] * fill],
        [*grads, *[jnp.zeros_like(grads[0])] * fill],
        [*states, *[jax.tree_util.tree_map(jnp.zeros_like, states[0])] * fill],
    )
    whole = NamedSharding(mesh, PartitionSpec())

    def deal(x: jax.Array) -> jax.Array:
        """A stack of replicated members dealt out (placed replicated first: without it
        jax 0.4.35's partitioner sums each member over a second mesh axis)."""
        return constrain(constrain(x, whole), dealt)

    stacked = stacked._replace(
        varying=jax.tree_util.tree_map(deal, stacked.varying),
        params=deal(stacked.params),
        grads=deal(stacked.grads),
        states=jax.tree_util.tree_map(lambda x: constrain(by_rows(x), dealt), stacked.states),
    )
    spec = PartitionSpec(axes)
    specs = type(stacked)(PartitionSpec(), spec, spec, spec, spec)
    run = shard_map(
        functools.partial(apply_stacked, rule, flags),
        mesh=mesh,
        in_specs=(specs,),
        out_specs=(spec, spec),
    )
    new_values, new_states = run(stacked)
    new_values = constrain(new_values[:count], shard.whole)
    new_states = jax.tree_util.tree_map(lambda x: by_rows(x[:count]), new_states)
    return [
        (new_values[i], jax.tree_util.tree_map(lambda x, i=i: shard.cut(x[i]), new_states))
        for i in range(count)
    ]


def placements(arrays: list) -> tuple:
    """Each array's sharding (``None`` for one that is not a jax array): hashable, a
    static argument of `Placed`."""
    return tuple(getattr(a, "sharding", None) if isinstance(a, jax.Array) else None for a in arrays)


class Placed:
    """``jax.jit(fn)`` whose ``fn`` also receives, as the static keyword ``places``,
    the shardings of the arrays in its positional argument ``at`` (a list): inside
    the trace they cannot be read, and `apply_leaves` batches only values placed
    alike, so that every output keeps its input's sharding. Called and lowered as
    the jitted function it wraps."""

    def __init__(self, fn: Callable, at: int, **jit_options: Any) -> None:
        self._jitted = jax.jit(fn, static_argnames=("places",), **jit_options)
        self._at = at

    def __call__(self, *args: Any) -> Any:
        return self._jitted(*args, places=placements(args[self._at]))

    def lower(self, *args: Any) -> Any:
        """The lowered program for these arguments (``jax.jit(...).lower``)."""
        return self._jitted.lower(*args, places=placements(args[self._at]))


def jit_placed(rule: Rule, fn: Callable, at: int, **jit_options: Any) -> Callable:
    """`Placed` for a ``batched`` rule (whose batching reads the placements); for any
    other rule ``jax.jit(fn)``, with no placements read at each call."""
    if rule.execution.batched:
        return Placed(fn, at, **jit_options)
    return jax.jit(fn, **jit_options)


def apply_buckets(
    rule: Rule,
    plans: tuple,
    hyper32: Any,
    hyper64: Any,
    values,
    grads,
    states,
    places: tuple | None = None,
):
    """The rule over every bucket (traced): new values and states.

    Buckets with sharded state (ZeRO-1: flat buckets of an elementwise rule, or one
    parameter of another rule with its state cut by rows) are updated one by one, except
    a class of whole parameters of an `Execution.whole_per_device` rule, which is dealt
    out to the devices (`_apply_whole_per_device`);
    all others go to `apply_leaves` together, which for a ``batched`` rule updates
    same-shaped buckets (each one parameter of a rule that is not elementwise) in
    one batched call, their hyper-parameters stacked where the buckets' groups
    differ; ``places``: each bucket's value sharding (`Placed`), so that only
    buckets placed alike are stacked."""
    n = len(plans)
    new_values: list[Any] = [None] * n
    new_states: list[Any] = [None] * n
    rest = []
    dealt: dict[Any, list[tuple[int, dict]]] = {}  # whole parameters dealt out to devices
    for i, (plan, value, grad, state) in enumerate(zip(plans, values, grads, states)):
        hyper = _hyper_of(plan, hyper32, hyper64)
        key = None
        if isinstance(plan.shard, RowShard) and rule.execution.whole_per_device:
            key = batch_key(dict(plan.flags), hyper, value, grad, state)
        if key is not None:
            dealt.setdefault((key, plan.shard), []).append((i, hyper))
        elif plan.shard is not None:
            new_values[i], new_states[i] = _apply_sharded(rule, plan, hyper, value, grad, state)
        else:
            rest.append((i, dict(plan.flags), hyper))
    for (_, shard), members in dealt.items():
        outs = _apply_whole_per_device(
            rule,
            dict(plans[members[0][0]].flags),
            shard,
            [hyper for _, hyper in members],
            [values[i] for i, _ in members],
            [grads[i] for i, _ in members],
            [states[i] for i, _ in members],
        )
        for (i, _), (new_value, new_state) in zip(members, outs):
            new_values[i], new_states[i] = new_value, new_state
    if rest:
        outs = apply_leaves(
            rule,
            [flags for _, flags, _ in rest],
            [hyper for _, _, hyper in rest],
            [values[i] for i, _, _ in rest],
            [grads[i] for i, _, _ in rest],
            [states[i] for i, _, _ in rest],
            None if places is None else [places[i] for i, _, _ in rest],
        )
        for (i, _, _), new_value, new_state in zip(rest, *outs):
            new_values[i], new_states[i] = new_value, new_state
    return new_values, new_states


_UNSIGNED = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def rounded(tree: Any, zero: jax.Array) -> Any:
    """``tree``'s floating-point arrays unchanged, each computed and rounded to its dtype
    before anything reads it, as if it were a separate program's output.

    XLA fuses a program's elementwise operations, and LLVM then contracts a multiply that
    feeds an add into one fused multiply-add (one rounding instead of two) and XLA may
    move a scaling into the operation that made its operand (a scatter's updates): so a
    gradient computed, transformed and applied in one program can round differently from
    the same steps run as separate programs (the eager loop's `backward`, `clip_grad_norm_`
    and `step`). An `optimization_barrier` does not stop this on the CPU, where XLA drops
    barriers before fusing. Passing each array's bits through an integer ``xor`` with
    ``zero`` (a runtime 0 of the program's inputs, which XLA cannot fold away) does: the
    value is unchanged, and no float operation on either side can be fused into one
    rounding with one on the other.
    """

    zero = jnp.reshape(zero, ())

    def fence(x: Any) -> Any:
        if not isinstance(x, jax.Array) or not jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            return jax.lax.complex(fence(jnp.real(x)), fence(jnp.imag(x)))
        bits = _UNSIGNED[x.dtype.itemsize]
        through = jax.lax.bitcast_convert_type(x, bits) ^ zero.astype(bits)
        return jax.lax.bitcast_convert_type(through, x.dtype)

    return jax.tree_util.tree_map(fence, tree)


def checked_gradients(transformed: Any, grads: list) -> list:
    """``grad_transform``'s output, checked to be one gradient per parameter, each of its
    gradient's shape and dtype.

    Raises:
      ValueError: anything else (a transform that drops or reshapes a gradient would
        otherwise leave parameters updated with raw or mismatched gradients).
    """
    if not isinstance(transformed, list | tuple) or len(transformed) != len(grads):
        got = len(transformed) if isinstance(transformed, list | tuple) else type(transformed)
        raise ValueError(
            f"grad_transform must return a list of {len(grads)} gradients (one per parameter, "
            f"in the optimizer's order), but returned {got!r}"
        )
    for i, (new, old) in enumerate(zip(transformed, grads)):
        if jnp.shape(new) != jnp.shape(old) or jnp.result_type(new) != jnp.result_type(old):
            raise ValueError(
                f"grad_transform returned a gradient of shape {jnp.shape(new)} and dtype "
                f"{jnp.result_type(new)} for parameter {i}, whose gradient is "
                f"{jnp.shape(old)} {jnp.result_type(old)}"
            )
    return list(transformed)


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def step_program(rule: Rule, plans: tuple[Plan, ...]) -> Callable:
    """``(hyper32, hyper64, values, grads, states) -> (values, states)``, the values and
    states donated (updated in place)."""

    def step(hyper32, hyper64, values, grads, states, places=None):
        return apply_buckets(rule, plans, hyper32, hyper64, values, grads, states, places)

    return jit_placed(rule, step, 2, donate_argnums=(2, 4))


def cut(buffers: Sequence[Any], layouts: Sequence[Any], offsets: Sequence[Any]) -> list:
    """Each buffer as its parameters' views (traced), `lucid._storage.cut_views`: at its
    run-time ``offsets`` (one compiled cut per distinct shape), or, where those are
    ``None``, at its layout's constant offsets."""
    return list(map(cut_views, buffers, layouts, offsets))


def _transformed(
    grad_transform: Any,
    order: tuple,
    layouts: tuple,
    offsets: tuple,
    zero: Any,
    grads,
    values,
    state,
) -> tuple[list, Any]:
    """``grad_transform`` over the buckets' flat gradients ``grads`` (traced) as
    per-parameter gradients in the optimizer's ``order`` (``(bucket, index)`` each), with
    the parameters' views of ``values`` (both cut at ``offsets``, `cut`); the new
    gradients `rounded` and laid out as the buckets' again, and the transform's new
    state."""
    view_grads = [list(views) for views in cut(grads, layouts, offsets)]
    views = cut(values, layouts, offsets)
    grads_list = [view_grads[b][i] for b, i in order]
    new_list, state = grad_transform.update(grads_list, state, [views[b][i] for b, i in order])
    grads_list = rounded(checked_gradients(new_list, grads_list), zero)
    for (b, i), grad in zip(order, grads_list):
        view_grads[b][i] = grad
    return [layout.join(g) for g, layout in zip(view_grads, layouts)], state


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def transformed_step_program(
    rule: Rule, plans: tuple[Plan, ...], grad_transform: Any, layouts: tuple, order: tuple
) -> Callable:
    """``(hyper32, hyper64, zero, values, grads, states, transform_state, offsets) ->
    (values, states, transform_state)``: ``grad_transform`` over the gradients
    (`_transformed`; ``offsets``: the buckets' run-time offsets, `cut`), then
    `step_program`'s update; the values and states donated.

    A fused step with a ``grad_transform`` runs its gradients' program (`fused_program`
    without the update) and then this one, so the transform reads the gradients as
    `lucid.nn.utils` reads a compiled optimizer's: from flat buffers, each a program's
    input. Inside one program XLA may lay a gradient out in another order (a matrix
    product's result transposed), and a norm summed over it then rounds differently."""

    def step(hyper32, hyper64, zero, values, grads, states, transform_state, offsets, places=None):
        grads, transform_state = _transformed(
            grad_transform, order, layouts, offsets, zero, grads, values, transform_state
        )
        new_values, new_states = apply_buckets(
            rule, plans, hyper32, hyper64, values, grads, states, places
        )
        return new_values, new_states, transform_state

    return jit_placed(rule, step, 3, donate_argnums=(3, 5))


def constant_layouts(static: tuple, sources: tuple) -> list:
    """The layouts of a fused call's constant storages (those not among the buckets), in
    the call's order: ``static`` is `lucid._backward.partition`'s, ``sources`` per storage
    ``("bucket", index)`` or ``("const", position)``."""
    return [static[3][i] for i, source in enumerate(sources) if source[0] == "const"]


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def fused_program(
    rule: Rule,
    loss_fn: Callable,
    structure: tuple,
    plans: tuple,
    has_aux: bool = False,
    accumulate: int | None = None,
    fixed: int = 0,
    update: bool = True,
) -> Callable:
    """Forward, backward and update of every bucket in one program:
    ``(hyper32, hyper64, zero, values, states, consts, arrays, offsets) -> (out, values,
    states)``, the values and states donated. Without ``update``, forward and backward
    only: ``(zero, values, consts, arrays, offsets) -> (out, grads)``, the gradients laid
    out as the buckets' values (the first program of a fused step with a
    ``grad_transform``, whose second is `transformed_step_program`). ``offsets``: the
    run-time offsets of the buckets' and the constants' buffers, ``(buckets', consts')``
    (`cut`).

    The gradients are `rounded` with ``zero`` (a runtime 0, `numpy.uint32`) before
    anything else reads them, so the step gives the numbers of `backward` and `step` run
    one after the other. Without ``update`` or ``accumulate`` nothing computes with them
    in the program (they are laid out and returned, rounded as any output is), and they
    are not: the fence is 3 operations a parameter for XLA to compile (on the CPU, the
    27M GPT's program compiled in 4.3 s instead of 4.8 s, medians of 3).

    ``structure`` is ``(static, sources, layouts)``: the call's static part
    (`lucid._backward.partition`), where each storage of the call comes from (a
    bucket, or a constant), and the buckets' layouts.

    With ``accumulate=N``, the call's arrays after the first ``fixed`` (those of the
    tree) carry a leading micro-batch axis of size N: a ``jax.lax.scan`` over it sums
    the gradients of ``loss / N`` in one gradient carry (torch's accumulation loop),
    and the loss returned is the sum of the ``loss / N``; ``aux`` is stacked."""
    from ..._backward import one_element, rebuild_from_views, split_aux

    static, sources, layouts = structure
    const_layouts = constant_layouts(static, sources)

    def gradients(zero, values, consts, arrays, offsets):
        """``(loss, aux)`` and the gradients, laid out as the buckets' values."""
        bucket_offsets, const_offsets = offsets
        const_views = cut(consts, const_layouts, const_offsets)

        def grads_of(bucket_views, arrays):
            def loss_of(bucket_views):
                const_it = iter(const_views)
                views = [
                    bucket_views[source[1]] if source[0] == "bucket" else next(const_it)
                    for source in sources
                ]
                tree, args, kwargs = rebuild_from_views(static, views, arrays)
                loss, aux = split_aux(loss_fn(tree, *args, **kwargs), has_aux)
                scaled = one_element(loss)
                if accumulate is not None:
                    loss = loss / accumulate
                    scaled = scaled / accumulate  # torch's `(loss / N).backward()`
                return scaled, (loss, aux)  # a one-element loss, returned in its shape

            (_, out), grads = jax.value_and_grad(loss_of, has_aux=True)(bucket_views)
            if update or accumulate is not None:  # as `backward` leaves them
                grads = rounded(grads, zero)
            return out, grads

        bucket_views = cut(values, layouts, bucket_offsets)
        if accumulate is None:
            (loss, aux), view_grads = grads_of(bucket_views, arrays)
        else:
            kept = list(arrays[:fixed])

            def micro(acc, batch):
                out, grads = grads_of(bucket_views, kept + list(batch))
                return jax.tree_util.tree_map(jnp.add, acc, grads), out

            zeros = jax.tree_util.tree_map(jnp.zeros_like, bucket_views)
            view_grads, (losses, aux) = jax.lax.scan(
                micro, zeros, list(arrays[fixed:]), length=accumulate
            )
            loss = losses[0]
            for i in range(1, accumulate):  # in order, as the loop's running sum
                loss = loss + losses[i]
        grads = [layout.join(g) for g, layout in zip(view_grads, layouts)]
        return ((loss, aux) if has_aux else loss), grads

    if not update:

        def forward_backward(zero, values, consts, arrays, offsets, places=None):
            return gradients(zero, values, consts, arrays, offsets)

        return jit_placed(rule, forward_backward, 1)

    def fused(hyper32, hyper64, zero, values, states, consts, arrays, offsets, places=None):
        out, grads = gradients(zero, values, consts, arrays, offsets)
        # the update writes the donated value buffers in place; the loss reads
        # them too, but need not be inputs of the update (a gradient may not depend on
        # every read), so without this data dependency XLA may not order those reads
        # first and copies the whole buffer instead (an identity: numbers unchanged;
        # XLA:CPU drops the barrier and keeps its copy)
        out, values = jax.lax.optimization_barrier((out, values))
        new_values, new_states = apply_buckets(
            rule, plans, hyper32, hyper64, values, grads, states, places
        )
        return out, new_values, new_states

    return jit_placed(rule, fused, 3, donate_argnums=(3, 4))
