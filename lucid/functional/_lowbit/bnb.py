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

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import blockwise, codes, nearest

Array = jax.Array

BLOCK_SIZE = 256
"""Elements per quantization block (bitsandbytes' 8-bit optimizers use 256)."""

_MAPS = {signed: codes.dynamic_map(signed) for signed in (True, False)}
_LUTS = {signed: nearest.position_table(_MAPS[signed]) for signed in (True, False)}
assert all(int(table[0]) == 0 for table in _LUTS.values())  # `encode` relies on it
for _table in (*_LUTS.values(), *_MAPS.values()):
    _table.setflags(write=False)


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
    return np.array(_MAPS[signed])


def code_tables(signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(map, table)``: the 256 float32 codes of the dynamic map and the 65536-entry
    `uint8` table from a value's position (`nearest.table_index`) to its code (read-only
    host arrays, for kernels that take them as operands)."""
    return _MAPS[signed], _LUTS[signed]


def block_absmax(x: Array) -> Array:
    """Each block's largest magnitude, NaN ignored (bitsandbytes' `absmax`), float32:
    one row reduction of the ``(blocks, 256)`` view of ``x``."""
    return blockwise.absmax_ignoring_nan(
        blockwise.as_blocks(jnp.asarray(x, jnp.float32), BLOCK_SIZE)
    )


def encode(x: Array, absmax: Array, signed: bool = True) -> Array:
    """The `uint8` codes of ``x`` (float32) in blocks whose absmax is ``absmax`` (as
    `block_absmax` gives it): the elementwise half of `quantize_blockwise`."""
    x = jnp.asarray(x, jnp.float32)
    # the flat index and `take` (indices in [0, 65535] by construction) let XLA fuse the
    # lookup with the kernel that writes the parameter
    index = nearest.table_index(blockwise.as_blocks(x, BLOCK_SIZE), absmax)
    index = blockwise.from_blocks(index, x.shape)
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
    codes = jnp.asarray(codes).astype(jnp.uint8)
    values = blockwise.decode(blockwise.as_blocks(codes, BLOCK_SIZE), _MAPS[signed], absmax)
    return blockwise.from_blocks(values, codes.shape)


def is_code_map(value: Any, signed: bool) -> bool:
    """Whether `value` (a saved `qmap1`/`qmap2`) is bitsandbytes' dynamic map."""
    array = np.asarray(value)
    return array.shape == (BLOCK_SIZE,) and bool(
        np.array_equal(array.astype(np.float32), _MAPS[signed])
    )
