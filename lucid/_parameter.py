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

from ._storage import OwnArrays, Storage


def _as_array(value: Any, what: str) -> jax.Array:
    if isinstance(value, jax.Array):
        return value
    if isinstance(value, np.ndarray | np.generic) or _is_torch_tensor(value):
        return jnp.asarray(np.asarray(value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return jnp.asarray(value)
    raise TypeError(f"{what} must be an array, but got {type(value).__name__}")


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


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
        value = jnp.asarray(data.data if isinstance(data, Parameter) else data)
        requested = getattr(data, "dtype", None)
        if (
            requested is not None
            and np.dtype(requested) == np.float64
            and value.dtype != np.float64
        ):
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
        if value is not None and not _is_sparse(value):
            try:
                value = _as_array(value, "a gradient")
            except TypeError:
                raise TypeError(
                    f"assigned grad has data of a different type: expected an array of shape "
                    f"{self.shape} and dtype {self.dtype}, got {type(value).__name__}"
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


def _is_sparse(value: Any) -> bool:
    from .functional._rule import is_sparse

    return is_sparse(value)
