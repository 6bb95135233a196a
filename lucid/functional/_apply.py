"""How a rule runs: one parameter (`apply_leaf`), many (`apply_leaves`), a pytree
(`transform`), under the dtype policy and torch's checks the contract
(`lucid.functional.rule`) states. Every form of the step goes through here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _platform
from .._arrays import is_array, is_sparse, is_torch_tensor, torch_to_numpy
from . import _validate
from .rule import Array, HyperValue, Options, Present, Rule, Schedule

__all__ = [
    "Array",
    "HyperValue",
    "Options",
    "Present",
    "Rule",
    "Schedule",
]

State = Any  # a NamedTuple of arrays (one leaf) or of pytrees (a transform)


def is_number(value: Any) -> bool:
    """True for a concrete real number (Python or NumPy scalar), not an array or schedule."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_zero(value: Any) -> bool:
    """True when ``value`` is a concrete number equal to zero (a branch torch skips)."""
    return is_number(value) and float(value) == 0.0


def check_sparse_grad(rule: Rule, options: Options, grad: Any, shape: tuple[int, ...]) -> None:
    """torch's errors for a sparse gradient, raised before anything is updated.

    Raises:
      RuntimeError: ``rule`` takes no sparse gradients (torch: ``Adam does not support
        sparse gradients``), or not with these options (``weight_decay``).
      IndexError: a stored index outside the parameter holds a nonzero value (torch:
        ``index 5 is out of bounds for dimension 0 with size 3``); out-of-bounds
        entries holding zero are jax's padding and are dropped.
    """
    if rule.sparse is None:
        hint = ", please consider SparseAdam instead" if rule.name in ("Adam", "AdamW") else ""
        raise RuntimeError(f"{rule.name} does not support sparse gradients{hint}")
    if rule.sparse.check_options is not None:
        rule.sparse.check_options(options)
    check_sparse_indices(grad, shape)


def check_sparse_indices(grad: Any, shape: tuple[int, ...]) -> None:
    """``IndexError`` for a BCOO gradient with a nonzero value stored outside ``shape``
    (nothing to check for a traced gradient, or another sparse format)."""
    from jax.experimental import sparse  # a sparse gradient exists: already imported

    if not isinstance(grad, sparse.BCOO) or not grad.n_sparse:
        return
    indices, n_sparse = grad.indices, grad.n_sparse
    try:
        indices, data = np.asarray(indices), np.asarray(grad.data)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return
    bounds = np.asarray(shape[grad.n_batch : grad.n_batch + n_sparse])
    outside = (indices < 0) | (indices >= bounds)
    if not outside.any():
        return
    nonzero = data.reshape(*indices.shape[:-1], -1) != 0
    bad = outside & nonzero.any(-1)[..., None]
    if bad.any():
        where = np.argwhere(bad)[0]
        dim = int(where[-1])
        raise IndexError(
            f"index {int(indices[tuple(where)])} is out of bounds for dimension "
            f"{grad.n_batch + dim} with size {shape[grad.n_batch + dim]} (a sparse gradient's "
            "stored index)"
        )


def host_float(value: Any, name: str = "hyper-parameter") -> float:
    """A hyper-parameter (a number, or a one-element jax, NumPy or torch array) as a
    host float."""
    if type(value) is float:
        return value
    number = _validate.scalar(value, name, schedules=False)
    if number is None:
        raise TypeError(f"{name} is a traced array; lucid.optim needs its value on the host")
    return float(number)


def as_hyper(value: Any) -> Any:
    """A hyper-parameter as the rule computes with it: numbers and schedules as they
    are, one-element arrays (torch's included) as 0-d arrays."""
    if is_number(value):  # NumPy scalars too: 1 - beta stays a double-precision host value
        return value
    if is_torch_tensor(value):
        return jnp.asarray(torch_to_numpy(value)).reshape(())
    if is_array(value):
        return jnp.reshape(value, ())
    return value


def compute_dtype(dtype: Any) -> np.dtype:
    """The real dtype a parameter's update is computed in: float64 (and complex128)
    stay double, the rest is float32."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        dtype = jnp.finfo(dtype).dtype
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


def is_complex(x: Any) -> bool:
    """True for a complex array (torch runs the rule on its real view)."""
    return jnp.issubdtype(jnp.result_type(x), jnp.complexfloating)


def _as_real(x: Array) -> Array:
    """torch's ``view_as_real``: a complex array as ``(..., 2)`` real and imaginary parts."""
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


def _as_complex(x: Array, dtype: Any) -> Array:
    """The inverse of ``_as_real``."""
    return jax.lax.complex(x[..., 0], x[..., 1]).astype(dtype)


def check_complex(rule: Rule, dtype: Any) -> None:
    """Refuse a complex parameter for a rule torch does not run on complex numbers
    (torch's error, at the step).

    Raises:
      RuntimeError: ``Adafactor does not support complex parameters``.
    """
    if not rule.supports_complex and jnp.issubdtype(dtype, jnp.complexfloating):
        raise RuntimeError(f"{rule.name} does not support complex parameters")


def resolve(hyper: Mapping[str, HyperValue], count: Array, dtype: Any) -> dict[str, Any]:
    """Evaluate every schedule in ``hyper`` at ``count`` (updates done so far), in
    ``dtype`` (the compute dtype: a float32 step gets no float64 operation from a
    schedule, even with x64 enabled)."""
    from .schedules._ops import computing_in

    if not any(callable(v) for v in hyper.values()):
        return dict(hyper)
    with computing_in(dtype):
        return {k: (jnp.asarray(v(count), dtype) if callable(v) else v) for k, v in hyper.items()}


def pack(rule: Rule, hyper: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``one_minus_<name>`` for the rule's complements.

    For a Python number ``1 - x`` is computed in double precision, exactly as
    torch computes ``1 - beta`` before it reaches a float32 kernel; for an
    array it is computed in the graph.
    """
    packed = dict(hyper)
    for name in rule.options.complements:
        value = hyper[name]
        packed[f"one_minus_{name}"] = 1.0 - float(value) if is_number(value) else 1 - value
    return packed


def _restore_dtypes(new_state: Any, old_state: Any, param_dtype: Any) -> Any:
    """Cast each new state field back to the dtype its old value was stored in; a
    field created by this update takes the param's. A field the update did not
    produce (an optional field whose flag is off) is kept as it was, as torch
    leaves such an entry untouched."""
    fields = []
    for new, old in zip(new_state, old_state):
        if new is None:
            fields.append(old)
        elif old is not None:
            fields.append(new.astype(old.dtype))
        else:
            fields.append(new.astype(param_dtype) if jnp.ndim(new) else new)
    return type(new_state)(*fields)


def _masked(rule: Rule, present: Array) -> Callable[..., tuple[Array, Any]]:
    """``rule.sparse.masked_update`` over the entries ``present``, called as ``rule.update``."""

    def update(param: Array, grad: Array, state: Any, hyper: Any, **flags: Any) -> Any:
        return rule.sparse.masked_update(param, grad, present, state, hyper, **flags)  # type: ignore[union-attr,misc]

    return update


def apply_leaf(
    rule: Rule,
    flags: Mapping[str, Any],
    hyper: Mapping[str, Any],
    param: Array,
    grad: Array,
    state: Any,
) -> tuple[Array, Any]:
    """Run ``rule.update`` for one parameter with packed, resolved hyper-parameters.

    Handles the dtype policy: inputs upcast to the compute dtype, outputs cast
    back to the dtypes they are stored in. A sparse ``grad`` goes, uncast, to
    ``rule.sparse.update`` when the rule has one; a `Present` one (a sparse gradient
    laid out dense) to ``rule.sparse.masked_update``.
    """
    if is_complex(param):  # torch: the real rule on view_as_real of everything
        real_state = type(state)(*(_as_real(v) if _is_complex_field(v) else v for v in state))
        real_grad = (
            Present(_as_real(grad.grad), jnp.stack([grad.present] * 2, axis=-1))
            if isinstance(grad, Present)
            else _as_real(grad)
        )
        new_param, new_real = apply_leaf(rule, flags, hyper, _as_real(param), real_grad, real_state)
        fields = (
            _as_complex(new, old.dtype) if _is_complex_field(old) else new
            for new, old in zip(new_real, state)
        )
        return _as_complex(new_param, param.dtype), type(state)(*fields)
    cdtype = compute_dtype(param.dtype)
    hyper_c = {k: jnp.asarray(v, cdtype) for k, v in hyper.items()}
    state_c = jax.tree_util.tree_map(
        lambda x: x.astype(cdtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state
    )
    if rule.sparse is not None and is_sparse(grad):
        update, grad_c = rule.sparse.update, grad
    elif isinstance(grad, Present):
        update, grad_c = _masked(rule, grad.present), grad.grad.astype(cdtype)
    else:
        update, grad_c = rule.update, grad.astype(cdtype)
    if rule.storage_dtype:
        flags = {**flags, "storage_dtype": np.dtype(param.dtype)}
    new_param, new_state = update(param.astype(cdtype), grad_c, state_c, hyper_c, **flags)
    return new_param.astype(param.dtype), _restore_dtypes(new_state, state, param.dtype)


def apply_leaves(
    rule: Rule,
    flags: Sequence[Mapping[str, Any]],
    hypers: Sequence[Mapping[str, Any]],
    params: Sequence[Array],
    grads: Sequence[Any],
    states: Sequence[Any],
    apart: Sequence[Any] | None = None,
) -> tuple[list[Array], list[Any]]:
    """`apply_leaf` over many parameters, the same-shaped ones in one batched call.

    Every form of the step (the functional transform, the eager and the compiled
    step) updates its parameters through this function. For a rule that batches
    here (`lucid._platform.batches`: `Execution.batched`), the parameters fall into
    classes of equal value shape and dtype, gradient shape and dtype (a dense
    gradient), state structure (the same fields present, each of the same shape and
    dtype), static flags and hyper-parameter names, and key apart (the sharding of a
    concrete value, or ``apart``); each class of two or more is stacked along a new
    leading axis and updated by one call of `apply_leaf` under ``jax.vmap``, then cut
    back into its parameters. A hyper-parameter that is the same for the whole class (the same
    object, or equal Python numbers) stays a scalar; one that differs between its
    members (another group's ``lr``, a schedule evaluated per parameter) is
    stacked and batched with them, so parameters of several groups share a call.
    Everything else (a rule without ``batched``, a sparse or complex parameter, a
    shape of its own) goes through `apply_leaf` one parameter at a time.

    Args:
      rule: the rule.
      flags: each parameter's static options.
      hypers: each parameter's packed, resolved hyper-parameters.
      params: the parameters' values.
      grads: their gradients (dense or sparse).
      states: their states (the rule's NamedTuple each).
      apart: a hashable key per value; values of different keys are never stacked
        together (a caller that traces values inside a jitted function, where their
        shardings cannot be read, passes their placements, so each output keeps its
        input's). ``None``: the sharding of each value that is a concrete array.

    Returns:
      ``(new_params, new_states)``, in the order of ``params``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional._apply import apply_leaves, pack
      >>> from lucid.functional.muon import MUON
      >>> options = {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.9, "nesterov": True,
      ...            "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7,
      ...            "ns_steps": 5, "adjust_lr_fn": None, "batched_matrices": False}
      >>> hyper, flags = MUON.split(options)
      >>> params = [jnp.ones((2, 3)), jnp.zeros((2, 3))]  # one class: one batched call
      >>> states = [MUON.init(p, hyper) for p in params]
      >>> new, _ = apply_leaves(MUON, [flags] * 2, [pack(MUON, hyper)] * 2, params,
      ...                       [jnp.eye(2, 3)] * 2, states)
      >>> [p.shape for p in new]
      [(2, 3), (2, 3)]
    """
    n = len(params)
    results: list[Any] = [None] * n
    classes: dict[Any, list[int]] = {}
    batched = _platform.batches(rule.execution)
    for i in range(n):
        key = None
        if batched:
            key = batch_key(flags[i], hypers[i], params[i], grads[i], states[i])
        if key is not None:
            key = (*key, _placement(params[i]) if apart is None else apart[i])
        classes.setdefault(("alone", i) if key is None else key, []).append(i)
    for members in classes.values():
        if len(members) == 1:
            i = members[0]
            results[i] = apply_leaf(rule, flags[i], hypers[i], params[i], grads[i], states[i])
            continue
        outs = _apply_batched(
            rule,
            flags[members[0]],
            [hypers[i] for i in members],
            [params[i] for i in members],
            [grads[i] for i in members],
            [states[i] for i in members],
        )
        for i, out in zip(members, outs):
            results[i] = out
    return [r[0] for r in results], [r[1] for r in results]


def _placement(x: Any) -> Any:
    """The sharding of a concrete jax array (``None`` for a traced or host array)."""
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return x.sharding
    return None


def _signature(x: Any) -> tuple | None:
    """``(shape, dtype)`` of an array, ``None`` for anything else."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None:
        return None
    return tuple(shape), np.dtype(dtype)


def batch_key(
    flags: Mapping[str, Any], hyper: Mapping[str, Any], param: Any, grad: Any, state: Any
) -> tuple | None:
    """What parameters of one batched call share, or ``None`` for one that updates alone
    (not an array, complex, a sparse gradient, a state leaf that is not an array,
    flags that cannot be compared)."""
    value, gradient = _signature(param), _signature(grad)
    if value is None or gradient is None or is_sparse(grad) or is_complex(param):
        return None
    leaves, treedef = jax.tree_util.tree_flatten(state)
    fields = tuple(_signature(leaf) for leaf in leaves)
    if any(field is None for field in fields):
        return None
    try:
        static = tuple(sorted(flags.items()))
        hash(static)
    except TypeError:
        return None
    return value, gradient, treedef, fields, static, tuple(sorted(hyper))


def _same_number(values: Sequence[Any]) -> bool:
    """Whether every value is one Python (or NumPy) number, bit for bit."""
    first = values[0]
    if not is_number(first):
        return False
    bits = float(first).hex()
    return all(is_number(v) and float(v).hex() == bits for v in values)


class StackedClass(NamedTuple):
    """One class of `apply_leaves` stacked along a new leading axis (the travelling form
    of a batched call: `stack_class` makes it, `apply_stacked` updates it).

    Attributes:
      shared: the hyper-parameters equal for the whole class, as scalars.
      varying: the others, each stacked (one entry per member).
      params: the members' values, stacked.
      grads: their gradients, stacked.
      states: their states, each field stacked.
    """

    shared: dict[str, Any]
    varying: dict[str, Array]
    params: Array
    grads: Array
    states: Any


def stack_class(
    hypers: Sequence[Mapping[str, Any]],
    params: Sequence[Array],
    grads: Sequence[Array],
    states: Sequence[Any],
) -> StackedClass:
    """The members of one class (equal `batch_key`s) stacked: a hyper-parameter that is
    the same for every member (the same object, or equal Python numbers) stays a scalar,
    one that differs is stacked in the members' compute dtype."""
    cdtype = compute_dtype(params[0].dtype)
    shared: dict[str, Any] = {}
    varying: dict[str, Array] = {}
    for name in hypers[0]:
        values = [h[name] for h in hypers]
        if all(v is values[0] for v in values) or _same_number(values):
            shared[name] = values[0]
        else:
            varying[name] = jnp.stack([jnp.asarray(v, cdtype) for v in values])
    return StackedClass(
        shared,
        varying,
        jnp.stack(params),
        jnp.stack(grads),
        jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *states),
    )


def apply_stacked(rule: Rule, flags: Mapping[str, Any], stacked: StackedClass) -> tuple[Array, Any]:
    """`apply_leaf` on every member of ``stacked``: under ``jax.vmap`` for a rule that
    batches here (`lucid._platform.batches`), else member by member (the per-parameter
    programs, unrolled). Returns the new values and states, stacked as the class was."""

    def one(param: Array, grad: Array, state: Any, varying: dict[str, Array]) -> tuple:
        return apply_leaf(rule, flags, {**stacked.shared, **varying}, param, grad, state)

    members = (stacked.params, stacked.grads, stacked.states, stacked.varying)
    if _platform.batches(rule.execution):
        return jax.vmap(one)(*members)
    outs = [
        one(*jax.tree_util.tree_map(lambda x, i=i: x[i], members))
        for i in range(stacked.params.shape[0])
    ]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)


def _apply_batched(
    rule: Rule,
    flags: Mapping[str, Any],
    hypers: Sequence[Mapping[str, Any]],
    params: Sequence[Array],
    grads: Sequence[Array],
    states: Sequence[Any],
) -> list[tuple[Array, Any]]:
    """One class of `apply_leaves`: stacked, updated under ``jax.vmap``, cut back."""
    new_params, new_states = apply_stacked(rule, flags, stack_class(hypers, params, grads, states))
    return [
        (new_params[i], jax.tree_util.tree_map(lambda x, i=i: x[i], new_states))
        for i in range(len(params))
    ]


def _is_complex_field(value: Any) -> bool:
    return value is not None and jnp.ndim(value) > 0 and is_complex(value)


def init_leaf(rule: Rule, flags: Mapping[str, Any], hyper: Mapping[str, Any], param: Array) -> Any:
    """The state ``rule`` starts from for one parameter (or, for an elementwise
    rule, for a flat buffer of parameters).

    Every field gets its own buffer (a rule may build two moments from one
    zeros array), so the state can be donated to a jitted step.
    """
    if is_complex(param):  # state made for the real view, kept complex as torch keeps it
        real = init_leaf(rule, flags, hyper, _as_real(param))
        return type(real)(
            *(_as_complex(v, param.dtype) if v is not None and jnp.ndim(v) else v for v in real)
        )
    cdtype = compute_dtype(param.dtype)
    hyper_c = {k: jnp.asarray(v, cdtype) for k, v in hyper.items()}
    state = rule.init(param, hyper_c, **flags)
    seen: set[int] = set()
    fields = []
    for value in state:
        if value is not None and id(value) in seen:
            value = jnp.array(value, copy=True)
        seen.add(id(value))
        fields.append(value)
    return type(state)(*fields)


def resume_leaf(rule: Rule, flags: Mapping[str, Any], state: Any, param: Array) -> Any:
    """An existing state, ready for a step under ``flags`` (torch's rule when an
    option that owns a state field is turned on after the state was created).

    Raises:
      KeyError: torch's error, naming the missing entry, where torch raises.
    """
    if rule.fields.start_optional is not None:
        state = rule.fields.start_optional(state, param, flags)
    for field, flag in rule.fields.optional.items():
        if flags[flag] and getattr(state, field) is None:
            raise KeyError(
                f"{field!r}: this parameter's {rule.name} state was created while "
                f"{flag.removeprefix('use_')} was off, so it has no {field!r} (torch raises "
                "the same KeyError); turn the option on before the first step, or load a "
                "state that has the entry"
            )
    return state


def hyper_values(
    rule: Rule, options: Mapping[str, Any]
) -> tuple[tuple[str, ...], list[float], dict]:
    """A param group's hyper-parameters as host floats for one runtime vector:
    ``(names, values, flags)``, ``1 - x`` computed in double precision."""
    hyper, flags = rule.split(options)
    packed = pack(rule, hyper)
    names = tuple(sorted(packed))
    values = [host_float(packed[name], name) for name in names]
    return names, values, flags


def step_count(state: Any) -> Array:
    """Updates done so far, as the int32 count a schedule is evaluated at."""
    return jnp.asarray(state.step).astype(jnp.int32)


def _transpose_in(state: Any, treedef: Any, n: int) -> list[Any]:
    """A transform state (NamedTuple of pytrees) -> one NamedTuple per leaf."""
    fields = [None if f is None else treedef.flatten_up_to(f) for f in state]
    return [type(state)(*(None if f is None else f[i] for f in fields)) for i in range(n)]


def _transpose_out(leaves: list[Any], treedef: Any, state_type: type) -> Any:
    """One NamedTuple per leaf -> a transform state (NamedTuple of pytrees).

    A field no leaf has is ``None``; a field only some leaves have (Adafactor's
    ``row_var`` for matrices, ``variance`` for vectors) holds ``None`` at the others."""
    fields = []
    for name in state_type._fields:
        values = [getattr(leaf, name) for leaf in leaves]
        absent = bool(values) and all(value is None for value in values)
        fields.append(None if absent else treedef.unflatten(values))
    return state_type(*fields)


def check_same_structure(
    grads: Any, params: Any, name: str, *, sparse_leaves: bool = False
) -> None:
    """Raise a clear ``ValueError`` when ``grads`` and ``params`` are different pytrees.

    With ``sparse_leaves`` a sparse array in ``grads`` counts as one leaf.
    """
    if params is None:
        raise ValueError(
            f"lucid's {name} transform needs the current params: call "
            "tx.update(grads, state, params)."
        )
    is_leaf = is_sparse if sparse_leaves else None
    g_def = jax.tree_util.tree_structure(grads, is_leaf=is_leaf)
    p_def = jax.tree_util.tree_structure(params)
    if g_def != p_def:
        raise ValueError(
            f"lucid's {name} transform: grads and params have different structures:\n"
            f"  grads:  {g_def}\n  params: {p_def}"
        )
    g_leaves = jax.tree_util.tree_leaves(grads, is_leaf=is_leaf)
    for g, p in zip(g_leaves, jax.tree_util.tree_leaves(params)):
        if jnp.shape(g) != jnp.shape(p):
            raise ValueError(
                f"lucid's {name} transform: a gradient of shape {jnp.shape(g)} was given "
                f"for a parameter of shape {jnp.shape(p)}."
            )


def _delta(new: Array, old: Array) -> Array:
    """The update ``new - old`` that ``optax.apply_updates`` adds back, and ``0`` where the
    parameter stays as it was: an infinite parameter that stays infinite (torch's
    ``p - lr * g`` of ``p = -inf``) would otherwise get ``inf - inf = NaN``."""
    return jnp.where(new == old, jnp.zeros_like(new), new - old)


def transform(rule: Rule, options: Options) -> optax.GradientTransformation:
    """Turn ``rule`` with torch-style ``options`` into an optax transformation.

    ``init(params)`` builds the state NamedTuple whose fields are pytrees shaped
    like ``params``; ``update(grads, state, params)`` evaluates schedules at the
    number of updates done so far, applies the rule to every leaf and returns
    ``new_params - params`` as the update (so ``optax.apply_updates`` lands on
    torch's new parameters), 0 where a parameter stays as it was (an infinite one
    included).
    """
    rule.check(options, schedules=True)
    if rule.options.check_at_step is not None:  # a transform has no later moment to refuse at
        rule.options.check_at_step(options)
    hyper, flags = rule.split(options)
    hyper = {name: as_hyper(value) for name, value in hyper.items()}

    def init_fn(params: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        for leaf in leaves:
            check_complex(rule, jnp.result_type(leaf))
        leaves = [jnp.asarray(p) for p in leaves]
        zero = jnp.zeros((), jnp.int32)
        start = {
            dtype: pack(rule, resolve(hyper, zero, dtype))
            for dtype in {compute_dtype(p.dtype) for p in leaves}
        }
        states = [init_leaf(rule, flags, start[compute_dtype(p.dtype)], p) for p in leaves]
        return _transpose_out(states, treedef, rule.state)

    def update_fn(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        sparse = jax.tree_util.tree_leaves(grads, is_leaf=is_sparse)
        if rule.sparse is None and any(map(is_sparse, sparse)):
            check_sparse_grad(rule, options, None, ())
        check_same_structure(grads, params, rule.name, sparse_leaves=rule.sparse is not None)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        grad_leaves = treedef.flatten_up_to(grads)
        for g, p in zip(grad_leaves, leaves):
            if is_sparse(g):
                check_sparse_grad(rule, options, g, jnp.shape(p))
        leaf_states = _transpose_in(state, treedef, len(leaves))
        values = [
            pack(rule, resolve(hyper, step_count(s), compute_dtype(p.dtype)))
            for p, s in zip(leaves, leaf_states)
        ]
        new_params, new_states = apply_leaves(
            rule, [flags] * len(leaves), values, leaves, grad_leaves, leaf_states
        )
        updates = [_delta(new_p, p) for new_p, p in zip(new_params, leaves)]
        return treedef.unflatten(updates), _transpose_out(new_states, treedef, rule.state)

    return optax.GradientTransformation(init_fn, update_fn)
