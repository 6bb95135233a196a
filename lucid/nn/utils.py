"""`torch.nn.utils`' gradient clipping, over [Parameter][lucid.Parameter] gradients.

Same names, signatures and return values as torch 2.13: `clip_grad_norm_`
returns the total norm (a 0-d array) and scales every gradient by
`min(1, max_norm / (total_norm + 1e-6))`; `clip_grad_value_` clamps them.
Gradients held by a compiled optimizer's flat buffer are clipped as that one
buffer, so clipping thousands of parameters is one small executable, not
thousands of dispatches. The math is `lucid.functional.clipping`'s; for a
pure pipeline, [clip_grad_norm][lucid.functional.clip_grad_norm] is the
same rule as an optax transform.

As torch's: each gradient's norm is taken in its own dtype (bfloat16 and
float16 reduced in float32, the norm rounded back), the norms are stacked in
the dtype they promote to (bfloat16 with float32 gradients: a float32 total)
and each gradient is scaled in float32 when it is narrower; a Parameter
listed twice counts twice in the total and is scaled twice; a sparse gradient
raises `NotImplementedError`, as torch's has no sparse kernel, and nothing is
changed.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import is_sparse
from .._parameter import Parameter
from .._placement import by_domain, replicated
from .._storage import by_storage, cut_views, run_time_offsets
from .._trees import boxed_tree_params
from ..functional import clipping
from ..functional.clipping import check_dense

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]

Array = jax.Array


# Where each tensor of the list torch's total norm reads comes from, as listed: per entry, the
# position of the array among the few the gradients are read as, and which of that array's
# per-parameter views (``None``: the array is one tensor). `_Gradients.order` builds it.
Order = tuple[tuple[int, "int | None"], ...]


# Per array the gradients are read as: ``None``, or the run-time offsets its layout's views
# are cut at (`BufferLayout.split_at`, traced int32 scalars; `_offsets`).
Offsets = tuple[Any, ...]


def _tensors(grads: list[Array], layouts: tuple, order: Order, offsets: Offsets) -> list[Array]:
    """The gradients as torch's total norm sees them, as listed: a flat buffer's views,
    and a parameter listed `k` times `k` times (torch's list of `.grad`s repeats it)."""
    views = [
        g if layout is None else cut_views(g, layout, at)
        for g, layout, at in zip(grads, layouts, offsets)
    ]
    return [views[a] if view is None else views[a][view] for a, view in order]


def _offsets(grads: list[Array], layouts: tuple) -> Offsets:
    """Per array, the run-time offsets its views are cut at in the program
    (`lucid._storage.run_time_offsets`: one compiled cut per distinct shape)."""
    return tuple(map(run_time_offsets, layouts, grads))


@functools.partial(jax.jit, static_argnums=(1, 2, 4))
def _total_norm(
    grads: list[Array], layouts: tuple, order: Order, offsets: Offsets, norm_type: float
) -> Array:
    return clipping.total_norm(_tensors(grads, layouts, order, offsets), norm_type)


@functools.partial(jax.jit, static_argnums=(3,))
def _scaled(grads: list[Array], max_norm: Array, total_norm: Array, times: tuple) -> list[Array]:
    coef = clipping.clip_coefficient(max_norm, total_norm)
    return [clipping.scale(g, coef, k) for g, k in zip(grads, times)]


@functools.partial(jax.jit, static_argnums=(2, 3, 5, 6))
def _clipped_by_norm(
    grads: list[Array],
    max_norm: Array,
    layouts: tuple,
    order: Order,
    offsets: Offsets,
    times: tuple,
    norm_type: float,
) -> tuple[Array, list[Array]]:
    total = _total_norm(grads, layouts, order, offsets, norm_type)
    return total, _scaled(grads, max_norm, total, times)


@jax.jit
def _clamped(grads: list[Array], clip_value: Array) -> list[Array]:
    return [jnp.clip(g, -clip_value.astype(g.dtype), clip_value.astype(g.dtype)) for g in grads]


# Gradients on several device domains (a parameter sharded over a mesh, another on one
# device) cannot meet in one call. torch's clipping groups its tensors by device, takes
# the norms on each, moves them to the first tensor's device for the total and the
# coefficient back to each device; so does lucid, in one call per domain. The calls above
# are tried first: only when they refuse the arrays' placement is it looked at, so one
# domain (the usual case) costs nothing more.


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _norms(grads: list[Array], layouts: tuple, order: Order, norm_type: float) -> list[Array]:
    none = (None,) * len(grads)
    return [clipping.vector_norm(t, norm_type) for t in _tensors(grads, layouts, order, none)]


@functools.partial(jax.jit, static_argnums=(1, 2))
def _norm_of_norms(norms: list[Array], dtypes: tuple, norm_type: float) -> Array:
    return clipping.norm_of_norms(norms, list(dtypes), norm_type)


def _total_norm_across(grads: list[Array], layouts: tuple, order: Order, norm_type: float) -> Array:
    """`_total_norm` over gradients on several device domains: each domain's norms in
    one call, then the total on the devices of the first tensor listed (torch's)."""
    groups = by_domain(grads)
    group_of = {a: g for g, members in enumerate(groups) for a in members}
    norms: list[Any] = [None] * len(order)
    for g, members in enumerate(groups):
        local = {a: k for k, a in enumerate(members)}
        listed = [i for i, (a, _) in enumerate(order) if group_of[a] == g]
        if not listed:
            continue
        sub = _norms(
            [grads[a] for a in members],
            tuple(layouts[a] for a in members),
            tuple((local[order[i][0]], order[i][1]) for i in listed),
            norm_type,
        )
        for i, norm in zip(listed, sub):
            norms[i] = norm
    first = replicated(grads[order[0][0]])
    dtypes = tuple(np.dtype(grads[a].dtype) for a, _ in order)
    return _norm_of_norms([jax.device_put(n, first) for n in norms], dtypes, norm_type)


def _scaled_across(grads: list[Array], max_norm: Array, total: Array, times: tuple) -> list:
    """`_scaled` over gradients on several device domains: the total placed on each
    domain's devices (torch's coefficient `.to(device)`), one call per domain."""
    out: list[Any] = [None] * len(grads)
    for members in by_domain(grads):
        local = [grads[i] for i in members]
        placed = jax.device_put(total, replicated(local[0]))
        scaled = _scaled(local, max_norm, placed, tuple(times[i] for i in members))
        for i, grad in zip(members, scaled):
            out[i] = grad
    return out


def _norm(grads: list[Array], layouts: tuple, order: Order, norm_type: float) -> Array:
    """`_total_norm`, across device domains where the gradients span several."""
    try:
        return _total_norm(grads, layouts, order, _offsets(grads, layouts), norm_type)
    except ValueError:
        if len(by_domain(grads)) < 2:
            raise
        return _total_norm_across(grads, layouts, order, norm_type)


def _scale(grads: list[Array], max_norm: Array, total: Array, times: tuple) -> list[Array]:
    """`_scaled`, per device domain where the gradients (or the total) span several."""
    try:
        return _scaled(grads, max_norm, total, times)
    except ValueError:
        if len(by_domain([*grads, jnp.asarray(total)])) < 2:
            raise
        return _scaled_across(grads, max_norm, total, times)


def _clamp(grads: list[Array], clip_value: Array) -> list[Array]:
    """`_clamped`, one call per device domain where the gradients span several."""
    try:
        return _clamped(grads, clip_value)
    except ValueError:
        groups = by_domain(grads)
        if len(groups) < 2:
            raise
        out: list[Any] = [None] * len(grads)
        for members in groups:
            for i, grad in zip(members, _clamped([grads[i] for i in members], clip_value)):
                out[i] = grad
        return out


def _parameters(parameters: Parameter | Iterable[Parameter]) -> list[Parameter]:
    if isinstance(parameters, Parameter):
        return [parameters]
    named = boxed_tree_params(parameters)  # a boxed pytree (lucid.parameters)
    if named is not None:
        return [p for _, p in named]
    is_generator = isinstance(parameters, types.GeneratorType)
    params = list(parameters)
    if is_generator and not params:
        warnings.warn(
            "`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=3
        )
    for p in params:
        if not isinstance(p, Parameter):
            raise TypeError(
                "gradient clipping takes lucid.Parameter objects (whose .grad it scales), "
                f"but one of the parameters is {type(p).__name__}; box arrays with "
                "lucid.Parameter(array), or a pytree with lucid.parameters(tree)"
            )
    return params


def _sparse_indices(storage: Any, indices: list[int]) -> list[int]:
    """The indices whose gradient is sparse (the storage knows, without slicing)."""
    return storage.sparse_indices(indices)


class _Gradients:
    """The gradients of some parameters as a few arrays, in the order the parameters are
    listed (so the same gradients are the same program's inputs wherever they are held):
    a storage's whole gradient buffer where these parameters are all of its gradients,
    each listed once, else one array per parameter, with how many times it was listed
    (torch scales it that often), and the order they were listed in (`Order`), whatever
    the storages: the total norm rounds its sum in an order of the listed tensors
    (`lucid.functional.clipping.total_norm`), so a flat buffer's views must be read in it
    as arrays of their own are."""

    def __init__(self, params: list[Parameter], where: str) -> None:
        # presence from the storages: reading p.grad would cut a slice per parameter
        listed = [p for p in params if p.location[0].grad_present(p.location[1])]
        counts: dict[Parameter, int] = {}
        for p in listed:
            counts[p] = counts.get(p, 0) + 1
        repeated = any(k > 1 for k in counts.values())
        self.arrays: list[Array] = []
        layouts: list[Any] = []  # per array: None (one tensor) or the layout of its views
        times: list[int] = []
        self._writers: list[Any] = []
        # per (storage, index): the array it is read from, and its view there
        source: dict[tuple[int, int], tuple[int, int | None]] = {}
        groups = by_storage(p.location for p in counts)
        multiplicity = {(id(p.location[0]), p.location[1]): k for p, k in counts.items()}
        for storage, indices in groups:
            sparse = _sparse_indices(storage, indices)
            if sparse:
                check_dense([storage.grad(sparse[0])], where)
        buffers = {}  # per storage whose gradients these are all of: its indices, its buffer
        for storage, indices in groups:
            buffer = None if repeated else storage.grad_buffer(indices)
            if buffer is not None:
                buffers[id(storage)] = (indices, buffer)
        # the arrays in the order the parameters are listed (a storage's buffer where its
        # first one is), whatever holds them: the eager step's pieces keep gradients per
        # parameter, and its first clipping read each parameter's own array; the same
        # arrays in the same order are the same compiled program
        for p in counts:
            storage, index = p.location
            whole = buffers.pop(id(storage), None)
            if whole is not None:
                indices, buffer = whole
                several = storage.layout.param_count > 1
                for i in indices:
                    source[id(storage), i] = (len(self.arrays), i if several else None)
                self.arrays.append(buffer)
                layouts.append(storage.layout if several else None)
                times.append(1)
                self._writers.append(storage.set_grad_buffer)
            elif (id(storage), index) not in source:  # not in a buffer listed already
                source[id(storage), index] = (len(self.arrays), None)
                self.arrays.append(storage.grad(index))
                layouts.append(None)
                times.append(multiplicity[id(storage), index])
                self._writers.append(functools.partial(storage.set_grad, index))
        self.layouts = tuple(layouts)
        self.times = tuple(times)
        self.order: Order = tuple(source[id(p.location[0]), p.location[1]] for p in listed)

    def write(self, arrays: list[Array]) -> None:
        for writer, array in zip(self._writers, arrays):
            writer(array)


def get_total_norm(
    tensors: Array | Iterable[Array],
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Array:
    """The norm of the norms of `tensors`, as if they were one vector (torch's `get_total_norm`).

    $N = \\lVert (\\lVert t_1 \\rVert_p, \\dots, \\lVert t_k \\rVert_p) \\rVert_p$
    with $p$ = `norm_type`.

    Args:
      tensors: an array, or an iterable of arrays (e.g. gradients) $t_i$.
      norm_type: the order $p$ of the norms (`float("inf")` for the max norm).
      error_if_nonfinite: raise when the total is nan or inf.
      foreach: accepted for torch compatibility; ignored.

    Returns:
      $N$, a 0-d array (`0.0` for no tensors).

    Raises:
      RuntimeError: `error_if_nonfinite` and a non-finite total; or an empty
        array with an infinite or negative `norm_type` (torch's error: the
        norm has no value there).
      NotImplementedError: a sparse array among `tensors` (torch's has no
        sparse kernel either).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> grads = [jnp.array([3.0]), jnp.array([4.0])]
      >>> float(lucid.nn.utils.get_total_norm(grads))
      5.0
      >>> float(lucid.nn.utils.get_total_norm(grads, norm_type=float("inf")))
      4.0
    """
    arrays = [tensors] if isinstance(tensors, jax.Array) or is_sparse(tensors) else list(tensors)
    if not arrays:
        return jnp.asarray(0.0)
    check_dense(arrays, "get_total_norm")
    order = tuple((i, None) for i in range(len(arrays)))
    total = _norm(arrays, (None,) * len(arrays), order, float(norm_type))
    _check_finite(total, norm_type, error_if_nonfinite)
    return total


def _check_finite(total: Array, norm_type: float, error_if_nonfinite: bool) -> None:
    if error_if_nonfinite and not bool(jnp.isfinite(total)):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
        )


def clip_grads_with_norm_(
    parameters: Parameter | Iterable[Parameter],
    max_norm: float,
    total_norm: Array,
    foreach: bool | None = None,
) -> None:
    """Scale the gradients by `min(1, max_norm / (total_norm + 1e-6))`, in place (torch's).

    The second half of [clip_grad_norm_][lucid.nn.utils.clip_grad_norm_],
    for a total norm computed otherwise (e.g. over several groups of
    parameters, with [get_total_norm][lucid.nn.utils.get_total_norm]).

    Args:
      parameters: a Parameter or an iterable of them, whose `.grad` is scaled
        (those without one are skipped).
      max_norm: the largest norm kept.
      total_norm: the total norm to scale by, a 0-d array.
      foreach: accepted for torch compatibility; ignored.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> w.grad = jnp.array([3.0, 4.0])
      >>> total = lucid.nn.utils.get_total_norm([w.grad])
      >>> lucid.nn.utils.clip_grads_with_norm_([w], max_norm=1.0, total_norm=total)
      >>> [round(x, 4) for x in w.grad.tolist()]
      [0.6, 0.8]
    """
    grads = _Gradients(_parameters(parameters), "clip_grads_with_norm_")
    if grads.arrays:
        total = jnp.asarray(total_norm)
        grads.write(_scale(grads.arrays, jnp.asarray(float(max_norm)), total, grads.times))


def clip_grad_norm_(
    parameters: Parameter | Iterable[Parameter],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Array:
    """Clip the gradients' total norm to `max_norm`, in place (torch's `clip_grad_norm_`).

    With $g_i$ the gradients and $p$ = `norm_type`, the total norm is
    $N = \\lVert (\\lVert g_1 \\rVert_p, \\dots, \\lVert g_k \\rVert_p) \\rVert_p$,
    as if the gradients were one vector, and every gradient is multiplied by

    $$
    c = \\min\\left(1, \\frac{\\text{max\\_norm}}{N + 10^{-6}}\\right).
    $$

    Call it between [backward][lucid.backward] and the optimizer's `step()`.

    Args:
      parameters: a Parameter, an iterable of them, or a boxed pytree (from
        [lucid.parameters][lucid.parameters]); `None` gradients are skipped.
      max_norm: the largest total norm kept.
      norm_type: the order $p$ of the norms (`float("inf")` for the max norm).
      error_if_nonfinite: raise (and change nothing) when $N$ is nan or inf.
      foreach: accepted for torch compatibility; ignored.

    Returns:
      $N$, the total norm before clipping (a 0-d array; `0.0` without
      gradients), in the dtype the gradients' norms promote to (torch's).

    Raises:
      RuntimeError: `error_if_nonfinite` and a non-finite total norm; or an
        empty gradient with an infinite or negative `norm_type` (torch's
        error); nothing is changed.
      NotImplementedError: a sparse gradient (torch has no sparse kernel
        either); nothing is changed.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> w.grad = jnp.array([3.0, 4.0])
      >>> float(lucid.nn.utils.clip_grad_norm_([w], max_norm=1.0))
      5.0
      >>> [round(x, 4) for x in w.grad.tolist()]
      [0.6, 0.8]
    """
    grads = _Gradients(_parameters(parameters), "clip_grad_norm_")
    if not grads.arrays:
        return jnp.asarray(0.0)
    max_norm = jnp.asarray(float(max_norm))
    if error_if_nonfinite:  # torch checks before anything is scaled
        total = _norm(grads.arrays, grads.layouts, grads.order, float(norm_type))
        _check_finite(total, norm_type, error_if_nonfinite)
        grads.write(_scale(grads.arrays, max_norm, total, grads.times))
        return total
    try:
        total, scaled = _clipped_by_norm(
            grads.arrays,
            max_norm,
            grads.layouts,
            grads.order,
            _offsets(grads.arrays, grads.layouts),
            grads.times,
            float(norm_type),
        )
    except ValueError:  # gradients on several device domains (else raised again)
        total = _norm(grads.arrays, grads.layouts, grads.order, float(norm_type))
        scaled = _scale(grads.arrays, max_norm, total, grads.times)
    grads.write(scaled)
    return total


def clip_grad_value_(
    parameters: Parameter | Iterable[Parameter], clip_value: float, foreach: bool | None = None
) -> None:
    """Clamp every gradient elementwise to `[-clip_value, clip_value]`, in place (torch's).

    Args:
      parameters: a Parameter, an iterable of them, or a boxed pytree (from
        [lucid.parameters][lucid.parameters]); `None` gradients are skipped.
      clip_value: the largest magnitude kept.
      foreach: accepted for torch compatibility; ignored.

    Raises:
      NotImplementedError: a sparse gradient (torch has no sparse kernel
        either); nothing is changed.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(3))
      >>> w.grad = jnp.array([-2.0, 0.5, 3.0])
      >>> lucid.nn.utils.clip_grad_value_(w, clip_value=1.0)
      >>> w.grad.tolist()
      [-1.0, 0.5, 1.0]
    """
    grads = _Gradients(_parameters(parameters), "clip_grad_value_")
    if grads.arrays:
        grads.write(_clamp(grads.arrays, jnp.asarray(float(clip_value))))
