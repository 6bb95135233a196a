"""``Parameter``, a mutable box around a jax.Array, and ``backward``.

A torch parameter is an identity that survives in-place updates; a jax.Array
is an immutable value. ``Parameter`` restores the identity: optimizers key
their state by the box and replace ``.data`` on every step, and ``.grad``
accumulates as torch's does until ``zero_grad``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._layout import join_views, views_of


class Parameter:
    """A trainable array: ``.data`` (a ``jax.Array``) and ``.grad`` (``None`` or an array).

    Hashable by identity, like a torch parameter, so it can key optimizer state.
    Once a compiled optimizer owns it, the value and gradient live in that
    optimizer's flat buffers; ``.data`` and ``.grad`` then read and write
    slices of them, and nothing else changes for the user.
    """

    __slots__ = ("__weakref__", "_grad", "_index", "_store", "_value")

    def __init__(self, data: Any) -> None:
        self._value: jax.Array | None = jnp.asarray(data)
        self._grad: Any = None
        self._store: Any = None  # a lucid.optim._store.Store once compiled
        self._index = 0

    @property
    def data(self) -> jax.Array:
        """The current value."""
        if self._store is not None:
            return self._store.read(self._index)
        return self._value

    @data.setter
    def data(self, value: Any) -> None:
        if not isinstance(value, jax.Array):
            value = jnp.asarray(value)
        if self._store is not None:
            self._store.write(self._index, value)
        else:
            self._value = value

    @property
    def grad(self) -> Any:
        """The accumulated gradient, or ``None``."""
        if self._store is not None:
            return self._store.read_grad(self._index)
        return self._grad

    @grad.setter
    def grad(self, value: Any) -> None:
        if self._store is not None:
            self._store.write_grad(self._index, value)
        else:
            self._grad = value

    @property
    def shape(self) -> tuple[int, ...]:
        if self._store is not None:
            return self._store.shapes[self._index]
        return tuple(self._value.shape)

    @property
    def dtype(self) -> np.dtype:
        if self._store is not None:
            return self._store.dtype
        return self._value.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the current value."""
        return np.array(self.data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)

    def __repr__(self) -> str:
        grad = self.grad
        grad = "None" if grad is None else f"array{tuple(grad.shape)}"
        body = np.array2string(np.asarray(self.data), prefix="Parameter(", threshold=20)
        return f"Parameter({body}, dtype={self.dtype}, grad={grad})"

    def _attach(self, store: Any, index: int) -> None:
        """Hand value and gradient over to ``store`` (a compiled optimizer's)."""
        self._store, self._index = store, index
        self._value = self._grad = None

    def _detach(self, value: jax.Array, grad: Any) -> None:
        """Take value and gradient back as plain arrays."""
        self._store, self._index = None, 0
        self._value, self._grad = value, grad


def _is_parameter(x: Any) -> bool:
    return isinstance(x, Parameter)


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def leaves_from(kinds: tuple, free: list, views: list, arrays: list, static_leaves: tuple) -> list:
    """The flattened ``(tree, args, kwargs)`` leaves, from :func:`partition`'s pieces."""
    free_it, array_it, other_it = iter(free), iter(arrays), iter(static_leaves)
    leaves = []
    for kind in kinds:
        if kind[0] == "param":
            leaves.append(next(free_it))
        elif kind[0] == "stored":
            leaves.append(views[kind[1]][kind[2]])
        elif kind[0] == "array":
            leaves.append(next(array_it))
        else:
            leaves.append(next(other_it))
    return leaves


def _value_and_grads(
    loss_fn: Callable[..., Any], dynamic: tuple[list, list, list], static: tuple
) -> tuple[jax.Array, tuple[list, list]]:
    """Loss and gradients w.r.t. the free Parameters' values and the stores' buffers."""
    treedef, kinds, static_leaves, layouts = static
    free, stored, arrays = dynamic

    def loss_of(free: list, views: list) -> jax.Array:
        leaves = leaves_from(kinds, free, views, arrays, static_leaves)
        tree, args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return loss_fn(tree, *args, **kwargs)

    views = [views_of(buffer, layout) for buffer, layout in zip(stored, layouts)]
    loss, (free_grads, view_grads) = jax.value_and_grad(loss_of, argnums=(0, 1))(free, views)
    store_grads = [join_views(g, layout) for g, layout in zip(view_grads, layouts)]
    return loss, (free_grads, store_grads)


_compiled_value_and_grads = jax.jit(_value_and_grads, static_argnums=(0, 2))


def partition(tree: Any, args: tuple, kwargs: dict) -> tuple[tuple, tuple, list, list]:
    """Split ``(tree, args, kwargs)`` into traced inputs and a hashable static part.

    Returns ``(dynamic, static, free, stores)``: ``dynamic`` is (free
    Parameters' values, stores' buffers, other arrays); ``static`` describes
    where each leaf comes from; ``free`` lists the Parameters not held by a
    store; ``stores`` the stores of the others, in order of first appearance.
    """
    leaves, treedef = jax.tree_util.tree_flatten((tree, args, kwargs), is_leaf=_is_parameter)
    free: list[Parameter] = []
    stores: list[Any] = []
    kinds = []
    for leaf in leaves:
        if isinstance(leaf, Parameter):
            if leaf._store is None:
                free.append(leaf)
                kinds.append(("param",))
            else:
                if not any(leaf._store is s for s in stores):
                    stores.append(leaf._store)
                position = next(i for i, s in enumerate(stores) if s is leaf._store)
                kinds.append(("stored", position, leaf._index))
        elif _is_array(leaf):
            kinds.append(("array",))
        else:
            kinds.append(("static",))
    static_leaves = tuple(x for x, kind in zip(leaves, kinds) if kind[0] == "static")
    layouts = tuple(s.layout for s in stores)
    dynamic = (
        [p.data for p in free],
        [s.values for s in stores],
        [x for x, kind in zip(leaves, kinds) if kind[0] == "array"],
    )
    static = (treedef, tuple(kinds), static_leaves, layouts)
    return dynamic, static, free, stores


def backward(loss_fn: Callable[..., Any], tree: Any, *args: Any, **kwargs: Any) -> jax.Array:
    """Evaluate ``loss_fn(tree, *args, **kwargs)`` and accumulate gradients into ``.grad``.

    Every :class:`Parameter` in the pytree ``tree`` (or in ``args``/``kwargs``)
    is replaced by its array before ``loss_fn`` sees it; the gradient of the
    (scalar) loss with respect to each Parameter is *added* to its ``.grad``
    (set when it was ``None``), as ``loss.backward()`` does in torch. Returns
    the loss.

    ``loss_fn`` runs under ``jax.jit``, compiled once per structure: arrays
    anywhere in the arguments are traced, every other leaf (Python numbers,
    strings, callables) is static, as with ``equinox.filter_jit``. So
    ``loss_fn`` must be a pure function of its inputs (no side effects), like
    any JAX loss. Arguments that cannot be hashed fall back to eager
    evaluation.
    """
    dynamic, static, free, stores = partition(tree, args, kwargs)
    if not free and not stores:
        raise ValueError("lucid.backward: the arguments hold no lucid.Parameter")
    try:
        hash((loss_fn, static))
        run = _compiled_value_and_grads
    except TypeError:
        run = _value_and_grads
    loss, (free_grads, store_grads) = run(loss_fn, dynamic, static)
    for box, grad in zip(free, free_grads):
        box.grad = grad if box.grad is None else box.grad + grad
    kinds = static[1]
    for position, (store, grad) in enumerate(zip(stores, store_grads)):
        present = np.zeros(len(store.params), bool)
        for kind in kinds:
            if kind[0] == "stored" and kind[1] == position:
                present[kind[2]] = True
        store.accumulate(grad, present)
    return loss
