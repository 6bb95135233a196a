"""Block-wise storage: a tensor flattened in C order and cut into blocks of ``B``
consecutive elements, each stored as small codes and one float32 scale ``s_b``:

$$
\\hat x_i = q[c_i]\\, s_{b(i)}
$$

``q`` a code book (`codes`). Quantizing takes each block's scale (its largest magnitude,
`absmax`, from which each reference derives ``s_b``), then each value's code
(`nearest`); dequantizing is `decode`. A block's codes depend on that block alone, which
is what lets a step run block by block (`chunks`) and blocks of several tensors be laid
end to end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._math import max_abs

Array = jax.Array


def blocks_of(n: int, block_size: int) -> int:
    """The number of blocks of ``block_size`` that ``n`` elements fill (the last may be
    partial): ``ceil(n / block_size)``.

    Examples:
      >>> blocks_of(512, 256), blocks_of(513, 256), blocks_of(0, 256)
      (2, 3, 0)
    """
    return -(-n // block_size)


def as_blocks(x: Array, block_size: int) -> Array:
    """``x`` flattened as ``(blocks, block_size)``: a free reshape when its size is a
    multiple of the block, padded with zeros otherwise.

    Examples:
      >>> import jax.numpy as jnp
      >>> as_blocks(jnp.arange(5), 4).tolist()
      [[0, 1, 2, 3], [4, 0, 0, 0]]
    """
    n = x.size
    flat = jnp.ravel(x)
    pad = blocks_of(n, block_size) * block_size - n
    if pad:
        flat = jnp.pad(flat, (0, pad))
    return flat.reshape(-1, block_size)


def from_blocks(blocks: Array, shape: tuple[int, ...]) -> Array:
    """The inverse of `as_blocks`: the first ``prod(shape)`` elements, as ``shape``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from_blocks(as_blocks(jnp.arange(5), 4), (5,)).tolist()
      [0, 1, 2, 3, 4]
    """
    n = int(np.prod(shape))
    flat = blocks.reshape(-1)
    return (flat if flat.size == n else flat[:n]).reshape(shape)


def absmax(blocks: Array) -> Array:
    """Each row's largest magnitude, ``max_j |x_bj|``, NaN for a row holding a NaN
    (``torch.amax(x.abs())``, torchao's).

    Examples:
      >>> import jax.numpy as jnp
      >>> absmax(jnp.array([[1.0, -3.0], [jnp.nan, 2.0]])).tolist()
      [3.0, nan]
    """
    return max_abs(blocks, axis=-1)


def absmax_ignoring_nan(blocks: Array) -> Array:
    """Each row's largest magnitude over its values that are not NaN, 0 for a row of
    NaNs (bitsandbytes' ``absmax``).

    One row reduction of float32 ``blocks``: XLA fuses the elementwise math that
    produces them into it, so they need not be stored.

    Examples:
      >>> import jax.numpy as jnp
      >>> absmax_ignoring_nan(jnp.array([[1.0, -3.0], [jnp.nan, 2.0]])).tolist()
      [3.0, 2.0]
    """
    magnitude = jnp.abs(blocks)
    return jnp.max(jnp.where(jnp.isnan(magnitude), jnp.float32(0), magnitude), axis=1)


def decode(codes: Array, table: np.ndarray, scale: Array) -> Array:
    """The float32 values codes stand for: ``q[c_bj] * s_b``.

    The code book is read by a `take` of the unsigned codes (in range by construction:
    no clamp or wrap of negative indices is needed; on the CPU the fastest gather).

    Args:
      codes: unsigned integer codes shaped ``(..., blocks, elements of a block)``.
      table: the code book ``q`` (host array).
      scale: the float32 scale of each block, shaped ``(..., blocks)``.

    Returns:
      float32 values shaped as ``codes``.

    Examples:
      >>> import jax.numpy as jnp
      >>> table = np.array([-1.0, 0.0, 0.5, 1.0], np.float32)
      >>> decode(jnp.array([[0, 3], [2, 1]], jnp.uint8), table, jnp.array([2.0, 4.0])).tolist()
      [[-2.0, 2.0], [2.0, 0.0]]
    """
    values = jnp.take(jnp.asarray(table), codes, mode="clip")
    return values * jnp.asarray(scale, jnp.float32)[..., None]


def pack_nibbles(codes: Array) -> Array:
    """4-bit codes two a byte, the even element in the high nibble (torchao's layout):
    ``uint8`` of half the size, flat.

    Examples:
      >>> import jax.numpy as jnp
      >>> pack_nibbles(jnp.array([1, 2, 15, 0])).tolist()
      [18, 240]
    """
    pairs = codes.reshape(-1, 2)
    return ((pairs[:, 0] << 4) | pairs[:, 1]).astype(jnp.uint8)


def unpack_nibbles(packed: Array) -> Array:
    """The inverse of `pack_nibbles`: ``uint8`` codes shaped ``(*packed.shape, 2)``, the
    high nibble first (a broadcast, which XLA fuses into what reads it).

    Examples:
      >>> import jax.numpy as jnp
      >>> unpack_nibbles(jnp.array([18, 240], jnp.uint8)).tolist()
      [[1, 2], [15, 0]]
    """
    return (packed[..., None] >> jnp.array([4, 0], jnp.uint8)) & jnp.uint8(0xF)
