"""``Parameter``: a mutable box around a jax.Array, with torch's identity semantics.

A torch parameter is an identity that survives in-place updates; a jax.Array
is an immutable value. ``Parameter`` restores the identity: optimizers key
their state by the box and replace ``.data`` on every step, and ``.grad``
accumulates as torch's does until ``zero_grad``. Where the value and gradient
live is the business of a :class:`~lucid._storage.Storage` (the parameter's
own arrays, or a slice of a compiled optimizer's flat buffer); the box only
forwards to it.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._arrays import is_sparse, is_torch_tensor, torch_to_numpy
from ._storage import OwnArrays, Storage


def _as_array(value: Any, what: str, numbers: bool = True) -> jax.Array:
    """``value`` as a jax array: jax, NumPy and torch arrays (any float dtype they
    share), and, where ``numbers``, Python numbers."""
    if isinstance(value, jax.Array):
        return value
    if isinstance(value, np.ndarray | np.generic):
        return jnp.asarray(value)
    if is_torch_tensor(value):
        return jnp.asarray(torch_to_numpy(value))
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return jnp.asarray(value)
    raise TypeError(f"{what} must be an array, but got {type(value).__name__}")


def _requested_dtype(data: Any) -> Any:
    """The dtype ``data`` asks for (``None`` for Python numbers and lists)."""
    if is_torch_tensor(data):
        return str(data.dtype).removeprefix("torch.")
    return getattr(data, "dtype", None)


class Parameter:
    """A trainable array: ``.data`` (a ``jax.Array``) and ``.grad`` (``None`` or an array).

    Hashable by identity, like a torch parameter, so it can key optimizer state.

    Args:
      data: the initial value (anything ``jnp.asarray`` accepts).

    Raises:
      TypeError: ``.grad`` is assigned something that is not an array or None.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(3))
      >>> w.grad = jnp.ones(3)
      >>> w.shape, w.grad.sum().item()
      ((3,), 3.0)
    """

    __slots__ = ("__weakref__", "_index", "_storage")

    def __init__(self, data: Any) -> None:
        if isinstance(data, Parameter):
            data = data.data
        if is_sparse(data):
            raise ValueError(
                "a Parameter must be dense, but got a sparse array; use its .todense()"
            )
        value = jnp.asarray(torch_to_numpy(data) if is_torch_tensor(data) else data)
        requested = _requested_dtype(data)
        if requested is not None and str(requested) == "float64" and value.dtype != np.float64:
            warnings.warn(
                "a float64 array became a float32 Parameter because jax's x64 mode is off; "
                "enable it with jax.config.update('jax_enable_x64', True) before creating "
                "arrays (or set JAX_ENABLE_X64=1)",
                stacklevel=2,
            )
        self._storage: Storage = OwnArrays(value)
        self._index = 0

    # ------------------------------------------------------------ value
    @property
    def data(self) -> jax.Array:
        """The current value."""
        return self._storage.value(self._index)

    @data.setter
    def data(self, value: Any) -> None:
        self._storage.set_value(self._index, _as_array(value, "Parameter.data"))

    @property
    def grad(self) -> Any:
        """The accumulated gradient, or ``None``."""
        return self._storage.grad(self._index)

    @grad.setter
    def grad(self, value: Any) -> None:
        if value is not None and not is_sparse(value):
            try:
                value = _as_array(value, "a gradient", numbers=False)
            except TypeError:
                raise TypeError(
                    f"assigned grad expected to be an array or None: expected an array of "
                    f"shape {self.shape} and dtype {self.dtype}, got {type(value).__name__}"
                ) from None
        self._storage.set_grad(self._index, value)

    @property
    def shape(self) -> tuple[int, ...]:
        """The value's shape."""
        return self._storage.shape(self._index)

    @property
    def dtype(self) -> np.dtype:
        """The value's dtype."""
        return self._storage.dtype(self._index)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape))

    # ---------------------------------------------------------- storage
    @property
    def location(self) -> tuple[Storage, int]:
        """``(storage, index)``: where the value and gradient live now."""
        return self._storage, self._index

    def relocate(self, storage: Storage, index: int = 0) -> None:
        """Make ``storage`` at ``index`` the one place this parameter lives.

        For storages (compiled optimizers move parameters into flat buffers):
        the new storage must already hold the current value and gradient.
        """
        self._storage, self._index = storage, index

    def release(self) -> None:
        """Move the value and gradient back into arrays of the parameter's own."""
        self._storage, self._index = OwnArrays(self.data, self.grad), 0

    # ------------------------------------------------------------ misc
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
