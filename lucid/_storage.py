"""Where a `Parameter`'s value and gradient live.

A Parameter is an identity; its value and gradient live in exactly one
*storage* at a time, at an index. The default, `OwnArrays`, is one
parameter's own pair of arrays. A compiled optimizer moves the parameters it
steps into flat buffers (`lucid.optim._store.FlatStore`) that implement
the same small protocol, so ``p.data`` and ``p.grad`` keep working, and so do
other optimizers holding the same Parameter: each reads and writes the one
place the value lives.

The protocol has two halves. *Access*: ``value``, ``set_value``, ``grad``,
``set_grad``, ``grad_present`` (without reading the gradient), ``shape``,
``dtype``, ``clear_grads``, and ``grad_buffer`` / ``set_grad_buffer`` for
whole-storage gradient work (clipping) in one call. *Tracing* (a `Traceable`),
used by `lucid.backward` and fused steps to differentiate through stored
parameters without copying them out: ``buffer`` (the array holding every value
of the storage), ``layout`` (a `BufferLayout`: how the buffer holds them,
hashable, able to cut it into per-parameter arrays and put them back) and
``add_grads`` (accumulate a gradient with respect to the whole buffer). A
storage says what is traced for each of its parameters (``traced``): itself, or
the parameter alone where its buffer is not traced whole (the eager step's
pieces, `lucid.optim._engine.pieces.PieceStore`: a loss program over them would
be a second program of the model, for the layout the step chose after the first
backward). A storage's layout is its own business: this module knows only the
protocol.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

from ._arrays import is_sparse
from ._platform import CUT_AT_RUN_TIME

Array = jax.Array


@runtime_checkable
class BufferLayout(Protocol):
    """How a storage's buffer holds its parameters' values.

    Hashable (a trace over a storage depends on it); ``split`` and ``join`` are
    traceable and inverse to each other."""

    @property
    def param_count(self) -> int:
        """How many parameters the buffer holds."""

    def split(self, buffer: Array) -> list[Array]:
        """The buffer as its parameters' arrays, in index order."""

    def join(self, arrays: Sequence[Array]) -> Array:
        """Per-parameter arrays as one buffer (the inverse of ``split``)."""

    @property
    def offsets(self) -> tuple[int, ...] | None:
        """Where each parameter begins in the buffer, for `split_at` (``None``: the buffer
        is not cut at offsets given at run time)."""

    def split_at(self, buffer: Array, offsets: Sequence[Array]) -> list[Array]:
        """``split``, each parameter cut at its start given at run time (traced int32
        scalars, one per parameter: ``offsets`` as values). XLA compiles a cut at a constant
        offset as a kernel of its own, one per parameter (on XLA:CPU about 30 ms each);
        cuts at run-time offsets share one kernel per distinct size and shape."""


def run_time_offsets(layout: BufferLayout | None, buffer: Any) -> tuple[Array, ...] | None:
    """The offsets a program cuts ``buffer`` at (`BufferLayout.split_at`): its layout's
    offsets as arrays on its device, made once per layout and device; ``None`` where its
    views are cut at constant offsets (``layout`` ``None`` or without offsets, a buffer on
    several devices, or a jax before `lucid._platform.CUT_AT_RUN_TIME`).

    A cut at a constant offset is a kernel of its own to XLA (on XLA:CPU about 30 ms to
    compile each: clipping a 100-tensor model's flat gradient compiled in 3.5 s, against
    0.8 s for separate arrays); cuts at run-time offsets share one kernel per distinct size
    and shape, and each offset is one more input of the call (about half a microsecond).

    Examples:
      >>> run_time_offsets(None, None) is None
      True
    """
    if layout is None or not CUT_AT_RUN_TIME or not isinstance(buffer, jax.Array):
        return None
    devices = buffer.sharding.device_set
    if len(devices) != 1:
        return None
    # committed as the buffer is: a committed input commits a program's outputs, and the
    # next call with those would compile again
    device = next(iter(devices)) if getattr(buffer, "committed", True) else None
    return _offset_arrays(layout, device)


def cut_views(buffer: Any, layout: BufferLayout, offsets: Sequence[Array] | None) -> list[Any]:
    """``buffer`` as its parameters' views (traceable): ``layout.split_at`` at the run-time
    ``offsets`` (`run_time_offsets`), or ``layout.split`` where they are ``None``; the same
    views either way."""
    return layout.split(buffer) if offsets is None else layout.split_at(buffer, offsets)


@functools.lru_cache(maxsize=64)
def _offset_arrays(layout: BufferLayout, device: Any) -> tuple[Array, ...] | None:
    """``layout.offsets`` as int32 arrays committed to ``device`` (where the buffer is: no
    copy per call; ``None``: uncommitted, on the default device), or ``None`` for a layout
    without them."""
    offsets = layout.offsets
    return None if offsets is None else tuple(jax.device_put(np.int32(o), device) for o in offsets)


class Whole(NamedTuple):
    """The layout of a buffer that is one parameter's own array, as it is."""

    shape: tuple[int, ...]

    @property
    def param_count(self) -> int:
        return 1

    def split(self, buffer: Array) -> list[Array]:
        return [buffer]

    def join(self, arrays: Sequence[Array]) -> Array:
        return arrays[0]

    @property
    def offsets(self) -> None:
        return None

    def split_at(self, buffer: Array, offsets: Sequence[Array]) -> list[Array]:
        return [buffer]


@runtime_checkable
class Traceable(Protocol):
    """What `lucid.backward` differentiates through: a buffer holding parameters' values,
    its layout, and where the gradient with respect to the buffer goes."""

    layout: BufferLayout

    @property
    def buffer(self) -> Array: ...

    def add_grads(self, grads: Array, present: np.ndarray) -> None:
        """Accumulate ``grads`` (laid out as ``buffer``) into the gradients of the
        parameters where ``present`` (one bool per parameter) is true."""


@runtime_checkable
class Storage(Protocol):
    """The place one or more Parameters' values and gradients live (see module docstring)."""

    layout: BufferLayout

    def value(self, index: int) -> Array: ...
    def set_value(self, index: int, value: Array) -> None: ...
    def grad(self, index: int) -> Array | None: ...
    def grad_present(self, index: int) -> bool: ...
    def set_grad(self, index: int, grad: Array | None) -> None: ...
    def shape(self, index: int) -> tuple[int, ...]: ...
    def dtype(self, index: int) -> np.dtype: ...
    def clear_grads(self, indices: Sequence[int], set_to_none: bool) -> None: ...
    def grad_buffer(self, indices: Sequence[int]) -> Array | None:
        """The buffer of every gradient (zero where a parameter has none) when the
        parameters at ``indices`` are exactly those with a gradient; else None."""

    def set_grad_buffer(self, buffer: Array) -> None:
        """Replace the gradient buffer `grad_buffer` returned (same layout)."""

    def sparse_indices(self, indices: Sequence[int]) -> list[int]:
        """Those of ``indices`` whose gradient was assigned sparse (read without
        cutting a dense buffer)."""

    @property
    def buffer(self) -> Array: ...

    def traced(self, index: int) -> tuple[Traceable, int]:
        """What `lucid.backward` traces for the parameter at ``index``, and its index
        there: ``(self, index)``, or a `Traceable` of that parameter alone."""


def check_grad(grad: Any, shape: tuple[int, ...], dtype: Any) -> None:
    """Raise torch's kind of error for a gradient that cannot belong to a parameter."""
    if tuple(grad.shape) != tuple(shape):
        raise ValueError(
            f"a gradient of shape {tuple(grad.shape)} was given for a parameter of shape "
            f"{tuple(shape)}"
        )
    if grad.dtype != dtype:
        raise ValueError(
            f"a gradient of dtype {grad.dtype} was given for a parameter of dtype {dtype}"
        )


def accumulated(old: Any, grad: Any) -> Any:
    """A gradient added to the one a parameter had, as torch's ``backward`` adds it: the
    first as it is, a later one summed."""
    return grad if old is None else old + grad


class OwnArrays:
    """One parameter's own value and gradient: the storage every Parameter starts in."""

    __slots__ = ("_grad", "_value")

    def __init__(self, value: Array, grad: Any = None) -> None:
        self._value = value
        self._grad = grad

    @property
    def layout(self) -> Whole:
        return Whole(tuple(self._value.shape))

    def value(self, index: int) -> Array:
        return self._value

    def set_value(self, index: int, value: Array) -> None:
        self._value = value

    def grad(self, index: int) -> Any:
        return self._grad

    def grad_present(self, index: int) -> bool:
        return self._grad is not None

    def set_grad(self, index: int, grad: Any) -> None:
        self._grad = grad

    def shape(self, index: int) -> tuple[int, ...]:
        return tuple(self._value.shape)

    def dtype(self, index: int) -> np.dtype:
        return self._value.dtype

    def clear_grads(self, indices: Sequence[int], set_to_none: bool) -> None:
        if set_to_none or self._grad is None:
            self._grad = None
        else:
            self._grad = jax.numpy.zeros_like(self._grad)

    def grad_buffer(self, indices: Sequence[int]) -> Array | None:
        return self._grad if self._grad is not None and list(indices) == [0] else None

    def set_grad_buffer(self, buffer: Array) -> None:
        self._grad = buffer

    def sparse_indices(self, indices: Sequence[int]) -> list[int]:
        return [i for i in indices if is_sparse(self._grad)]

    @property
    def buffer(self) -> Array:
        return self._value

    def add_grads(self, grads: Array, present: np.ndarray) -> None:
        self._grad = accumulated(self._grad, grads)

    def traced(self, index: int) -> tuple[OwnArrays, int]:
        return self, index


def by_storage(locations: Iterable[tuple[Storage, int]]) -> list[tuple[Storage, list[int]]]:
    """Group ``(storage, index)`` pairs by storage, in order of first appearance."""
    groups: dict[int, tuple[Storage, list[int]]] = {}
    for storage, index in locations:
        groups.setdefault(id(storage), (storage, []))[1].append(index)
    return list(groups.values())
