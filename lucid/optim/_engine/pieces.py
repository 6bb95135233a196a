"""Small parameters laid end to end for the eager step on the CPU.

`FlatLayout` says how one flat call of the eager step (`lucid.optim._engine.eager`)
lays its members end to end: a field (values, gradients, a state field) is one
flat buffer per *piece*, a piece holding consecutive members.

`PieceStore` is where those members' values live between steps: the pieces the
step returned, as they are. Returning one array per piece instead of one per
parameter is most of what the eager step saves on the host (every array a call
returns costs about 1.5 us to make and as much again to free), and the next step
takes the pieces back as they are. A `PieceStore` is a `lucid._storage.Storage`,
so ``p.data`` keeps working: the first read after a step cuts every member's value
in one call (one array per member, as the step used to return them), and a write
replaces the member's value until the next step joins the pieces again (one call).
Gradients stay per parameter, as `lucid._storage.OwnArrays` keeps them: a loop
assigns them one by one. `lucid.backward` traces each member alone (`Member`), as
it traced the member's own array before the first step: a loss program over the
pieces would be a second program of the whole model, compiled at the second
iteration of every eager loop (5 s of the 27M GPT's on the CPU).

A store belongs to the eager backend that made it (weakly: the store is kept by
its parameters). That backend gives every member its own arrays again
(`release`) before it plans a step anew and before another backend takes over;
a store whose backend is gone is where its members' values still live, and the
next optimizer to step them takes them over.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._arrays import is_sparse
from ..._parameter import Parameter
from ..._storage import OwnArrays, Whole, accumulated
from .flat_store import FlatStore
from .layout import Layout, join_views, views_of
from .programs import PROGRAMS_KEPT


class FlatLayout(NamedTuple):
    """How one call of an elementwise rule lays its parameters end to end: their
    shapes, in order, which state fields hold one 0-d value for all of them (the
    rule's ``scalar_state``; every other field is laid out as the values), and where
    the pieces start: a flat field is one buffer per piece (``starts``: each piece's
    first member), so that no buffer of a call of small parameters exceeds `Policy.piece_bytes`
    bytes. Hashable (a program's key); ``join_field`` and ``split_field`` (and the
    states' ``join_states`` and ``split_states``) are traceable and inverse to each
    other. It is also the `lucid._storage.BufferLayout` of a `PieceStore`, whose
    buffer is the tuple of its value pieces (``split`` and ``join``: `split_values`
    and `join_values`)."""

    shapes: tuple[tuple[int, ...], ...]
    scalar: tuple[bool, ...]  # per state field
    starts: tuple[int, ...] = (0,)  # per piece, its first member

    @property
    def pieces(self) -> list[tuple[int, int, Layout]]:
        """Per piece: its first member, the member after its last, and its buffer's
        layout (the compiled backend's 1-D flat `Layout`)."""
        ends = (*self.starts[1:], len(self.shapes))
        return [
            (a, b, Layout(True, 1, tuple(math.prod(s) for s in self.shapes[a:b]), self.shapes[a:b]))
            for a, b in zip(self.starts, ends)
        ]

    @property
    def param_count(self) -> int:
        """How many parameters the layout holds."""
        return len(self.shapes)

    def split(self, buffer: Sequence[Any]) -> list[Any]:
        """`split_values` (the `BufferLayout` protocol)."""
        return self.split_values(buffer)

    def join(self, arrays: Sequence[Any]) -> tuple[Any, ...]:
        """`join_values` (the `BufferLayout` protocol)."""
        return self.join_values(arrays)

    @property
    def offsets(self) -> None:
        """``None``: the pieces are cut where they are (the `BufferLayout` protocol)."""
        return None

    def split_at(self, buffer: Sequence[Any], offsets: Sequence[Any]) -> list[Any]:
        """`split_values` (the `BufferLayout` protocol; no run-time offsets)."""
        return self.split_values(buffer)

    def join_values(self, arrays: Sequence[Any]) -> tuple[Any, ...]:
        """Per-parameter values as a `PieceStore` holds them: `join_field`, except that
        a piece of one member is that member's array in its own shape. The step reads
        such a piece as the old per-member input was read (its flat form a reshape of
        the member's shape), which is what keeps its numbers those of the member's own
        program bit for bit: XLA:CPU contracts a multiply-add differently when one
        operand of an elementwise fusion is 1-D and another a reshaped N-D array."""
        return tuple(
            held_piece(join_views(arrays[a:b], layout), layout) for a, b, layout in self.pieces
        )

    def split_values(self, pieces: Sequence[Any]) -> list[Any]:
        """The inverse of `join_values`."""
        out: list[Any] = []
        for piece, (_, _, layout) in zip(pieces, self.pieces):
            out.extend(views_of(flat_piece(piece, layout), layout))
        return out

    def join_field(self, arrays: Sequence[Any]) -> tuple[Any, ...]:
        """Per-parameter arrays (of ``shapes``) as one flat buffer per piece."""
        return tuple(join_views(arrays[a:b], layout) for a, b, layout in self.pieces)

    def split_field(self, buffers: Sequence[Any]) -> list[Any]:
        """The pieces' flat buffers as per-parameter arrays (the inverse of
        ``join_field``)."""
        out: list[Any] = []
        for buffer, (_, _, layout) in zip(buffers, self.pieces):
            out.extend(views_of(buffer, layout))
        return out

    def join_states(self, states: Sequence[Any]) -> Any:
        """The members' states as one state of the flat buffers (a 0-d field: the
        first member's, which every member has)."""
        fields = []
        for k, scalar in enumerate(self.scalar):
            first = states[0][k]
            if first is None or scalar:
                fields.append(first)
            else:
                fields.append(self.join_field([s[k] for s in states]))
        return type(states[0])(*fields)

    def split_states(self, state: Any) -> list[Any]:
        """The flat buffers' state as the members' states (the inverse of
        ``join_states``)."""
        cut = [
            None if value is None or scalar else self.split_field(value)
            for value, scalar in zip(state, self.scalar)
        ]
        return [
            type(state)(*(v if c is None else c[i] for v, c in zip(state, cut)))
            for i in range(len(self.shapes))
        ]


def held_piece(flat: Any, layout: Layout) -> Any:
    """A piece's flat buffer (of the piece's ``layout``) as a `PieceStore` holds it:
    as it is, or, for a piece of one member, in that member's shape (`join_values`)."""
    return flat.reshape(layout.shapes[0]) if layout.param_count == 1 else flat


def flat_piece(held: Any, layout: Layout) -> Any:
    """A value piece as a `PieceStore` holds it, as a flat buffer (inverse of
    `held_piece`)."""
    return held.reshape(-1) if layout.param_count == 1 else held


def free(storage: Any) -> bool:
    """Whether a parameter's storage belongs to no live optimizer: the parameter's own
    arrays, or a store (an eager step's `PieceStore`, a compiled step's `FlatStore`)
    whose optimizer is gone. The next optimizer to step the parameter takes it over;
    one in a live optimizer's store is read and written through it."""
    return isinstance(storage, OwnArrays) or (
        isinstance(storage, PieceStore | FlatStore) and not storage.owned
    )


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def _cutter(layout: FlatLayout) -> Any:
    """Value pieces as their members' arrays, in one call, each an array of its own
    (a piece is donated to the next step, and XLA would hand a piece of one member
    back as it is)."""
    return jax.jit(lambda pieces: [jnp.copy(x) for x in layout.split_values(pieces)])


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def joiner(layout: FlatLayout) -> Any:
    """Members' values as a store's pieces, in one call, into new buffers (a step
    donates them, so never an array a caller holds)."""
    return jax.jit(lambda arrays: tuple(jnp.copy(x) for x in layout.join_values(arrays)))


class PieceStore:
    """The values of one flat call's members in the pieces the eager step returned,
    and their gradients per parameter (see the module docstring).

    Args:
      params: the members, in layout order (each then `relocate`d here by the caller).
      layout: the members' `FlatLayout`.
      pieces: their values, one flat buffer per piece (the store's own: donated to the
        next step).
      grads: their gradients (``None`` where one has none).
      owner: the backend that steps them (held weakly).
    """

    def __init__(
        self,
        params: Sequence[Parameter],
        layout: FlatLayout,
        pieces: tuple[jax.Array, ...],
        grads: Sequence[Any],
        owner: Any,
    ) -> None:
        # weakly: each parameter keeps its store, the store must not keep them
        self._params = [weakref.ref(p) for p in params]
        self.layout = layout
        self._dtype = np.dtype(pieces[0].dtype)
        self._pieces: tuple[jax.Array, ...] | None = pieces
        self._values: list[jax.Array] | None = None  # the members' values, once cut
        self._grads = list(grads)
        self._owner: weakref.ref | None = weakref.ref(owner)
        self._members: list[Member] | None = None  # what `lucid.backward` traces

    @property
    def owned(self) -> bool:
        """Whether a live backend steps this store's members (else the next optimizer
        to step them takes them over)."""
        return self._owner is not None and self._owner() is not None

    # ------------------------------------------------------------ the step's side
    @property
    def pieces(self) -> tuple[jax.Array, ...]:
        """The values as the step takes them: one flat buffer per piece (joined again,
        in one call, after a value was written)."""
        if self._pieces is None:
            assert self._values is not None
            self._pieces = joiner(self.layout)(self._values)
        return self._pieces

    def commit(self, pieces: tuple[jax.Array, ...]) -> None:
        """After a step: its new pieces (the old ones may have been donated)."""
        self._pieces = tuple(pieces)
        self._values = None

    def release(self) -> None:
        """Give every member still here arrays of its own (its current value and
        gradient); the store then belongs to nobody."""
        values = self._cut()
        for index, ref in enumerate(self._params):
            p = ref()
            if p is not None and p.location == (self, index):
                p.relocate(OwnArrays(values[index], self._grads[index]))
        self._owner = None

    def _cut(self) -> list[jax.Array]:
        if self._values is None:
            assert self._pieces is not None
            self._values = _cutter(self.layout)(self._pieces)
        return self._values

    # ------------------------------------------------ the Storage protocol
    def value(self, index: int) -> jax.Array:
        return self._cut()[index]

    def set_value(self, index: int, value: jax.Array) -> None:
        if tuple(value.shape) != self.layout.shapes[index] or value.dtype != self._dtype:
            # another shape or dtype does not fit the layout: the parameter takes it as
            # its own array (the backend's next step sees it gone and plans anew)
            p = self._params[index]()
            if p is not None:
                p.relocate(OwnArrays(value, self._grads[index]))
            self._grads[index] = None
            return
        self._cut()[index] = value  # the store's own list (reads return its items)
        self._pieces = None

    def grad(self, index: int) -> Any:
        return self._grads[index]

    def grad_present(self, index: int) -> bool:
        return self._grads[index] is not None

    def set_grad(self, index: int, grad: Any) -> None:
        self._grads[index] = grad

    def shape(self, index: int) -> tuple[int, ...]:
        return self.layout.shapes[index]

    def dtype(self, index: int) -> np.dtype:
        return self._dtype

    def clear_grads(self, indices: Sequence[int], set_to_none: bool) -> None:
        for index in indices:
            grad = self._grads[index]
            self._grads[index] = None if set_to_none or grad is None else jnp.zeros_like(grad)

    def grad_buffer(self, indices: Sequence[int]) -> jax.Array | None:
        """Always ``None``: the gradients are per parameter."""
        return None

    def set_grad_buffer(self, buffer: jax.Array) -> None:
        raise TypeError("a PieceStore keeps its gradients per parameter: it has no buffer")

    def sparse_indices(self, indices: Sequence[int]) -> list[int]:
        return [i for i in indices if is_sparse(self._grads[i])]

    @property
    def buffer(self) -> tuple[jax.Array, ...]:
        """The values as one pytree (`pieces`): where they live (placement checks)."""
        return self.pieces

    def traced(self, index: int) -> tuple[Member, int]:
        """The member alone (`Member`): `lucid.backward` traces it as its own array."""
        if self._members is None:
            self._members = [Member(self, i) for i in range(self.layout.param_count)]
        return self._members[index], 0

    def add_grad(self, index: int, grad: jax.Array) -> None:
        """Accumulate a member's gradient (`lucid.backward`'s, as torch's: the first
        one as it is, a later one added)."""
        self._grads[index] = accumulated(self._grads[index], grad)


class Member:
    """One member of a `PieceStore` as `lucid.backward` traces it: its value as a
    buffer of its own (`lucid._storage.Whole`), so the loss program is the one its own
    array was traced by (a `lucid._storage.Traceable`)."""

    __slots__ = ("_index", "_store", "layout")

    def __init__(self, store: PieceStore, index: int) -> None:
        self._store = store
        self._index = index
        # fixed: a value of another shape moves its parameter out of the store
        self.layout = Whole(store.layout.shapes[index])

    @property
    def buffer(self) -> jax.Array:
        return self._store.value(self._index)

    def add_grads(self, grads: jax.Array, present: np.ndarray) -> None:
        self._store.add_grad(self._index, grads)
