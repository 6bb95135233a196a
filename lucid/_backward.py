"""`backward`: differentiating through Parameters, wherever they are stored.

`partition` splits `(tree, args, kwargs)` into traced inputs (the buffer of
what every `lucid._storage.Storage` a Parameter lives in traces it through,
`Storage.traced`, and plain arrays) and a hashable static part;
`rebuild_from_views` puts the tree back together from the storages'
per-parameter views inside a trace. Both `backward` and the compiled
optimizer's fused step use this pair, so a loss function sees the same arrays
however its parameters are stored.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._parameter import Parameter
from ._storage import Traceable, cut_views, run_time_offsets


class Traced(NamedTuple):
    """A partitioned call: traced inputs, the static description, and the storages."""

    buffers: list[jax.Array]  # one per storage
    arrays: list[jax.Array]  # plain array leaves
    static: tuple  # (treedef, kinds, static_leaves, layouts): hashable
    storages: list[Traceable]  # what each buffer is traced through (`Storage.traced`)
    indices: list[list[int]]  # per storage, the indices of its parameters in the call


def _is_parameter(x: Any) -> bool:
    return isinstance(x, Parameter)


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def partition(tree: Any, args: tuple, kwargs: dict) -> Traced:
    """Split ``(tree, args, kwargs)`` into traced inputs and a hashable static part.

    A leaf is a Parameter (``("param", storage position, index)``), an array
    (traced) or anything else (static, part of the cache key).
    """
    leaves, treedef = jax.tree_util.tree_flatten((tree, args, kwargs), is_leaf=_is_parameter)
    # one pass, per leaf as little as can be (a model of thousands of small tensors
    # pays this at every call): the kinds are the static part of the key
    storages: list[Traceable] = []
    indices: list[list[int]] = []
    position: dict[int, int] = {}
    kinds: list[tuple] = []
    arrays: list[Any] = []
    static_leaves: list[Any] = []
    array_kind, static_kind = ("array",), ("static",)
    array_types = (jax.Array, np.ndarray)
    for leaf in leaves:
        if isinstance(leaf, Parameter):
            held_in, held_at = leaf.location
            traced, index = held_in.traced(held_at)
            at = position.get(id(traced))
            if at is None:
                at = position[id(traced)] = len(storages)
                storages.append(traced)
                indices.append([])
            indices[at].append(index)
            kinds.append(("param", at, index))
        elif isinstance(leaf, array_types):
            kinds.append(array_kind)
            arrays.append(leaf)
        else:
            kinds.append(static_kind)
            static_leaves.append(leaf)
    layouts = tuple(s.layout for s in storages)
    static = (treedef, tuple(kinds), tuple(static_leaves), layouts)
    return Traced([s.buffer for s in storages], arrays, static, storages, indices)


def array_count(tree: Any) -> int:
    """How many plain array leaves ``tree`` has (Parameters not counted): the first
    ``array_count(tree)`` of `partition`'s arrays are ``tree``'s."""
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=_is_parameter)
    return sum(1 for leaf in leaves if not _is_parameter(leaf) and _is_array(leaf))


def parameters_in(tree: Any) -> list[Parameter]:
    """Every Parameter among ``tree``'s leaves, in order."""
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=_is_parameter)
    return [leaf for leaf in leaves if isinstance(leaf, Parameter)]


PROGRAMS_KEPT = 64  # distinct (loss function, structure) pairs whose programs stay compiled


def one_element(loss: Any) -> Any:
    """The loss as the 0-d array that is differentiated.

    torch's ``loss.backward()`` takes a tensor of exactly one element, whatever its
    shape (``(1,)``, ``(1, 1)``...), and differentiates that element; so does lucid.
    Anything that is not an array is left to JAX (and its error).

    Raises:
      RuntimeError: an array of any other size (torch's error), naming its shape.
    """
    if not isinstance(loss, jax.Array | np.ndarray) or loss.ndim == 0:
        return loss
    if math.prod(loss.shape) != 1:
        raise RuntimeError(
            "grad can be implicitly created only for scalar outputs: the loss must have "
            f"exactly one element, but loss_fn returned an array of shape {tuple(loss.shape)}"
        )
    return jnp.reshape(loss, ())


def _described(value: Any) -> str:
    """A returned value as an error shows it: an array (or tracer) as ``float32[2, 3]``."""
    if isinstance(value, jax.Array | np.ndarray):
        return f"{value.dtype}[{', '.join(map(str, value.shape))}]"
    return type(value).__name__


def _not_a_loss(out: Any) -> TypeError:
    """The error for a container returned without ``has_aux``: what came back, which
    item looks like the loss, and the fix (``(loss, aux)`` with ``has_aux=True``)."""
    items = list(out.values()) if isinstance(out, dict) else list(out)
    shown = ", ".join(_described(x) for x in items)
    losses = [
        i
        for i, x in enumerate(items)
        if isinstance(x, jax.Array | np.ndarray) and math.prod(x.shape) == 1
    ]
    fix = (
        "return the pair (loss, aux), the loss first (aux: logits, metrics, any pytree), "
        "and pass has_aux=True"
    )
    if isinstance(out, tuple | list) and len(items) == 2 and losses == [1]:
        fix = (
            "its second item looks like the loss, as in (logits, loss): return "
            "(loss, logits) instead, e.g. `lambda *a, **k: loss_fn(*a, **k)[::-1]`, "
            "and pass has_aux=True"
        )
    elif isinstance(out, tuple | list) and len(items) == 2 and losses == [0]:
        fix = "if it is (loss, aux), pass has_aux=True"
    count = f"{len(items)} item" + ("" if len(items) == 1 else "s")
    return TypeError(
        f"loss_fn returned a {type(out).__name__} of {count} ({shown}) where "
        f"the loss (an array of one element) was expected: {fix}"
    )


def split_aux(out: Any, has_aux: bool) -> tuple[Any, Any]:
    """``(loss, aux)`` from what ``loss_fn`` returned (``aux`` is ``None`` without
    ``has_aux``). Runs where ``loss_fn`` is traced: the check reads the output's
    structure only.

    Raises:
      TypeError: ``has_aux`` and the output is not a pair (as `jax.value_and_grad`);
        or no ``has_aux`` and the output is a tuple, list or dict (JAX's "Gradient
        only defined for scalar-output functions"), with the fix: ``has_aux=True``.
    """
    if not has_aux:
        if isinstance(out, tuple | list | dict):
            raise _not_a_loss(out)
        return out, None
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise TypeError(
            "with has_aux=True, loss_fn must return a pair (loss, aux), but it returned "
            f"{type(out).__name__}"
        )
    return out[0], out[1]


def refuse_tracers(traced: Traced, where: str) -> None:
    """A stateful step cannot run inside ``jax.jit`` (or another transform).

    Raises:
      TypeError: an input is a JAX tracer; the message points to the pure forms.
    """
    if any(isinstance(x, jax.core.Tracer) for x in [*traced.buffers, *traced.arrays]):
        raise TypeError(
            f"{where} was called under jax.jit (or another JAX transformation): lucid's "
            "stateful step (backward writes .grad, step writes the Parameters) runs outside "
            "jit. For one compiled executable use lucid.fused_step(loss_fn, optimizer) (or "
            "lucid.compile_optimizer); for a pure function to jit yourself use the optax "
            "transforms of lucid.functional"
        )


def _value_and_grads(
    loss_fn: Callable[..., Any],
    static: tuple,
    buffers: list,
    arrays: list,
    has_aux: bool = False,
    offsets: tuple | None = None,
) -> tuple[Any, list]:
    """Loss (as ``loss_fn`` returned it: ``(loss, aux)`` with ``has_aux``) and
    gradients w.r.t. every storage's buffer (through per-parameter views, so no
    gradient is taken through a slice of a large buffer). ``offsets``: per buffer, the
    run-time offsets its views are cut at (`lucid._storage.run_time_offsets`), or
    ``None`` (every view cut at constant offsets)."""
    layouts = static[3]
    offsets = (None,) * len(layouts) if offsets is None else offsets

    def loss_of(views: list) -> tuple[jax.Array, Any]:
        tree, args, kwargs = rebuild_from_views(static, views, arrays)
        out = loss_fn(tree, *args, **kwargs)
        loss, _ = split_aux(out, has_aux)
        return one_element(loss), out

    views = list(map(cut_views, buffers, layouts, offsets))
    (_, out), view_grads = jax.value_and_grad(loss_of, has_aux=True)(views)
    return out, [layout.join(g) for g, layout in zip(view_grads, layouts)]


def rebuild_from_views(static: tuple, views: list, arrays: list) -> tuple[Any, tuple, dict]:
    """The `(tree, args, kwargs)` `partition` split, rebuilt from the storages' views
    (already cut) and the traced arrays."""
    treedef, kinds, static_leaves, _ = static
    array_it, other_it = iter(arrays), iter(static_leaves)
    leaves = []
    for kind in kinds:
        if kind[0] == "param":
            leaves.append(views[kind[1]][kind[2]])
        elif kind[0] == "array":
            leaves.append(next(array_it))
        else:
            leaves.append(next(other_it))
    return jax.tree_util.tree_unflatten(treedef, leaves)


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def loss_program(loss_fn: Callable[..., Any], static: tuple, has_aux: bool = False) -> Callable:
    """``(buffers, offsets, arrays) -> (loss, grads)`` for one loss function and call
    structure, jitted (``offsets``: `_value_and_grads`'). A bounded cache of programs of
    their own, rather than one ``jax.jit`` with static arguments: jax would keep
    thousands of compiled executables (one per new ``lambda``, ~1.5 MB each on CPU),
    while an evicted program here frees its own."""

    def run(buffers: list, offsets: tuple, arrays: list) -> tuple[jax.Array, list]:
        return _value_and_grads(loss_fn, static, buffers, arrays, has_aux, offsets)

    return jax.jit(run)


def _domains(arrays: list) -> set:
    """`device_domain` of every committed array, as a set: read once per distinct
    sharding (thousands of arrays share a handful), not once per array."""
    shardings = {
        x.sharding for x in arrays if isinstance(x, jax.Array) and getattr(x, "committed", True)
    }
    return {frozenset(d.id for d in s.device_set) for s in shardings}


def value_and_grads(
    loss_fn: Callable[..., Any], traced: Traced, has_aux: bool = False
) -> tuple[Any, list[jax.Array]]:
    """Loss and gradient w.r.t. every storage's buffer, each gradient placed as its buffer.

    Inputs committed to different devices cannot meet in one jitted call; they
    are gathered on the first input's device for the call, and each gradient
    goes back to where its buffer lives (correct everywhere, fast on one domain).
    """
    buffers, arrays = traced.buffers, traced.arrays
    # a storage's buffer may be a pytree of arrays (the eager step's pieces)
    leaves = jax.tree_util.tree_leaves(buffers)
    domains = _domains([*leaves, *arrays])
    if len(domains) > 1:
        device = next(iter(leaves[0].sharding.device_set))
        buffers = [jax.device_put(b, device) for b in buffers]
        arrays = [jax.device_put(a, device) if isinstance(a, jax.Array) else a for a in arrays]
    try:
        run = loss_program(loss_fn, traced.static, has_aux)
    except TypeError:  # an argument that cannot be hashed: evaluated eagerly
        loss, grads = _value_and_grads(loss_fn, traced.static, buffers, arrays, has_aux)
    else:
        # flat buffers cut at run-time offsets: one compiled cut per distinct shape
        offsets = tuple(map(run_time_offsets, traced.static[3], buffers))
        loss, grads = run(buffers, offsets, arrays)
    if len(domains) > 1:
        grads = [
            jax.tree_util.tree_map(lambda g, b: jax.device_put(g, b.sharding), g, b)
            for g, b in zip(grads, traced.buffers)
        ]
    return loss, grads


def backward(
    loss_fn: Callable[..., Any], tree: Any, *args: Any, has_aux: bool = False, **kwargs: Any
) -> Any:
    """Evaluate `loss_fn(tree, *args, **kwargs)` and add its gradients to the Parameters' `.grad`.

    lucid's `loss.backward()`. Every [Parameter][lucid.Parameter] in `tree`
    (or in `args`/`kwargs`) is replaced by its array before `loss_fn` sees it,
    and for each Parameter $p$ the gradient of the scalar loss $L$ is
    accumulated as torch accumulates it (a loss of exactly one element of any
    shape, `(1,)` or `(1, 1)`, is differentiated as its one element, as torch's
    `loss.backward()` does):

    $$
    p.\\mathrm{grad} \\leftarrow
    \\begin{cases}
    \\partial L / \\partial p & \\text{if } p.\\mathrm{grad} \\text{ is None} \\\\
    p.\\mathrm{grad} + \\partial L / \\partial p & \\text{otherwise.}
    \\end{cases}
    $$

    `loss_fn` runs under `jax.jit`, compiled once per structure: arrays
    anywhere in the arguments are traced, every other leaf (Python numbers,
    strings, callables) is static and part of the cache key, as with
    `equinox.filter_jit`. So `loss_fn` must be a pure function of its inputs
    (no side effects), like any JAX loss. Arguments that cannot be hashed fall
    back to eager evaluation. Parameters on different devices are gathered on
    one device for the call; each gradient lands where its parameter lives.
    Parameters held by a compiled optimizer are differentiated in place,
    through views of its buffers.

    `loss_fn` and the call's structure key a bounded cache of compiled
    programs (the 64 most recent stay compiled), which holds `loss_fn` and
    the call's static leaves until evicted.

    Args:
      loss_fn: `loss_fn(tree, *args, **kwargs) -> loss`, the loss (a 0-d array,
        or any array of exactly one element) as a pure JAX function of arrays.
      tree: a pytree holding Parameters (a Parameter, a dict or list of them,
        a model object registered as a pytree, a boxed tree from
        [lucid.parameters][lucid.parameters]).
      *args: further positional arguments of `loss_fn` (data, targets); they
        may hold Parameters too.
      has_aux: `loss_fn` returns a pair `(loss, aux)` (logits, metrics: any
        pytree of arrays); only `loss` is differentiated, as with
        `jax.value_and_grad(..., has_aux=True)`.
      **kwargs: further keyword arguments of `loss_fn`.

    Returns:
      The loss as `loss_fn` returned it (a `jax.Array` of one element: 0-d,
      or the shape it had); with `has_aux`, the pair `(loss, aux)`.

    Raises:
      ValueError: the arguments hold no Parameter (a pytree of plain arrays:
        the message says to box it with `lucid.parameters`).
      TypeError: called under `jax.jit` or another transformation (the step is
        stateful: use [fused_step][lucid.fused_step] or `lucid.functional`), or
        `has_aux` and `loss_fn` did not return a pair.
      RuntimeError: the loss has more (or fewer) than one element (torch's
        error); the message names its shape, and no `.grad` changed.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, 2.0]))
      >>> float(lucid.backward(lambda w: (w ** 2).sum(), w)), w.grad.tolist()
      (5.0, [2.0, 4.0])
      >>> loss = lucid.backward(lambda w, x: (w * x).sum(), w, jnp.array([1.0, 1.0]))
      >>> w.grad.tolist()  # accumulated, as torch's backward() does
      [3.0, 5.0]
      >>> lucid.backward(lambda w: w.sum(0, keepdims=True), w).shape  # one element
      (1,)
      >>> loss, aux = lucid.backward(lambda w: ((w ** 2).sum(), w * 2), w, has_aux=True)
      >>> aux.tolist()
      [2.0, 4.0]
    """
    traced = partition(tree, args, kwargs)
    refuse_tracers(traced, "lucid.backward")
    if not traced.storages:
        hint = ""
        if any(jnp.issubdtype(a.dtype, jnp.inexact) for a in traced.arrays):
            hint = (
                ": its arrays are plain arrays; box the model's pytree with "
                "`boxed = lucid.parameters(tree)` and pass `boxed`"
            )
        raise ValueError(f"lucid.backward: the arguments hold no lucid.Parameter{hint}")
    loss, grads = value_and_grads(loss_fn, traced, has_aux)
    layouts = traced.static[3]  # read once by partition (a storage may build it anew)
    for storage, grad, indices, layout in zip(traced.storages, grads, traced.indices, layouts):
        present = np.zeros(layout.param_count, bool)
        present[indices] = True
        storage.add_grads(grad, present)
    return loss
