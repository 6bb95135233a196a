"""bitsandbytes' dynamic 8-bit data type and its block-wise quantization, in JAX.

bitsandbytes stores an 8-bit optimizer state as one `uint8` code per element and one
float32 scale per block of 256 elements (the block's largest magnitude, its *absmax*):

$$
\\hat x_i = q[c_i]\\,\\max_{j \\in B(i)} |x_j|
$$

where `q` is a 256-entry code map sorted in `[-1, 1]`: the *dynamic* map for values of
either sign (the first moment) and the *unsigned dynamic* map for non-negative values
(the second moment). The dynamic map spends its codes log-uniformly over 7 decades
(`1e-6 .. 1`), so small and large values keep about the same relative precision.

Quantizing follows bitsandbytes' CPU kernel (0.50): per block, `absmax = max |x|`
(NaN ignored) and `y = x * (1 / absmax)`; `y` is clamped to `[-1, 1]` and read through a
65536-entry table, `c = lut[trunc(((y + 1) / 2) * 65535 + 0.5)]`, whose entry `k` is
the nearest code to `-1 + 2k / 65535` (the number of midpoints between consecutive codes
below it). A block of zeros gets codes 0 and absmax 0; a NaN gets code 0. The table is
what makes the rounding "nearest, to 1/32768 of the block's absmax": a value within that
distance of a midpoint may go either way, exactly as bitsandbytes sends it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

BLOCK_SIZE = 256
"""Elements per quantization block (bitsandbytes' 8-bit optimizers use 256)."""

_LUT_SIZE = 65536

# The 256 float32 codes (big-endian hex) of bitsandbytes.functional.create_dynamic_map
# (signed=...) with its defaults
# (bitsandbytes builds them from ``torch.linspace`` in float32, whose last-bit rounding
# belongs to torch's vectorized kernel, so the bits are kept here; the tests compare
# them with bitsandbytes' own map).
_SIGNED = (
    "bf7e3333bf7a999abf770000bf736666bf6fcccdbf6c3333bf68999abf650000"
    "bf616666bf5dcccdbf5a3333bf56999abf530000bf4f6666bf4bcccdbf483333"
    "bf44999abf410000bf3d6666bf39cccdbf363334bf32999abf2f0000bf2b6666"
    "bf27cccdbf243334bf20999abf1d0000bf196666bf15cccdbf123334bf0e999a"
    "bf0b0000bf076666bf03ccccbf003333bef93332bef20000beeaccccbee3999a"
    "bedc6666bed53333bece0000bec6ccccbebf999abeb86666beb13333beaa0000"
    "bea2ccccbe9b999abe946666be8d3334be860000be7d9999be6f3333be60cccd"
    "be526666be440000be35999abe273333be18cccdbe0a6666bdf80000bddb3334"
    "bdc9eb85bdc428f7bdbe6667bdb8a3d7bdb2e148bdad1eb8bda75c2abda1999a"
    "bd9bd70abd96147bbd9051ebbd8a8f5dbd84cccdbd7e147bbd728f5dbd670a3d"
    "bd5b851fbd500000bd447ae1bd38f5c3bd2d70a3bd21eb85bd166667bd0ae148"
    "bcfeb852bce7ae15bcd0a3d7bcb9999abca28f5dbc8b851fbc68f5c3bc3ae148"
    "bc1f3b64bc160418bc0ccccdbc039581bbf4bc6abbe24dd3bbcfdf3bbbbd70a4"
    "bbab020dbb989374bb8624ddbb676c8abb428f5cbb1db22dbaf1a9fcbaa7ef9d"
    "ba7765ffba59e83eba3c6a80ba1eecc1ba016f01b9c7e283b98ce705b923d70b"
    "b8ba1f4bb88aefb3b8378034b7b24206b70205ffb65a1a94b513a3b700000000"
    "3513a3b7365a1a94370205ff37b2420638378034388aefb338ba1f4b3923d70b"
    "398ce70539c7e2833a016f013a1eecc13a3c6a803a59e83e3a7765ff3aa7ef9d"
    "3af1a9fc3b1db22d3b428f5c3b676c8a3b8624dd3b9893743bab020d3bbd70a4"
    "3bcfdf3b3be24dd33bf4bc6a3c0395813c0ccccd3c1604183c1f3b643c3ae148"
    "3c68f5c33c8b851f3ca28f5d3cb9999a3cd0a3d73ce7ae153cfeb8523d0ae148"
    "3d1666673d21eb853d2d70a33d38f5c33d447ae13d5000003d5b851f3d670a3d"
    "3d728f5d3d7e147b3d84cccd3d8a8f5d3d9051eb3d96147b3d9bd70a3da1999a"
    "3da75c2a3dad1eb83db2e1483db8a3d73dbe66673dc428f73dc9eb853ddb3334"
    "3df800003e0a66663e18cccd3e2733333e35999a3e4400003e5266663e60cccd"
    "3e6f33333e7d99993e8600003e8d33343e9466663e9b999a3ea2cccc3eaa0000"
    "3eb133333eb866663ebf999a3ec6cccc3ece00003ed533333edc66663ee3999a"
    "3eeacccc3ef200003ef933323f0033333f03cccc3f0766663f0b00003f0e999a"
    "3f1233343f15cccd3f1966663f1d00003f20999a3f2433343f27cccd3f2b6666"
    "3f2f00003f32999a3f3633343f39cccd3f3d66663f4100003f44999a3f483333"
    "3f4bcccd3f4f66663f5300003f56999a3f5a33333f5dcccd3f6166663f650000"
    "3f68999a3f6c33333f6fcccd3f7366663f7700003f7a999a3f7e33333f800000"
)
_UNSIGNED = (
    "0000000034ae7baa35500998360e9b383692ccf636de4c513714e5d53783126e"
    "37e171a0381fe868384f1800387e479a3896bb9938ae536438c5eb313906594b"
    "394154ca397c5049399ba5e439b923a239d6a16339f41f223a08ce713a178d50"
    "3a264c303a350b103a43c9ef3a5288d03a6147af3a70068e3a7ec56e3a958106"
    "3aba5e353adf3b643b020c4a3b147ae13b26e9783b3958103b4bc6a73b5e3540"
    "3b70a3d73b8189373b8ac0823b93f7cf3b9d2f1a3ba666663baf9db23bb8d4fd"
    "3bc20c4a3bcb43953bd47ae13bddb22e3be6e9783bf020c53bf9580f3c0147ae"
    "3c05e3543c0a7ef93c0f1aa03c13b6453c1851eb3c1ced923c2189373c2f5c2a"
    "3c4666673c5d70a33c747ae23c85c28f3c9147af3c9ccccd3ca851eb3cb3d70b"
    "3cbf5c293ccae1473cd666673ce1eb873ced70a33cf8f5c33d023d703d080000"
    "3d0dc28f3d13851f3d1947af3d1f0a3d3d24cccd3d2a8f5c3d3051eb3d36147b"
    "3d3bd70a3d41999a3d475c283d4d1eb83d52e1473d58a3d73d5e66673d6428f7"
    "3d69eb873d6fae153d7570a33d7b33333d807ae23d835c2a3d863d713d891eb8"
    "3d8c00003d8ee1483d91c2903d94a3d73d97851f3d9a66673d9d47af3da028f6"
    "3da30a3e3da5eb853da8cccd3dabae153dae8f5c3db170a43db451eb3db73333"
    "3dba147b3dbcf5c33dbfd70b3dc2b8523dc5999a3dc87ae23dcb5c293dd40000"
    "3de266663df0cccd3dff33333e06cccc3e0e00003e1533343e1c66663e23999a"
    "3e2acccc3e3200003e3933343e4066663e47999a3e4ecccc3e5600003e5d3334"
    "3e6466663e6b999a3e72cccc3e7a00003e8099993e8433333e87cccd3e8b6666"
    "3e8f00003e92999a3e9633333e99cccc3e9d66663ea100003ea4999a3ea83333"
    "3eabcccc3eaf66663eb300003eb6999a3eba33333ebdcccc3ec166663ec50000"
    "3ec8999a3ecc33333ecfcccc3ed366663ed700003eda999a3ede33333ee1cccc"
    "3ee566663ee900003eec999a3ef033333ef3cccc3ef766663efb00003efe9999"
    "3f01199a3f02e6663f04b3333f0680003f084ccc3f0a199a3f0be6663f0db334"
    "3f0f80003f114ccd3f13199a3f14e6663f16b3343f1880003f1a4ccd3f1c199a"
    "3f1de6663f1fb3343f2180003f234ccd3f25199a3f26e6663f28b3343f2a8000"
    "3f2c4ccd3f2e199a3f2fe6663f31b3343f3380003f354ccd3f37199a3f38e666"
    "3f3ab3343f3c80003f3e4ccd3f40199a3f41e6663f43b3343f4580003f474ccc"
    "3f49199a3f4ae6663f4cb3343f4e80003f504ccc3f52199a3f53e6663f55b334"
    "3f5780003f594ccc3f5b199a3f5ce6663f5eb3343f6080003f624ccc3f64199a"
    "3f65e6663f67b3343f6980003f6b4ccc3f6d199a3f6ee6663f70b3343f728000"
    "3f744ccc3f76199a3f77e6663f79b3343f7b80003f7d4ccc3f7f199a3f800000"
)


def dynamic_map(signed: bool = True) -> np.ndarray:
    """bitsandbytes' dynamic code map (`create_dynamic_map(signed)` with its defaults).

    Args:
      signed: the map for values of either sign (the first moment's, `qmap1`); `False`
        for the unsigned map of non-negative values (the second moment's, `qmap2`).

    Returns:
      A new float32 NumPy array of 256 sorted codes in `[-1, 1]`, holding 0 and 1.

    Examples:
      >>> from lucid.functional.bnb import dynamic_map
      >>> q = dynamic_map()
      >>> q.shape, float(q[-1]), float(q[127]), round(float(q[0]), 4)
      ((256,), 1.0, 0.0, -0.993)
    """
    words = "".join(_SIGNED if signed else _UNSIGNED)
    return np.frombuffer(bytes.fromhex(words), ">f4").astype(np.float32)


def _lut(code: np.ndarray) -> np.ndarray:
    """The 65536-entry table from a normalized value's bin to its nearest code (host)."""
    code = np.asarray(code, np.float32)
    midpoints = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    grid = (
        np.float32(-1.0)
        + (np.float32(2.0) * np.arange(_LUT_SIZE, dtype=np.float32)) / np.float32(_LUT_SIZE - 1)
    ).astype(np.float32)
    return np.searchsorted(midpoints, grid, side="left").astype(np.uint8)


_LUTS = {signed: _lut(dynamic_map(signed)) for signed in (True, False)}
assert all(int(table[0]) == 0 for table in _LUTS.values())  # `encode` relies on it
_MAPS = {signed: dynamic_map(signed) for signed in (True, False)}
for _table in (*_LUTS.values(), *_MAPS.values()):
    _table.setflags(write=False)


def blocks_of(n: int) -> int:
    """Number of blocks of `BLOCK_SIZE` a state of `n` elements is quantized in."""
    return -(-n // BLOCK_SIZE)


def _as_blocks(x: Array) -> Array:
    """``x`` flattened as ``(blocks, BLOCK_SIZE)``: a free reshape when its size is a
    multiple of the block (every large weight), padded with zeros otherwise."""
    n = x.size
    flat = jnp.ravel(x)
    pad = blocks_of(n) * BLOCK_SIZE - n
    if pad:
        flat = jnp.pad(flat, (0, pad))
    return flat.reshape(-1, BLOCK_SIZE)


def _as_shape(blocks: Array, shape: tuple[int, ...]) -> Array:
    """The inverse of `_as_blocks`: the first ``prod(shape)`` elements, as ``shape``."""
    n = int(np.prod(shape))
    flat = blocks.reshape(-1)
    return (flat if flat.size == n else flat[:n]).reshape(shape)


def block_absmax(x: Array) -> Array:
    """Each block's largest magnitude, NaN ignored (bitsandbytes' `absmax`), float32.

    One row reduction of the ``(blocks, 256)`` view of ``x``: XLA fuses the
    elementwise math that produces ``x`` into it, so the float32 values need not
    be stored.
    """
    return row_absmax(_as_blocks(jnp.asarray(x, jnp.float32)))


def row_absmax(blocks: Array) -> Array:
    """The largest magnitude of each row of float32 ``blocks`` (one block a row), NaN
    ignored."""
    magnitude = jnp.abs(blocks)
    return jnp.max(jnp.where(jnp.isnan(magnitude), jnp.float32(0), magnitude), axis=1)


def table_index(blocks: Array, absmax: Array) -> Array:
    """Where each value of float32 ``blocks`` (one block a row, its absmax in
    ``absmax``) reads bitsandbytes' 65536-entry code table: int32 in ``[0, 65535]``,
    0 (code 0) for a NaN and in a block of zeros."""
    inverse = (1.0 / absmax)[:, None]
    y = jnp.clip(blocks * inverse, jnp.float32(-1.0), jnp.float32(1.0))
    # bitsandbytes' index computation, (y + 1) * 0.5 * 65535 + 0.5 truncated (a fused
    # multiply-add in its kernel, as XLA emits it on the CPU)
    position = ((y + 1.0) * 0.5) * float(_LUT_SIZE - 1) + 0.5
    bad = jnp.isnan(position) | (absmax[:, None] == 0)
    # a bad value reads entry 0, code 0 (both tables start with it)
    return jnp.where(bad, jnp.float32(0), position).astype(jnp.int32)


def code_tables(signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(map, table)``: the 256 float32 codes of the dynamic map and the 65536-entry
    `uint8` table from a value's position (`table_index`) to its code (read-only host
    arrays, for kernels that take them as operands)."""
    return _MAPS[signed], _LUTS[signed]


def encode(x: Array, absmax: Array, signed: bool = True) -> Array:
    """The `uint8` codes of ``x`` (float32) in blocks whose absmax is ``absmax`` (as
    `block_absmax` gives it): the elementwise half of `quantize_blockwise`."""
    x = jnp.asarray(x, jnp.float32)
    # the flat index and `take` (indices in [0, 65535] by construction) let XLA fuse the
    # lookup with the kernel that writes the parameter
    index = _as_shape(table_index(_as_blocks(x), absmax), x.shape)
    return jnp.take(jnp.asarray(_LUTS[signed]), index, mode="clip")


def quantize_blockwise(x: Array, signed: bool = True) -> tuple[Array, Array]:
    """Quantize `x` to bitsandbytes' dynamic 8-bit codes, per block of 256 elements.

    Bit for bit bitsandbytes' CPU `quantize_blockwise(x, code, blocksize=256)` for the
    dynamic maps (see the module docstring for the rounding rule).

    Args:
      x: a float32 array of any shape (flattened in C order into blocks; the last block
        may be partial).
      signed: use the signed dynamic map (`False`: the unsigned one).

    Returns:
      `(codes, absmax)`: `uint8` codes shaped like `x`, and the float32 absmax of each
      block, shape `(ceil(x.size / 256),)`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.bnb import dequantize_blockwise, quantize_blockwise
      >>> codes, absmax = quantize_blockwise(jnp.array([0.5, -1.0, 0.25, 0.0]))
      >>> codes.dtype, absmax.tolist()
      (dtype('uint8'), [1.0])
      >>> [round(v, 3) for v in dequantize_blockwise(codes, absmax).tolist()]
      [0.501, -0.993, 0.248, 0.0]
    """
    x = jnp.asarray(x, jnp.float32)
    absmax = block_absmax(x)
    return encode(x, absmax, signed), absmax


def dequantize_blockwise(codes: Array, absmax: Array, signed: bool = True) -> Array:
    """The float32 values of 8-bit block-wise codes: `q[c] * absmax[block]`.

    Bit for bit bitsandbytes' CPU `dequantize_blockwise` with `blocksize=256`.

    Args:
      codes: `uint8` codes of any shape.
      absmax: the float32 absmax of each block of 256 codes (C order).
      signed: the codes index the signed dynamic map (`False`: the unsigned one).

    Returns:
      A float32 array shaped like `codes`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.bnb import dequantize_blockwise
      >>> dequantize_blockwise(jnp.array([255, 127], jnp.uint8), jnp.array([2.0])).tolist()
      [2.0, 0.0]
    """
    codes = jnp.asarray(codes)
    values = jnp.asarray(_MAPS[signed])[_as_blocks(codes.astype(jnp.int32))]
    values = values * jnp.asarray(absmax, jnp.float32)[:, None]
    return _as_shape(values, codes.shape)


CHUNK_ELEMENTS = 16384
"""Elements per iteration of `in_chunks` on the CPU (64 blocks of 256): each float32
array of a chunk, 64 KB, stays in the L2 cache. Measured on one 4096 x 1024 tensor
(2-core CPU): 8k to 32k elements give the same step time."""


def chunkable(size: int, block_size: int = BLOCK_SIZE) -> bool:
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


def chunk_blocks(block_size: int = BLOCK_SIZE) -> int:
    """Blocks of ``block_size`` elements in one chunk of `CHUNK_ELEMENTS`."""
    return max(1, CHUNK_ELEMENTS // block_size)


def in_chunks(
    body: Callable[..., tuple],
    carry: tuple,
    read: tuple,
    axes: tuple[tuple[int, ...], tuple[int, ...]],
    blocks: int,
    chunk: int,
) -> tuple:
    """Run a block-wise update over consecutive chunks of ``chunk`` blocks, in a loop.

    ``body(*carry_chunk, *read_chunk)`` gets each array's chunk (a slice of ``chunk``
    blocks along the array's block axis, ``axes[0]`` for ``carry``, ``axes[1]`` for
    ``read``) and returns the new chunks of ``carry``, which are written back in place.
    A block-wise update (each block's result depends on that block only) gives the same
    numbers as on the whole arrays. On the CPU this is what makes it fast: XLA computes
    the update of one chunk in a few kernels whose intermediate arrays (the float32
    states, their magnitudes) stay in the cache and are never allocated at full size,
    where the whole-array program stores (and page-faults) each of them at full size or
    recomputes the rule in every kernel that reads it.

    Args:
      body: the update of one chunk.
      carry: arrays read and rewritten (the parameter, the codes, the scales).
      read: arrays only read (the gradient).
      axes: the block axis of each array of ``carry`` and of ``read``.
      blocks: the number of blocks along those axes.
      chunk: blocks per iteration (`chunk_blocks`).

    Returns:
      The new ``carry``.
    """

    # each carried array takes the dtype `body` gives it (the state may arrive upcast);
    # float8 codes travel as their uint8 bits (XLA CPU would upcast the whole float8
    # buffer to float16 at every update of a slice of it)
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


def dequantize_blocks(codes: Array, absmax: Array, signed: bool = True) -> Array:
    """`dequantize_blockwise` of codes already shaped ``(..., blocks, 256)``, as the CPU
    computes it fastest: the code map read by a `take` of the `uint8` codes (in range by
    construction: no clamp or wrap of negative indices). The same values."""
    values = jnp.take(jnp.asarray(_MAPS[signed]), codes, mode="clip")
    return values * jnp.asarray(absmax, jnp.float32)[..., None]


def is_code_map(value: Any, signed: bool) -> bool:
    """Whether `value` (a saved `qmap1`/`qmap2`) is bitsandbytes' dynamic map."""
    array = np.asarray(value)
    return array.shape == (BLOCK_SIZE,) and bool(
        np.array_equal(array.astype(np.float32), _MAPS[signed])
    )
