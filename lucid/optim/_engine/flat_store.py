"""Flat storage behind Parameter boxes, for the compiled backend.

A `FlatStore` (a `lucid._storage.Storage`; its layout is a
`lucid.optim._engine.layout.Layout`) holds the values of several Parameters of
one dtype and one placement as a single buffer (``flat``): 1-D for parameters
on one device or replicated, ``(rows, columns)`` for parameters sharded along
their first axis, so each device holds the blocks it already had and nothing
moves. A parameter with any other sharding keeps its own array, shape and
sharding. It also holds their gradients the same way, so a compiled step reads
and writes a handful of large buffers instead of thousands of small ones: per-
array dispatch costs about 5 us in JAX, which for 2000 small tensors and 7
arrays each is more than the whole update.

Each Parameter keeps its identity: ``p.data`` and ``p.grad`` read a slice of
the store (computed once per change and cached), and assigning them writes the
slice in place. Invariant: the gradient slice of a parameter without a
gradient is zero.

*Sharded state* (ZeRO-1): a store of replicated parameters may keep its state
buffers sharded over a mesh axis (``state_sharding``). They are the flat layout
padded with zeros to a multiple of the shard count, so each device holds an
equal, contiguous piece; the padding is never shown (views cut from offset 0).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..._storage import OwnArrays, accumulated, check_grad
from ...functional._apply import compute_dtype
from ...functional._sparse import dense
from .layout import Layout, join_views, views_of
from .programs import PROGRAMS_KEPT
from .sharding import shard_count

Array = jax.Array


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _read(buffer: Array, offset: Array, columns: int, rows: int, shape: tuple[int, ...]) -> Array:
    if rows == 1:
        return jax.lax.dynamic_slice(buffer, (offset,), (columns,)).reshape(shape)
    zero = jnp.zeros_like(offset)  # index operands share a dtype (int32 with x64 too)
    return jax.lax.dynamic_slice(buffer, (zero, offset), (rows, columns)).reshape(shape)


@functools.partial(jax.jit, donate_argnums=(0,))
def _write(buffer: Array, value: Array, offset: Array) -> Array:
    if buffer.ndim == 1:
        piece, start = value.reshape(-1), (offset,)
    else:
        piece, start = value.reshape(buffer.shape[0], -1), (jnp.zeros_like(offset), offset)
    return jax.lax.dynamic_update_slice(buffer, piece.astype(buffer.dtype), start)


_split = jax.jit(views_of, static_argnums=(1,))


@functools.partial(jax.jit, static_argnums=(1,), donate_argnums=(0,))
def _zeroed(buffer: Array, spans: tuple[tuple[int, int], ...]) -> Array:
    """``buffer`` with zeros in the columns ``[start, start + width)`` of each span."""
    for start, width in spans:
        buffer = buffer.at[..., start : start + width].set(0)
    return buffer


@functools.lru_cache(maxsize=PROGRAMS_KEPT)  # bounded: a sweep over sizes keeps not all
def _padded(length: int, dtype: Any, sharding: Any) -> Any:
    """A jitted ``buffer -> buffer padded with zeros to length``, placed by ``sharding``
    (one compiled program, run by every process of a multi-process mesh alike)."""

    def pad(buffer: Array) -> Array:
        buffer = jnp.zeros(length, dtype) if buffer is None else buffer.astype(dtype)
        return jnp.pad(buffer, (0, length - buffer.shape[0]))

    return jax.jit(pad, out_shardings=sharding)


def _offsets(layout: Layout) -> tuple:
    """Where each parameter of a flat ``layout`` starts (in columns for rows)."""
    # int32 where it fits: a Python int is an int64 index under x64, which Apple
    # GPUs' programs avoid (docs/backends.md)
    return tuple(np.int32(o) if o < 2**31 else o for o in layout.column_offsets)


class FlatStore:
    """Parameters' values and gradients in one buffer (see module docstring)."""

    def __init__(
        self,
        params: Sequence[Any],
        values: Sequence[Array],
        flat: bool,
        rows: int = 1,
        sharding: Any = None,
        state_sharding: Any = None,
        align: int = 1,
    ) -> None:
        # weakly: each parameter keeps its store (its value lives there), so a strong
        # list would be a cycle that keeps the buffers until the cyclic gc runs; while
        # an optimizer holds the store, it holds the parameters too
        self._params = [weakref.ref(p) for p in params]
        self.flat = flat
        self.value_dtype = values[0].dtype
        self.wide = compute_dtype(self.value_dtype) == np.float64  # hyper-parameters in float64 too
        self.shapes = tuple(tuple(v.shape) for v in values)
        self.sizes = tuple(int(np.prod(s)) for s in self.shapes)
        self.layout = Layout(flat, rows, self.sizes, self.shapes, align if flat else 1)
        self.sharding = sharding  # imposed on the flat buffers (None: where they land)
        # state buffers sharded over a mesh axis (ZeRO-1), padded to ``state_length``
        self.state_sharding = state_sharding if flat and rows == 1 else None
        total = sum(self.sizes)
        shards = shard_count(self.state_sharding)
        self.state_length = -(-total // shards) * shards
        self.columns = tuple(size // rows for size in self.sizes)
        self.offsets = _offsets(self.layout)
        self.values: Array = self.like(values) if flat else jnp.asarray(values[0])
        self.grads: Array | None = None
        self.has_grad = np.zeros(len(self._params), bool)
        # gradients assigned sparse, by index: the step checks them as torch does,
        # and .grad shows them as assigned (the buffer holds them densified)
        self.sparse: dict[int, Any] = {}
        self._value_cache: dict[int, Array] = {}
        self._grad_cache: dict[int, Array] = {}
        # the owning backend's handler of a value of a new shape or dtype, called with
        # (store, index, value); held weakly, so the store (which its parameters keep)
        # never keeps the backend, its state and its programs alive
        self.on_restructure: weakref.WeakMethod | None = None

    @property
    def params(self) -> list[Any]:
        """The parameters the store holds, in index order (``None`` for one that is gone,
        which only happens once no optimizer holds the store)."""
        return [ref() for ref in self._params]

    def param(self, index: int) -> Any:
        """The parameter at ``index`` (`params`, without building the list)."""
        return self._params[index]()

    @property
    def owned(self) -> bool:
        """Whether a live compiled optimizer holds this store. Once it is gone (or has
        released the store) the store is only where its parameters' values still live:
        another compiled optimizer takes them over instead of borrowing them."""
        return self.on_restructure is not None and self.on_restructure() is not None

    def views(self, buffer: Array) -> list[Array]:
        """Every parameter's slice of ``buffer`` (a value, gradient or state buffer,
        per element or, for a rule over blocks, per block), as new arrays: the
        store's own buffers are donated to the next step."""
        if not self.flat:
            return [jnp.array(buffer, copy=True)]
        return _split(buffer, self._layout_of(buffer))

    def _layout_of(self, buffer: Array) -> Layout:
        """The values' layout, or, for a shorter state buffer of a rule over blocks,
        the layout of one entry per ``k`` elements."""
        return self._layout_per(sum(self.sizes), buffer.shape[0])

    def _layout_per(self, elements: int, entries: int) -> Layout:
        """The layout of a buffer of ``entries`` for ``elements`` of values."""
        if self.layout.align == 1 or entries == elements:
            return self.layout
        if entries == 0 or elements % entries:
            raise ValueError(f"a state buffer of {entries} entries for {elements} elements")
        return self.layout.per(elements // entries)

    def like(self, arrays: Sequence[Array]) -> Array:
        """Per-parameter arrays laid out as this store's buffers are, in a new buffer
        (state fields may share one zeros array, and each buffer is donated)."""
        if not self.flat:
            return jnp.array(arrays[0], copy=True)
        return self._assembled(arrays, self.layout)

    def _assembled(self, arrays: Sequence[Array], layout: Layout) -> Array:
        """`join_views` without its cost at start-up: one ``concatenate`` of
        thousands of arrays is an XLA compilation of seconds, while writing each piece
        into a zeros buffer reuses one small executable per distinct piece shape."""
        dtype = jnp.asarray(arrays[0]).dtype
        rows, length = layout.rows, sum(layout.sizes) // layout.rows
        buffer = jnp.zeros((length,) if rows == 1 else (rows, length), dtype)
        if self.sharding is not None:
            buffer = jax.device_put(buffer, self.sharding)
        for array, offset in zip(arrays, _offsets(layout)):
            buffer = _write(buffer, jnp.asarray(array), offset)
        return buffer

    def like_state(self, arrays: Sequence[Array]) -> Array:
        """Per-parameter state arrays as one state buffer of this store (`like`,
        sharded and padded when the state is sharded; per block where a rule over
        blocks keeps a field so)."""
        if self.flat and self.layout.align > 1 and jnp.size(arrays[0]) != self.sizes[0]:
            layout = self._layout_per(self.sizes[0], int(jnp.size(arrays[0])))
            return self._assembled(arrays, layout)
        if self.state_sharding is None:
            return self.like(arrays)
        dtype = arrays[0].dtype
        joined = join_views([jnp.asarray(a).astype(dtype) for a in arrays], self.layout)
        return _padded(self.state_length, dtype, self.state_sharding)(joined)

    def state_template(self) -> Array:
        """What a new state buffer is made like (every rule's ``init`` is elementwise and
        reads only shapes): the values, or zeros laid out as sharded state is."""
        if self.state_sharding is None:
            return self.values
        return _padded(self.state_length, self.value_dtype, self.state_sharding)(None)

    # ------------------------------------------------ the Storage protocol
    def value(self, index: int) -> Array:
        return self.read(index)

    def set_value(self, index: int, value: Array) -> None:
        self.write(index, value)

    def grad(self, index: int) -> Array | None:
        return self.read_grad(index)

    def set_grad(self, index: int, grad: Any) -> None:
        self.write_grad(index, grad)

    def grad_present(self, index: int) -> bool:
        return bool(self.has_grad[index])

    def shape(self, index: int) -> tuple[int, ...]:
        return self.shapes[index]

    def dtype(self, index: int) -> np.dtype:
        return self.value_dtype

    @property
    def buffer(self) -> Array:
        return self.values

    def grad_buffer(self, indices: Sequence[int]) -> Array | None:
        if self.grads is None or set(indices) != set(np.flatnonzero(self.has_grad).tolist()):
            return None
        return self.grads

    def set_grad_buffer(self, buffer: Array) -> None:
        if self.flat and not self.has_grad.all():
            # the invariant: a parameter without a gradient has a zero slice, also after
            # a whole-buffer operation (a clip by a NaN total norm scales zeros to NaN)
            absent = np.flatnonzero(~self.has_grad)
            spans = tuple((int(self.offsets[i]), self.columns[i]) for i in absent)
            buffer = _zeroed(buffer, spans)
        self.grads = buffer
        self._grad_cache.clear()

    def add_grads(self, grads: Array, present: np.ndarray) -> None:
        self.accumulate(grads, present)

    def traced(self, index: int) -> tuple[FlatStore, int]:
        return self, index

    def sparse_indices(self, indices: Sequence[int]) -> list[int]:
        return [i for i in indices if i in self.sparse]

    def clear_grads(self, indices: Sequence[int], set_to_none: bool) -> None:
        if len(indices) == len(self._params):
            return self._clear_all(set_to_none)
        for index in indices:
            if set_to_none:
                self.write_grad(index, None)
            elif self.has_grad[index]:
                self.write_grad(index, jnp.zeros(self.shapes[index], self.value_dtype))
        return None

    # ------------------------------------------------------------- values
    def read(self, index: int) -> Array:
        if not self.flat:
            return self.values
        if index not in self._value_cache:
            self._value_cache[index] = self._read(self.values, index)
        return self._value_cache[index]

    def _read(self, buffer: Array, index: int) -> Array:
        rows = self.layout.rows
        return _read(buffer, self.offsets[index], self.columns[index], rows, self.shapes[index])

    def write(self, index: int, value: Array) -> None:
        if tuple(value.shape) != self.shapes[index] or value.dtype != self.value_dtype:
            handler = None if self.on_restructure is None else self.on_restructure()
            if handler is not None:
                return handler(self, index, value)
            # no optimizer holds the store any more: the parameter takes the new value as
            # its own array (its gradient, of the old shape, is dropped, as a compiled
            # optimizer's relayout drops it)
            self.param(index).relocate(OwnArrays(value, None))
            return None
        if self.flat:
            self.values = _write(self.values, value, self.offsets[index])
            self._value_cache.clear()
        else:
            self.values = value
        return None

    def replace_values(self, values: Array) -> None:
        """After a compiled step: the new buffer (the old one was donated)."""
        self.values = values
        self._value_cache.clear()

    # ---------------------------------------------------------- gradients
    def read_grad(self, index: int) -> Array | None:
        if not self.has_grad[index]:
            return None
        if index in self.sparse:
            return self.sparse[index]
        if not self.flat:
            return self.grads
        if index not in self._grad_cache:
            self._grad_cache[index] = self._read(self.grads, index)
        return self._grad_cache[index]

    def write_grad(self, index: int, grad: Array | None) -> None:
        self._grad_cache.clear()
        self.sparse.pop(index, None)
        if grad is None:
            self.has_grad[index] = False
            if not self.has_grad.any():
                self.grads = None
            elif self.flat:
                zeros = jnp.zeros(self.shapes[index], self.value_dtype)
                self.grads = _write(self.grads, zeros, self.offsets[index])
            return
        sparse = grad if hasattr(grad, "todense") else None
        grad = jnp.asarray(dense(grad))
        check_grad(grad, self.shapes[index], self.value_dtype)
        if sparse is not None:
            self.sparse[index] = sparse
        if not self.flat:
            self.grads = grad
        else:
            if self.grads is None:
                self.grads = jnp.zeros_like(self.values)
            self.grads = _write(self.grads, grad, self.offsets[index])
        self.has_grad[index] = True

    def accumulate(self, grads: Array, present: np.ndarray) -> None:
        """Add a full-buffer gradient (zero outside ``present``) into the stored one."""
        self.grads = accumulated(self.grads, grads)
        self.has_grad |= present
        self._grad_cache.clear()
        for index in np.flatnonzero(present) if self.sparse else ():
            self.sparse.pop(int(index), None)

    def _clear_all(self, set_to_none: bool) -> None:
        self._grad_cache.clear()
        self.sparse.clear()
        if set_to_none:
            self.grads = None
            self.has_grad[:] = False
        elif self.grads is not None:
            self.grads = jnp.zeros_like(self.grads)


class Borrowed:
    """A parameter that lives in another optimizer's store, seen as a one-parameter
    bucket store: each step reads its current value and writes the new one back
    through the Parameter, so every optimizer holding it sees every update."""

    flat = False
    state_sharding = None

    def __init__(self, param: Any) -> None:
        self.params = [param]
        self.value_dtype = param.dtype
        self.wide = compute_dtype(self.value_dtype) == np.float64
        shape = tuple(param.shape)
        self.layout = Layout(False, 1, (int(np.prod(shape)),), (shape,))

    def param(self, index: int) -> Any:
        return self.params[index]

    @property
    def values(self) -> Array:
        return jnp.array(self.params[0].data, copy=True)  # the step donates it

    @property
    def grads(self) -> Any:
        grad = self.params[0].grad
        return None if grad is None else jnp.asarray(dense(grad))

    @property
    def has_grad(self) -> np.ndarray:
        return np.array([self.params[0].grad is not None])

    def replace_values(self, values: Array) -> None:
        self.params[0].data = values

    def views(self, buffer: Array) -> list[Array]:
        return [jnp.array(buffer, copy=True)]

    def like(self, arrays: Sequence[Array]) -> Array:
        return jnp.array(arrays[0], copy=True)

    like_state = like

    def state_template(self) -> Array:
        return self.values
