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


class Parameter:
    """A trainable array: ``.data`` (a ``jax.Array``) and ``.grad`` (``None`` or an array).

    Hashable by identity, like a torch parameter, so it can key optimizer state.
    """

    __slots__ = ("__weakref__", "_data", "grad")

    def __init__(self, data: Any) -> None:
        self._data = jnp.asarray(data)
        self.grad: jax.Array | None = None

    @property
    def data(self) -> jax.Array:
        """The current value."""
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = jnp.asarray(value)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return int(self._data.size)

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the current value."""
        return np.asarray(self._data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._data, dtype=dtype)

    def __repr__(self) -> str:
        grad = "None" if self.grad is None else f"array{tuple(self.grad.shape)}"
        body = np.array2string(np.asarray(self._data), prefix="Parameter(", threshold=20)
        return f"Parameter({body}, dtype={self.dtype}, grad={grad})"


def _is_parameter(x: Any) -> bool:
    return isinstance(x, Parameter)


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


def _value_and_grads(
    loss_fn: Callable[..., Any], dynamic: tuple[list, list], static: tuple
) -> tuple[jax.Array, list]:
    """Loss and gradients w.r.t. the Parameters' values; traced once per structure."""
    treedef, kinds, static_leaves = static

    def loss_of(param_values: list, array_values: list) -> jax.Array:
        params, arrays, others = iter(param_values), iter(array_values), iter(static_leaves)
        leaves = [
            next(params) if kind == "param" else next(arrays) if kind == "array" else next(others)
            for kind in kinds
        ]
        tree, args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return loss_fn(tree, *args, **kwargs)

    return jax.value_and_grad(loss_of)(*dynamic)


_compiled_value_and_grads = jax.jit(_value_and_grads, static_argnums=(0, 2))


def backward(loss_fn: Callable[..., Any], tree: Any, *args: Any, **kwargs: Any) -> jax.Array:
    """Evaluate ``loss_fn(tree, *args, **kwargs)`` and accumulate gradients into ``.grad``.

    Every :class:`Parameter` in the pytree ``tree`` is replaced by its array
    before ``loss_fn`` sees it; the gradient of the (scalar) loss with respect
    to each Parameter is *added* to its ``.grad`` (set when it was ``None``),
    as ``loss.backward()`` does in torch. Returns the loss.

    ``loss_fn`` runs under ``jax.jit``, compiled once per structure: arrays
    anywhere in the arguments are traced, every other leaf (Python numbers,
    strings, callables) is static, as with ``equinox.filter_jit``. So
    ``loss_fn`` must be a pure function of its inputs (no side effects), like
    any JAX loss. Arguments that cannot be hashed fall back to eager
    evaluation.
    """
    leaves, treedef = jax.tree_util.tree_flatten((tree, args, kwargs), is_leaf=_is_parameter)
    boxes = [leaf for leaf in leaves if isinstance(leaf, Parameter)]
    if not boxes:
        raise ValueError("lucid.backward: the tree holds no lucid.Parameter")
    kinds = tuple(
        "param" if isinstance(x, Parameter) else "array" if _is_array(x) else "static"
        for x in leaves
    )
    static_leaves = tuple(x for x, kind in zip(leaves, kinds) if kind == "static")
    dynamic = ([p.data for p in boxes], [x for x, k in zip(leaves, kinds) if k == "array"])
    static = (treedef, kinds, static_leaves)
    try:
        hash((loss_fn, static))
        run = _compiled_value_and_grads
    except TypeError:
        run = _value_and_grads
    loss, grads = run(loss_fn, dynamic, static)
    for box, grad in zip(boxes, grads):
        box.grad = grad if box.grad is None else box.grad + grad
    return loss
