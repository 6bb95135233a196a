"""``compile_optimizer`` and ``fused_step``: the whole step as one XLA executable.

The compiled step owns its optimizer's parameters and state. Parameters are
grouped into *buckets* -- same param group, dtype and device, and identical
per-parameter scalar state (``step``, ``eta``...) -- and each bucket keeps its
values, gradients and state in flat buffers (:mod:`lucid.optim._store`;
sharded parameters keep their own shape and sharding instead). One jitted
function applies the optimizer's rule to every bucket, with:

* the hyper-parameters read from ``param_groups`` at every step and fed as one
  runtime vector (``1 - beta`` computed in double on the host), so schedulers
  and hand edits never recompile; step-dependent factors come from the
  ``step`` kept on the device;
* the value and state buffers donated, so the update happens in place;
* only a change of structure (a new group, shape, dtype or flag, or a bucket
  whose parameters stop having gradients together) building a new executable.

Checkpoints stay in the eager format: ``state_dict()`` cuts the buffers back
into per-parameter entries, ``load_state_dict()`` validates with the eager
rules and lays the result out again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._layout import join_views, views_of
from .._parameter import Parameter, leaves_from, partition
from ..functional._rule import Rule, apply_leaf, hyper_values
from ._store import Store, dense, placement
from .optimizer import Optimizer


@dataclasses.dataclass(eq=False)  # buckets compare by identity
class _Bucket:
    """Parameters updated together, and their state laid out as their store's values."""

    store: Store
    group: int
    state: Any  # the rule's state NamedTuple: buffers, and 0-d scalars
    stepped: bool  # False until the first update: torch shows no state before it


class _Plan(NamedTuple):
    """What the executable needs to know about one bucket (hashable: part of the cache key)."""

    flags: tuple
    wide: bool  # hyper-parameters from the float64 vector
    start: int
    names: tuple[str, ...]


class _Entry(NamedTuple):
    param: Parameter
    group: int
    value: jax.Array
    grad: Any
    state: Any
    stepped: bool


class _CompiledStepBase:
    """The compiled form of one optimizer; see the module docstring.

    Exposes torch's API: ``step``, ``zero_grad``, ``param_groups``, ``state``,
    ``state_dict``, ``load_state_dict``.
    """

    optimizer_class: ClassVar[type[Optimizer]]

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self.rule: Rule = optimizer.rule
        self._buckets: list[_Bucket] = []
        self._executables: dict[Any, Callable] = {}
        self._device_vectors: dict[type, tuple[list[float], jax.Array]] = {}
        self._build(self._entries(self._adoptable_states()))

    # ------------------------------------------------------------ the API
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @property
    def state(self) -> dict[Parameter, dict[str, Any]]:
        """Per-parameter state with torch's names (a snapshot of the buffers)."""
        return self._per_param_states()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for bucket in self._buckets:
            bucket.store.clear_grads(set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every bucket whose parameters all have gradients."""
        loss = closure() if closure is not None else None
        active = [b for b in self._buckets if b.store.has_grad.all()]
        if len(active) < len(self._buckets):
            if any(b.store.has_grad.any() for b in self._buckets if b not in active):
                self._rebuild()  # some parameters of a bucket lost their gradient: split it
                active = [b for b in self._buckets if b.store.has_grad.all()]
            if not active:
                return loss
        plans, hyper32, hyper64 = self._hyper(active)
        run = self._executable(("step", plans), lambda: _step_function(self.rule, plans))
        values, states = run(
            hyper32,
            hyper64,
            [b.store.values for b in active],
            [b.store.grads for b in active],
            [b.state for b in active],
        )
        self._commit(active, values, states)
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer._state_dict_from(self._per_param_states())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Validate with the eager rules (nothing changes on error), then lay out again."""
        groups, states = self.optimizer._validated(state_dict, self._import_state)
        self.optimizer._set_groups(groups)
        self._rebuild(states)

    # ------------------------------------------------------------ layout
    def _adoptable_states(self) -> dict[Parameter, dict[str, Any]]:
        """The eager state the compiled step takes over."""
        return self.optimizer._state

    def _import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> dict:
        return self.optimizer._import_state(group, p, saved, key)

    def _entries(self, states: Mapping[Parameter, Mapping[str, Any]]) -> list[_Entry]:
        """Every (detached) parameter with its value, gradient and state."""
        entries = []
        for index, group in enumerate(self.optimizer.param_groups):
            for p in group["params"]:
                value, grad = p.data, p.grad
                saved = states.get(p)
                if saved:
                    state = self.rule.state(**{f: saved.get(f) for f in self.rule.state._fields})
                else:
                    state = self.optimizer._initial_state(group, p)
                entries.append(_Entry(p, index, value, grad, state, bool(saved)))
        return entries

    def _current_arrays(self) -> dict[Parameter, tuple[jax.Array, Any]]:
        """Per-parameter values and gradients cut from the buffers (one dispatch each)."""
        arrays = {}
        for bucket in self._buckets:
            store = bucket.store
            values = store.views(store.values)
            grads = store.views(store.grads) if store.grads is not None else [None] * len(values)
            for i, p in enumerate(store.params):
                arrays[p] = (values[i], grads[i] if store.has_grad[i] else None)
        return arrays

    def _bucket_key(self, entry: _Entry) -> tuple:
        scalars = tuple(
            (name, None if value is None else float(value))
            for name, value in zip(entry.state._fields, entry.state)
            if name in self.rule.scalar_state
        )
        fields = tuple(value is None for value in entry.state)
        where = placement(entry.value)
        if where[0] is None:  # a sharding no flat buffer can keep: the parameter alone
            where = (("alone", id(entry.param)), 1, None)
        return (
            entry.group,
            str(entry.value.dtype),
            where,
            entry.stepped,
            scalars,
            fields,
            entry.grad is not None,
        )

    def _build(self, entries: list[_Entry]) -> None:
        """Lay ``entries`` out into buckets and hand the parameters to their stores."""
        keyed: dict[tuple, list[_Entry]] = {}
        for entry in entries:
            keyed.setdefault(self._bucket_key(entry), []).append(entry)
        buckets = []
        for key, members in keyed.items():
            where, rows, sharding = key[2]
            flat = where[0] != "alone"
            values = [e.value for e in members]
            store = Store([e.param for e in members], values, flat, rows, sharding)
            grads = [e.grad for e in members]
            if all(g is not None for g in grads):
                store.grads = store.like([jnp.asarray(dense(g), store.dtype) for g in grads])
                store.has_grad[:] = True
            first = members[0].state
            state = type(first)(
                *(
                    None
                    if value is None
                    else jnp.array(value, copy=True)
                    if name in self.rule.scalar_state
                    else store.like([getattr(e.state, name) for e in members])
                    for name, value in zip(first._fields, first)
                )
            )
            buckets.append(_Bucket(store, key[0], state, members[0].stepped))
        self._buckets = buckets
        for bucket in buckets:
            for index, p in enumerate(bucket.store.params):
                p._attach(bucket.store, index)
            bucket.store.on_restructure = self._restructure

    def _detach_all(self) -> None:
        """Give every parameter its value and gradient back as plain arrays."""
        for p, (value, grad) in self._current_arrays().items():
            p._detach(value, grad)
        self._buckets = []

    def _rebuild(self, states: Mapping[Parameter, Mapping[str, Any]] | None = None) -> None:
        """Lay everything out again (after a change of structure, or a load)."""
        states = self._per_param_states() if states is None else states
        self._detach_all()
        self._build(self._entries(states))

    def _structure_changed(self) -> None:
        """Called by the optimizer when a param group is added."""
        self._rebuild()

    def _restructure(self, store: Store, index: int, value: jax.Array) -> None:
        """A parameter got a value of a new shape or dtype: lay everything out again."""
        p = store.params[index]
        states = self._per_param_states()
        if states.get(p):
            raise ValueError(
                f"this parameter has optimizer state for shape {store.shapes[index]} "
                f"{store.dtype}; a {tuple(value.shape)} {value.dtype} value does not fit it"
            )
        self._detach_all()
        p._detach(value, None)
        self._build(self._entries(states))

    def _per_param_states(self) -> dict[Parameter, dict[str, Any]]:
        states: dict[Parameter, dict[str, Any]] = {}
        for bucket in self._buckets:
            if not bucket.stepped:
                continue
            n = len(bucket.store.params)
            # scalars are copied: the bucket's own are donated to the next step
            columns = {
                name: [jnp.array(value, copy=True)] * n
                if name in self.rule.scalar_state
                else bucket.store.views(value)
                for name, value in zip(bucket.state._fields, bucket.state)
                if value is not None
            }
            for i, p in enumerate(bucket.store.params):
                states[p] = {name: column[i] for name, column in columns.items()}
        return states

    # ------------------------------------------------------------ running
    def _hyper(self, buckets: list[_Bucket]) -> tuple[tuple[_Plan, ...], np.ndarray, Any]:
        """The buckets' hyper-parameters as one float32 (and one float64) vector."""
        plans, narrow, wide = [], [], []
        for bucket in buckets:
            names, values, flags = hyper_values(
                self.rule, self.optimizer.param_groups[bucket.group]
            )
            is_wide = bucket.store.wide
            target = wide if is_wide else narrow
            plans.append(_Plan(tuple(sorted(flags.items())), is_wide, len(target), names))
            target.extend(values)
        return tuple(plans), self._on_device(narrow, np.float32), self._on_device(wide, np.float64)

    def _on_device(self, values: list[float], dtype: type) -> Any:
        """``values`` as a device array, reusing the last one when nothing changed
        (a host-to-device copy is the largest fixed cost of a small step)."""
        if not values:
            return None
        cached = self._device_vectors.get(dtype)
        if cached is not None and cached[0] == values:
            return cached[1]
        array = jax.device_put(np.asarray(values, dtype))
        self._device_vectors[dtype] = (values, array)
        return array

    def _executable(self, key: Any, make: Callable[[], Callable]) -> Callable:
        if key not in self._executables:
            self._executables[key] = make()
        return self._executables[key]

    def _commit(self, buckets: list[_Bucket], values: list, states: list) -> None:
        for bucket, value, state in zip(buckets, values, states):
            bucket.store.replace_values(value)
            bucket.state = state
            bucket.stepped = True

    def _fused(self, loss_fn: Callable, tree: Any, args: tuple, kwargs: dict) -> jax.Array:
        """Forward, backward and update of every bucket in one executable."""
        dynamic, static, _, stores = partition(tree, args, kwargs)
        position = {id(b.store): i for i, b in enumerate(self._buckets)}
        if any(id(s) not in position for s in stores):
            raise ValueError("fused_step: the model holds parameters of another compiled optimizer")
        treedef, kinds, static_leaves, _ = static
        kinds = tuple(
            ("stored", position[id(stores[k[1]])], k[2]) if k[0] == "stored" else k for k in kinds
        )
        layouts = tuple(b.store.layout for b in self._buckets)
        plans, hyper32, hyper64 = self._hyper(self._buckets)
        structure = (treedef, kinds, static_leaves, layouts)
        key = ("fused", loss_fn, structure, plans)
        run = self._executable(key, lambda: _fused_function(self.rule, loss_fn, structure, plans))
        loss, values, states = run(
            hyper32,
            hyper64,
            [b.store.values for b in self._buckets],
            [b.state for b in self._buckets],
            dynamic[0],
            dynamic[2],
        )
        self._commit(self._buckets, values, states)
        return loss


def _hyper_of(plan: _Plan, hyper32: jax.Array, hyper64: Any) -> dict[str, jax.Array]:
    vector = hyper64 if plan.wide else hyper32
    return {name: vector[plan.start + i] for i, name in enumerate(plan.names)}


def _step_function(rule: Rule, plans: tuple[_Plan, ...]) -> Callable:
    def step(hyper32, hyper64, values, grads, states):
        new_values, new_states = [], []
        for plan, value, grad, state in zip(plans, values, grads, states):
            hyper = _hyper_of(plan, hyper32, hyper64)
            new_value, new_state = apply_leaf(rule, dict(plan.flags), hyper, value, grad, state)
            new_values.append(new_value)
            new_states.append(new_state)
        return new_values, new_states

    return jax.jit(step, donate_argnums=(2, 4))


def _fused_function(rule: Rule, loss_fn: Callable, structure: tuple, plans: tuple) -> Callable:
    treedef, kinds, static_leaves, layouts = structure

    def fused(hyper32, hyper64, values, states, free_values, arrays):
        def loss_of(views):
            leaves = leaves_from(kinds, free_values, views, arrays, static_leaves)
            tree, args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
            return loss_fn(tree, *args, **kwargs)

        views = [views_of(buffer, layout) for buffer, layout in zip(values, layouts)]
        loss, view_grads = jax.value_and_grad(loss_of)(views)
        grads = [join_views(g, layout) for g, layout in zip(view_grads, layouts)]
        new_values, new_states = [], []
        for plan, value, grad, state in zip(plans, values, grads, states):
            hyper = _hyper_of(plan, hyper32, hyper64)
            new_value, new_state = apply_leaf(rule, dict(plan.flags), hyper, value, grad, state)
            new_values.append(new_value)
            new_states.append(new_state)
        return loss, new_values, new_states

    return jax.jit(fused, donate_argnums=(2, 3))


# --------------------------------------------------------------------- classes
def _compiled_class(optimizer_class: type[Optimizer]) -> type[_CompiledStepBase]:
    name = f"_Compiled{optimizer_class.__name__}"
    doc = f"The compiled step of :class:`lucid.optim.{optimizer_class.__name__}`."
    return type(name, (_CompiledStepBase,), {"optimizer_class": optimizer_class, "__doc__": doc})


class _CompiledLBFGS(_CompiledStepBase):
    """LBFGS compiled: the closure-less Barzilai-Borwein step of
    :func:`lucid.functional.lbfgs`, with its own per-parameter state. The eager
    L-BFGS history stays with the eager optimizer and is not adopted;
    ``step(closure)`` evaluates the closure once for the loss it returns."""

    def _adoptable_states(self) -> dict[Parameter, dict[str, Any]]:
        return {}

    def _import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> dict:
        return Optimizer._import_state(self.optimizer, group, p, saved, key)


def _registry() -> dict[type, type[_CompiledStepBase]]:
    from . import (
        ASGD,
        SGD,
        Adadelta,
        Adagrad,
        Adam,
        Adamax,
        AdamW,
        NAdam,
        RAdam,
        RMSprop,
        Rprop,
        SparseAdam,
    )
    from .lbfgs import LBFGS

    classes = [
        SGD,
        Adam,
        AdamW,
        RMSprop,
        Adagrad,
        Adadelta,
        Adamax,
        RAdam,
        NAdam,
        ASGD,
        Rprop,
        SparseAdam,
    ]
    registry = {cls: _compiled_class(cls) for cls in classes}
    _CompiledLBFGS.optimizer_class = LBFGS
    registry[LBFGS] = _CompiledLBFGS
    return registry


_REGISTRY: dict[type, type[_CompiledStepBase]] = {}


def compile_optimizer(optimizer: Optimizer) -> _CompiledStepBase:
    """Run ``optimizer``'s whole step as one compiled, in-place XLA executable.

    Returns the compiled step, which from now on owns the optimizer's
    parameters and state: ``optimizer.step()``, ``state_dict()``,
    ``load_state_dict()`` and ``zero_grad()`` go to it, and compiling the same
    optimizer again returns the same object. Raises ``TypeError`` for a class
    other than lucid's 13 (subclasses included) and ``ValueError`` for an
    optimizer without parameters.
    """
    if not _REGISTRY:
        _REGISTRY.update(_registry())
    compiled_class = _REGISTRY.get(type(optimizer))
    if compiled_class is None:
        names = ", ".join(sorted(cls.__name__ for cls in _REGISTRY))
        raise TypeError(
            f"compile_optimizer supports lucid.optim's own classes ({names}); "
            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
        )
    if optimizer._owner is not None:
        return optimizer._owner
    if not optimizer._params():
        raise ValueError("compile_optimizer: the optimizer has no parameters")
    compiled = compiled_class(optimizer)
    optimizer._owner = compiled
    return compiled


class FusedStep:
    """``loss = fused(model, *args, **kwargs)``: forward, backward and update, one executable.

    The call convention is :func:`lucid.backward`'s. Every parameter of the
    optimizer is updated with its gradient of this loss (a parameter the loss
    does not use gets a zero gradient, where an eager step would skip it), the
    Parameters' ``.data`` are current after the call, and ``.grad`` is left
    untouched. Parameters in the model that the optimizer does not hold are
    treated as constants.
    """

    def __init__(self, loss_fn: Callable[..., Any], optimizer: Optimizer) -> None:
        self.loss_fn = loss_fn
        self.compiled = compile_optimizer(optimizer)

    def __call__(self, tree: Any, *args: Any, **kwargs: Any) -> jax.Array:
        return self.compiled._fused(self.loss_fn, tree, args, kwargs)


def fused_step(loss_fn: Callable[..., Any], optimizer: Optimizer) -> FusedStep:
    """Compile ``optimizer`` (as :func:`compile_optimizer`) and return a fused
    training step for ``loss_fn``; see :class:`FusedStep`."""
    return FusedStep(loss_fn, optimizer)
