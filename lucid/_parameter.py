"""`Parameter`: a mutable box around a jax.Array, with torch's identity semantics.

A torch parameter is an identity that survives in-place updates; a jax.Array
is an immutable value. `Parameter` restores the identity: optimizers key
their state by the box and replace `.data` on every step, and `.grad`
accumulates as torch's does until `zero_grad`. Where the value and gradient
live is the business of a *storage* (`lucid._storage.Storage`: the
parameter's own arrays, or a slice of a compiled optimizer's flat buffer); the
box only forwards to it.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._arrays import is_sparse, is_torch_tensor, torch_to_numpy
from ._placement import check_grad_placement
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


# Python's binary operators: the dunder stem and the symbol
_BINARY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "matmul": "@",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "pow": "**",
    "and": "&",
    "or": "|",
    "xor": "^",
    "lshift": "<<",
    "rshift": ">>",
}
_UNARY = {"neg": "-", "pos": "+", "invert": "~", "abs": "abs"}
_BOX = "a lucid.Parameter is a box around an array, not an array"
_LIBRARY = (
    "A model library that reads its weights this way (flax.nnx's `variable[...]`, "
    "`len(variable)`) was given Parameters in place of arrays: hand it the values, "
    "`nnx.update(model, lucid.values(boxed))`, not the boxed tree"
)


def _operand(value: Any) -> str:
    return f"'{type(value).__name__}'"


def _binary(stem: str, symbol: str) -> tuple[Any, Any, Any]:
    """``__op__``, ``__rop__`` and ``__iop__`` that refuse in words: compute with
    ``.data`` (assign ``.data`` to change the value)."""

    def forward(self: Parameter, other: Any) -> Any:
        raise TypeError(
            f"unsupported operand type(s) for {symbol}: 'Parameter' and {_operand(other)}: "
            f"{_BOX}; compute with its value, `p.data {symbol} x`"
        )

    def reflected(self: Parameter, other: Any) -> Any:
        raise TypeError(
            f"unsupported operand type(s) for {symbol}: {_operand(other)} and 'Parameter': "
            f"{_BOX}; compute with its value, `x {symbol} p.data`"
        )

    def in_place(self: Parameter, other: Any) -> Any:
        raise TypeError(
            f"unsupported operand type(s) for {symbol}=: 'Parameter' and {_operand(other)}: "
            f"{_BOX}; to change its value, assign `.data`: `p.data = p.data {symbol} x`"
        )

    for method, kind in ((forward, ""), (reflected, "r"), (in_place, "i")):
        method.__name__ = method.__qualname__ = f"__{kind}{stem}__"
    return forward, reflected, in_place


def _unary(stem: str, symbol: str) -> Any:
    operation, fix = (
        ("abs()", "abs(p.data)") if symbol == "abs" else (f"unary {symbol}", f"{symbol}p.data")
    )

    def refuse(self: Parameter) -> Any:
        raise TypeError(
            f"bad operand type for {operation}: 'Parameter': {_BOX}; compute with its "
            f"value, `{fix}`"
        )

    refuse.__name__ = refuse.__qualname__ = f"__{stem}__"
    return refuse


def _requested_dtype(data: Any) -> Any:
    """The dtype ``data`` asks for (``None`` for Python numbers and lists)."""
    if is_torch_tensor(data):
        return str(data.dtype).removeprefix("torch.")
    return getattr(data, "dtype", None)


class Parameter:
    """A trainable array: `.data` (a `jax.Array`) and `.grad` (an array or `None`).

    torch's `nn.Parameter` is an identity that survives in-place updates; a
    `jax.Array` is an immutable value. A `Parameter` is the identity: an
    optimizer keys its state by it and replaces `.data` at every step, and
    `.grad` accumulates as torch's does ([backward][lucid.backward] adds to it,
    an optimizer's `zero_grad` resets it). It is hashable and compared by
    identity, as a torch tensor is, so it can key optimizer state and sit in
    any pytree (dicts, lists, your own classes) that a loss function reads.

    It is not an array: arithmetic, indexing and `len` raise a `TypeError`
    that points at the value (`p.data * 2`, `p.data[0]`; to change it, assign
    `p.data = ...`), as does a model library handed Parameters in place of
    arrays, at its first use of one. `np.asarray(p)` and `p.numpy()` copy the
    value.

    The value and the gradient live in one *storage* at a time: the
    parameter's own two arrays, or, after
    [compile_optimizer][lucid.compile_optimizer], a slice of the compiled
    optimizer's flat buffers. `.data`, `.grad` and the other properties read
    and write wherever that is, so code holding the Parameter never notices.

    Args:
      data: the initial value: a jax, NumPy or torch array (any float dtype
        they share, bfloat16 and float8 included), a Python number or nested
        list (anything `jnp.asarray` accepts), or another `Parameter`, whose
        current value is taken. It must be dense.

    Raises:
      ValueError: `data` is a sparse array (`jax.experimental.sparse`); pass
        `data.todense()`.

    Warns:
      UserWarning: `data` is float64 while jax's x64 mode is off, so the
        Parameter holds float32 (enable x64 before creating arrays).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros((2, 3)))
      >>> w.shape, w.dtype, w.ndim, w.size
      ((2, 3), dtype('float32'), 2, 6)
      >>> w.grad is None
      True
      >>> w.grad = jnp.ones((2, 3))
      >>> w.data = w.data - 0.5 * w.grad
      >>> w.data.tolist()
      [[-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5]]
      >>> {w: "a Parameter keys a dict by identity"}[w]
      'a Parameter keys a dict by identity'
    """

    __slots__ = ("__weakref__", "_index", "_storage")
    # numpy's operators defer to the Parameter's (which refuse in words), as to a torch
    # tensor's, instead of converting it through __array__
    __array_priority__ = 1000
    # not iterable (Python would otherwise iterate through __getitem__)
    __iter__ = None

    def __init__(self, data: Any) -> None:
        if isinstance(data, Parameter):
            data = data.data
        if is_sparse(data):
            raise ValueError(
                "a Parameter must be dense, but got a sparse array; use its .todense()"
            )
        if is_torch_tensor(data):
            value = jnp.asarray(torch_to_numpy(data))
        elif isinstance(data, np.ndarray):
            # a copy: on the CPU jax may share a NumPy array's memory (a torch tensor's
            # .numpy() view, which torch then updates in place)
            value = jnp.array(data, copy=True)
        else:
            value = jnp.asarray(data)
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
        """The current value, a `jax.Array` (torch: `param.data`).

        Assigning replaces the value (a jax, NumPy or torch array, or a Python
        number); it is how an optimizer's step writes its result, and how you
        set a value by hand. Assign an array of the same shape and dtype: the
        optimizers' state was made for those.

        Raises:
          TypeError: on assignment, a value that is not an array or a number.
        """
        return self._storage.value(self._index)

    @data.setter
    def data(self, value: Any) -> None:
        self._storage.set_value(self._index, _as_array(value, "Parameter.data"))

    @property
    def grad(self) -> Any:
        """The accumulated gradient: an array shaped as `.data`, or `None` (torch: `param.grad`).

        [backward][lucid.backward] adds to it (sets it when `None`); an
        optimizer's `zero_grad()` sets it back to `None` (or zeros with
        `set_to_none=False`); `step()` updates the parameters whose gradient
        is not `None`. You may assign any array (a jax, NumPy or torch array,
        or a `jax.experimental.sparse` array for the optimizers that take
        sparse gradients) or `None`; its shape and dtype are checked, with
        torch's errors, when a step uses it. An array committed to devices
        (`jax.device_put`) must be on the parameter's devices (any sharding over
        them), as torch requires a gradient on its parameter's device.

        Raises:
          TypeError: on assignment, something that is neither an array nor `None`.
          RuntimeError: on assignment, an array committed to other devices than
            the parameter's value (torch's error); nothing is changed.
        """
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
            if getattr(value, "committed", False):  # placed by hand: torch's device check
                held = self._storage.buffer  # the fast check: the same kind, devices
                if (
                    type(held) is not type(value)
                    or held.sharding.device_set != value.sharding.device_set
                ):
                    check_grad_placement(self, value)
        self._storage.set_grad(self._index, value)

    @property
    def shape(self) -> tuple[int, ...]:
        """The value's shape, a tuple of ints (torch: `param.shape`), read without
        touching the array."""
        return self._storage.shape(self._index)

    @property
    def dtype(self) -> np.dtype:
        """The value's dtype, a NumPy dtype (`dtype('float32')`; torch: `param.dtype`)."""
        return self._storage.dtype(self._index)

    @property
    def ndim(self) -> int:
        """The number of dimensions, `len(shape)` (torch: `param.ndim`)."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements, the product of `shape` (torch: `param.numel()`; note
        that torch's `param.size()` is the shape)."""
        return int(np.prod(self.shape))

    # ---------------------------------------------------------- storage
    @property
    def location(self) -> tuple[Storage, int]:
        """`(storage, index)`: the storage the value and gradient live in now, and
        this parameter's index in it.

        A parameter starts in a storage of its own (index 0); a compiled
        optimizer moves it into a slice of its flat buffers. For code that
        works on storages (lucid's clipping and tracing); a training loop never
        needs it.
        """
        return self._storage, self._index

    def relocate(self, storage: Storage, index: int = 0) -> None:
        """Make `storage` at `index` the one place this parameter lives.

        For storages (a compiled optimizer moves its parameters into flat
        buffers this way): the new storage must already hold the current value
        and gradient, since nothing is copied.

        Args:
          storage: the new storage (an object with the interface of lucid's storages:
            the flat buffers a compiled optimizer keeps).
          index: this parameter's index in `storage`.
        """
        self._storage, self._index = storage, index

    def release(self) -> None:
        """Move the value and gradient back into arrays of the parameter's own.

        The inverse of [relocate][lucid.Parameter.relocate]: afterwards the
        parameter no longer shares a buffer with a compiled optimizer.
        """
        self._storage, self._index = OwnArrays(self.data, self.grad), 0

    # ------------------------------------------------------------ misc
    def numpy(self) -> np.ndarray:
        """A NumPy copy of the current value (torch: `param.detach().numpy()`).

        Returns:
          A new `np.ndarray`; changing it does not change the Parameter.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> lucid.Parameter(jnp.array([1.0, 2.0])).numpy().tolist()
          [1.0, 2.0]
        """
        return np.array(self.data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)

    # ------------------------------------------------- not an array
    # Arithmetic and indexing refuse with the fix, `p.data`: a Parameter is the identity
    # that optimizers key their state by, and its value changes under it. A model library
    # given Parameters in place of arrays (flax's `nnx.update(model, boxed)`) reaches
    # here at its first use of a weight.
    def __getitem__(self, index: Any) -> Any:
        """Refused: index the value, `p.data[index]`.

        Raises:
          TypeError: always; the message names the fix (and, for a model library that
            indexes its weights, `lucid.values`).
        """
        raise TypeError(
            f"'Parameter' object is not subscriptable: {_BOX}; index its value, "
            f"`p.data[...]`. {_LIBRARY}"
        )

    def __len__(self) -> int:
        """Refused: the value's length is `len(p.data)` (or `p.shape[0]`).

        Raises:
          TypeError: always, as `__getitem__`.
        """
        raise TypeError(
            f"object of type 'Parameter' has no len(): {_BOX}; take its value's, "
            f"`len(p.data)` or `p.shape[0]`. {_LIBRARY}"
        )

    def __bool__(self) -> bool:
        """True, as any object (not `len`'s answer)."""
        return True

    def __repr__(self) -> str:
        grad = self.grad
        grad = "None" if grad is None else f"array{tuple(grad.shape)}"
        body = np.array2string(np.asarray(self.data), prefix="Parameter(", threshold=20)
        return f"Parameter({body}, dtype={self.dtype}, grad={grad})"


for _stem, _symbol in _BINARY.items():
    for _method in _binary(_stem, _symbol):
        setattr(Parameter, _method.__name__, _method)
for _stem, _symbol in _UNARY.items():
    setattr(Parameter, f"__{_stem}__", _unary(_stem, _symbol))


def values_of(params: list[Parameter]) -> list[jax.Array]:
    """The current values of ``params`` (``[p.data for p in params]``, read without
    the property's call per parameter: an optimizer's step reads every one)."""
    return [p._storage.value(p._index) for p in params]


def grads_of(params: list[Parameter]) -> list[Any]:
    """The gradients of ``params`` (``[p.grad for p in params]``, as `values_of`)."""
    return [p._storage.grad(p._index) for p in params]


def set_values(params: list[Parameter], values: list[jax.Array]) -> None:
    """Write ``values`` as the values of ``params``: arrays a step made for them, of
    their shapes and dtypes (no conversion, no check)."""
    for p, value in zip(params, values):
        p._storage.set_value(p._index, value)


def located_in(params: list[Parameter], storage: Storage) -> bool:
    """Whether every one of ``params`` still lives in ``storage`` (a check the eager
    step makes at every step, without the `location` property's call per parameter)."""
    return all(p._storage is storage for p in params)
