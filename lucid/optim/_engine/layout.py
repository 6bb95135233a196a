"""How the compiled backend's flat buffers hold their parameters.

`Layout` implements `lucid._storage.BufferLayout`: `lucid.backward` cuts a
store's buffer into views through it without knowing what it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class Layout(NamedTuple):
    """How a store's buffers hold its parameters (hashable: traces depend on it).

    ``flat``: concatenated (else one parameter as it is). ``rows``: the
    leading blocks of a parameter sharded along its first axis; each buffer is
    then ``(rows, columns)``, row ``r`` holding every parameter's ``r``-th block,
    so each device keeps exactly its own shards. 1 for everything else.
    ``align``: every size is a multiple of it (a rule over blocks of ``align``
    elements, `lucid.functional.rule.Execution.blocks`: each parameter's blocks
    are whole, and a state field of one entry per ``k`` elements, such as a
    per-block scale or two 4-bit codes a byte, lies in a buffer of its own
    layout, `per`).
    """

    flat: bool
    rows: int
    sizes: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    align: int = 1

    def per(self, k: int) -> Layout:
        """The layout of a state field of one entry per ``k`` elements (a per-block
        scale: ``k = align``): each parameter's ``size // k`` entries, end to end.

        Raises:
          ValueError: a parameter's size is not a multiple of ``k``.
        """
        if any(size % k for size in self.sizes):
            raise ValueError(f"a state of one entry per {k} elements of sizes {self.sizes}")
        counts = tuple(size // k for size in self.sizes)
        return Layout(self.flat, 1, counts, tuple((n,) for n in counts))

    @property
    def param_count(self) -> int:
        """How many parameters the buffer holds."""
        return len(self.sizes)

    def split(self, buffer: Array) -> list[Array]:
        """`views_of` this layout."""
        return views_of(buffer, self)

    def join(self, arrays: Sequence[Array]) -> Array:
        """`join_views` of this layout."""
        return join_views(arrays, self)

    @property
    def column_offsets(self) -> tuple[int, ...]:
        """The column where each parameter begins (in a 1-D buffer, its offset)."""
        columns = np.cumsum((0, *(size // self.rows for size in self.sizes)))
        return tuple(int(c) for c in columns[:-1])

    @property
    def offsets(self) -> tuple[int, ...] | None:
        """Each parameter's offset in a 1-D flat buffer, for `split_at`; ``None`` for a
        buffer of one parameter, of rows (parameters sharded along their first axis), or
        longer than int32 offsets reach."""
        if not self.flat or self.rows != 1 or sum(self.sizes) >= 2**31:
            return None
        return self.column_offsets

    def split_at(self, buffer: Array, offsets: Sequence[Array]) -> list[Array]:
        """`split` of a 1-D flat buffer, each parameter cut at its offset given at run time
        (``offsets``: traced int32 scalars, the values of `offsets`), so that XLA compiles one
        cut per distinct size and shape rather than one per parameter (the same values)."""
        return [
            jax.lax.dynamic_slice(buffer, (start,), (size,)).reshape(shape)
            for start, size, shape in zip(offsets, self.sizes, self.shapes)
        ]


def views_of(buffer: Array, layout: Layout) -> list[Array]:
    """A buffer as its parameters' arrays (traceable)."""
    if not layout.flat:
        return [buffer]
    out, offset = [], 0
    for size, shape in zip(layout.sizes, layout.shapes):
        columns = size // layout.rows
        piece = (
            buffer[offset : offset + columns]
            if layout.rows == 1
            else buffer[:, offset : offset + columns]
        )
        out.append(piece.reshape(shape))
        offset += columns
    return out


def join_views(arrays: Sequence[Array], layout: Layout) -> Array:
    """Per-parameter arrays laid out as ``layout`` says (the inverse of `views_of`)."""
    if not layout.flat:
        return arrays[0]
    if layout.rows == 1:
        return jnp.concatenate([jnp.ravel(a) for a in arrays])
    return jnp.concatenate([jnp.reshape(a, (layout.rows, -1)) for a in arrays], axis=1)
