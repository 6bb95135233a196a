"""A block-wise step run over chunks of blocks, in a loop: the CPU's program for a large
low-bit state.

A block-wise step (each block's new parameter, codes and scale depend on that block
alone) gives the same numbers on each chunk of consecutive blocks as on the whole
arrays. On the CPU this is what makes it fast: XLA computes the step of one chunk in a
few kernels whose intermediate arrays (the float32 states, their magnitudes) stay in the
cache and are never allocated at full size, where the whole-array program stores (and
page-faults) each of them at full size or recomputes the rule in every kernel that
reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

CHUNK_ELEMENTS = 16384
"""Elements per iteration on the CPU (64 blocks of 256): each float32 array of a chunk,
64 KB, stays in the L2 cache. Measured on one 4096 x 1024 tensor (2-core CPU): 8k to 32k
elements give the same step time."""


def chunk_blocks(block_size: int) -> int:
    """Blocks of ``block_size`` elements in one chunk of `CHUNK_ELEMENTS` (at least one).

    Examples:
      >>> chunk_blocks(256), chunk_blocks(128), chunk_blocks(100000)
      (64, 128, 1)
    """
    return max(1, CHUNK_ELEMENTS // block_size)


def chunkable(size: int, block_size: int) -> bool:
    """Whether a CPU step runs a state of ``size`` elements by `in_chunks`: whole blocks
    (a partial last block keeps the whole-array program), at least one whole chunk of
    them (a smaller state gains nothing), in a process of one device (a state sharded
    over several would be gathered for the loop's slices and come back placed
    differently: it keeps the whole-array program too)."""
    return (
        size % block_size == 0
        and size // block_size >= chunk_blocks(block_size)
        and jax.device_count() == 1
    )


def in_chunks(
    step: Callable[..., tuple],
    param: Array,
    grad: Array,
    *state: Array | None,
    block_size: int,
    lead: Sequence[int] | None = None,
    chunk: int | None = None,
) -> tuple:
    """``step(param, grad, *state) -> (param, *state)``, a block-wise step, run over
    consecutive chunks of ``chunk`` blocks in a loop: the same numbers as one call on the
    whole arrays.

    Every array is viewed by blocks: an array of one entry per block (a scale) as
    ``(*lead, blocks)``, any other (the parameter, the gradient, codes) as ``(*lead,
    blocks, entries of a block)``, ``lead`` its leading axes (AdEMAMix's two stacked
    moments: one). ``step`` gets each array's chunk so viewed (``None`` for an absent
    state) and returns the new ones, any shape of the same size; they are written back in
    place, and the arrays come back in their own shapes. A float8 array travels through
    the loop as its ``uint8`` bits (XLA:CPU would upcast the whole float8 buffer to
    float16 at every update of a slice of it).

    Args:
      step: the block-wise step; ``None`` in, ``None`` out.
      param: the parameter (its dtype becomes the one ``step`` returns).
      grad: the gradient, only read.
      *state: the stored state (codes, scales), each array or ``None``.
      block_size: elements of the parameter per block.
      lead: the number of leading axes of each array of ``state`` (default none).
      chunk: blocks per iteration (default `chunk_blocks`).

    Returns:
      ``(param, *state)`` after the step.

    Examples:
      >>> import jax.numpy as jnp
      >>> def step(p, g, total):  # the parameter minus g, and each block's sum
      ...     new = p - g
      ...     return new, new.sum(axis=-1)
      >>> p, total = in_chunks(step, jnp.arange(8.0), jnp.ones(8), jnp.zeros(4),
      ...                      block_size=2, chunk=3)
      >>> p.tolist(), total.tolist()
      ([-1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [-1.0, 3.0, 7.0, 11.0])
    """
    blocks = param.size // block_size
    lead = tuple(lead) if lead is not None else (0,) * len(state)
    present = [i for i, s in enumerate(state) if s is not None]

    def view(a: Array, axes: int) -> Array:
        outer = a.shape[:axes]
        if a.size == blocks * math.prod(outer):  # one entry per block
            return a.reshape(*outer, blocks)
        return a.reshape(*outer, blocks, -1)

    carry = (view(param, 0), *(view(state[i], lead[i]) for i in present))

    def body(p: Array, *rest: Array) -> tuple:
        *arrays, g = rest
        full: list[Array | None] = [None] * len(state)
        for i, a in zip(present, arrays):
            full[i] = a
        new = step(p, g, *full)
        return (new[0].reshape(p.shape), *(new[1 + i].reshape(full[i].shape) for i in present))

    axes = ((0, *(lead[i] for i in present)), (0,))
    new = _loop(body, carry, (view(grad, 0),), axes, blocks, chunk or chunk_blocks(block_size))
    out: list[Array | None] = [new[0].reshape(param.shape), *state]
    for i, a in zip(present, new[1:]):
        out[1 + i] = a.reshape(state[i].shape)
    return tuple(out)


def _loop(
    body: Callable[..., tuple],
    carry: tuple,
    read: tuple,
    axes: tuple[tuple[int, ...], tuple[int, ...]],
    blocks: int,
    chunk: int,
) -> tuple:
    """``body(*carry_chunk, *read_chunk)`` over consecutive chunks of ``chunk`` blocks
    (a slice along each array's block axis, ``axes[0]`` for ``carry``, ``axes[1]`` for
    ``read``), its results written back into ``carry``: a `fori_loop` over the whole
    chunks, then the remainder."""

    # each carried array takes the dtype `body` gives it (the state may arrive upcast);
    # float8 codes travel as their uint8 bits
    def spec(arrays: tuple, arrays_axes: tuple[int, ...]) -> list:
        return [
            jax.ShapeDtypeStruct((*a.shape[:axis], chunk, *a.shape[axis + 1 :]), a.dtype)
            for a, axis in zip(arrays, arrays_axes)
        ]

    out = jax.eval_shape(body, *spec(carry, axes[0]), *spec(read, axes[1]))
    dtypes = [o.dtype for o in out]
    bits = [jnp.issubdtype(d, jnp.floating) and jnp.dtype(d).itemsize == 1 for d in dtypes]

    def to_carry(a: Array, dtype: Any, as_bits: bool) -> Array:
        a = a.astype(dtype)
        return jax.lax.bitcast_convert_type(a, jnp.uint8) if as_bits else a

    def from_carry(a: Array, dtype: Any, as_bits: bool) -> Array:
        return jax.lax.bitcast_convert_type(a, dtype) if as_bits else a

    def piece(start: Any, size: int, carry: tuple) -> tuple:
        def cut(arrays: tuple, arrays_axes: tuple[int, ...]) -> list:
            return [
                jax.lax.dynamic_slice_in_dim(a, start, size, axis)
                for a, axis in zip(arrays, arrays_axes)
            ]

        chunks = [from_carry(a, d, b) for a, d, b in zip(cut(carry, axes[0]), dtypes, bits)]
        new = body(*chunks, *cut(read, axes[1]))
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(a, to_carry(n, d, b), start, axis)
            for a, n, d, b, axis in zip(carry, new, dtypes, bits, axes[0])
        )

    carry = tuple(to_carry(a, d, b) for a, d, b in zip(carry, dtypes, bits))
    full, rest = divmod(blocks, chunk)
    if full:
        carry = jax.lax.fori_loop(0, full, lambda i, c: piece(i * chunk, chunk, c), carry)
    if rest:
        carry = piece(full * chunk, rest, carry)
    return tuple(from_carry(a, d, b) for a, d, b in zip(carry, dtypes, bits))
