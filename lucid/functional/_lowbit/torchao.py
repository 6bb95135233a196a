"""torchao's block-wise quantization of optimizer state.

torchao (`torchao.optim`, 0.18) stores each Adam moment of a large enough
tensor in one of three forms, each with one float32 scale per block of the
flattened tensor (``block_size`` consecutive elements):

* **8 bits** (`Adam8bit`): ``x / s`` with ``s = max(max|x|, 1e-12)`` over the
  block, coded as the index of the nearest entry of a 256-entry *dynamic tree
  map* (the bitsandbytes map: signed for the first moment, unsigned for the
  second). Codes are ``uint8``, shaped as the tensor.
* **4 bits** (`Adam4bit`): the same with a 16-entry map (signed: the dynamic map
  with 3 exponent bits; unsigned: the linear ``1/16, 2/16, ..., 1``, which has no
  zero); two codes a byte, the even element in the high nibble, as one flat
  ``uint8`` array of half the tensor's size.
* **fp8** (`AdamFp8`): ``x / s`` with ``s = max(max|x|, 1e-12) / 448`` cast to
  ``float8_e4m3fn`` (round to nearest even), shaped as the tensor.

"Nearest" is torchao's rule: a branchless binary search finds the largest code
``c`` with ``map[c] <= x`` (code 0 when there is none, NaN included), and ``c``
becomes ``c + 1`` when ``x - map[c] >= (map[c+1] - map[c]) / 2`` (ties round up).
Dequantization is ``map[c] * s`` (fp8: ``float(c) * s``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import blockwise, floats, nearest
from .codes import qmap

Array = jax.Array

SCALE_FLOOR = 1e-12
"""torchao clips every block's max |x| from below by this."""


def _table(form: str, signed: bool) -> np.ndarray:
    """The code map of an 8- or 4-bit form."""
    return qmap(8 if form == "8bit" else 4, signed)


def quantize(x: Array, form: str, signed: bool, block_size: int) -> tuple[Array, Array]:
    """``x`` (float32) as torchao stores it: ``(codes, scale)``.

    Args:
      x: the moment, any shape whose size is a multiple of ``block_size``.
      form: ``"8bit"``, ``"4bit"`` or ``"fp8"``.
      signed: the signed map (first moment) or the unsigned one (second moments);
        unused for fp8.
      block_size: elements per scale.

    Returns:
      ``codes``: ``uint8`` shaped as ``x`` (8 bits), ``uint8`` of ``x.size // 2``
      (4 bits, two a byte) or ``float8_e4m3fn`` shaped as ``x``; ``scale``: float32,
      one per block.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.torchao import dequantize, quantize
      >>> x = jnp.linspace(-1.0, 2.0, 8)
      >>> codes, scale = quantize(x, "4bit", True, 4)
      >>> codes.dtype, codes.shape, scale.tolist()
      (dtype('uint8'), (4,), [1.0, 2.0])
      >>> [round(v, 3) for v in dequantize(codes, scale, "4bit", True, x.shape).tolist()[:4]]
      [-0.887, -0.663, -0.078, 0.212]
    """
    scale = block_scale(x, form, block_size)
    return encode(x, scale, form, signed, block_size), scale


def block_scale(x: Array, form: str, block_size: int) -> Array:
    """Each block's float32 scale, as `quantize` computes it: ``max(max|x|, 1e-12)``,
    NaN for a block holding a NaN (torchao's ``amax``: the whole block then reads NaN),
    divided by `floats.FP8_MAX` for fp8 (a row reduction over the ``(blocks,
    block_size)`` view of ``x``, into which XLA fuses what produces ``x``)."""
    blocks = x.astype(jnp.float32).reshape(-1, block_size)
    return scale_of(blockwise.absmax(blocks), form)


def scale_of(absmax: Array, form: str, fp8_max: Array | None = None) -> Array:
    """A block's float32 scale from its largest magnitude (`block_scale`); ``fp8_max``:
    `floats.FP8_MAX` as a value computed at run time (a kernel's operand), by default
    an array XLA cannot fold."""
    scale = jnp.maximum(absmax, jnp.float32(SCALE_FLOOR))
    if form == "fp8":
        # a division by a materialized array: XLA would turn ``scale / 448`` into
        # ``scale * (1/448)``, an ulp off torch's quotient for many scales
        if fp8_max is None:
            divisor = jnp.full(scale.shape, floats.FP8_MAX, jnp.float32)
            fp8_max = jax.lax.optimization_barrier(divisor)
        scale = scale / fp8_max
    return scale


def encode(
    x: Array, scale: Array, form: str, signed: bool, block_size: int, cpu: bool = False
) -> Array:
    """The codes of ``x`` in blocks of scale ``scale`` (from `block_scale`): the
    elementwise half of `quantize` (``cpu``: in the formulations the CPU runs fastest,
    the same codes)."""
    blocks = x.astype(jnp.float32).reshape(-1, block_size)
    if form == "fp8":
        scaled = scaled_values(blocks, scale)
        to_fp8 = floats.to_fp8_by_bits if cpu else floats.to_fp8
        return to_fp8(scaled).reshape(x.shape)
    scaled = scaled_values(blocks, scale).reshape(-1)
    codes = nearest.nearest_codes(scaled, _table(form, signed), columns=cpu)
    if form == "8bit":
        return codes.astype(jnp.uint8).reshape(x.shape)
    return blockwise.pack_nibbles(codes)


def scaled_values(blocks: Array, scale: Array) -> Array:
    """Values ``(blocks, elements)`` over their block's scale, what the code map codes."""
    return blocks / scale[:, None]


def code_table(form: str, signed: bool) -> np.ndarray:
    """The code map of an 8- or 4-bit form (`qmap`)."""
    return _table(form, signed)


def dequantize(
    codes: Array, scale: Array, form: str, signed: bool, shape: tuple[int, ...]
) -> Array:
    """The float32 values ``(codes, scale)`` stand for (torchao's ``dequantize``).

    Args:
      codes: as `quantize` returns them (fp8 codes may arrive upcast to float32).
      scale: one float32 per block.
      form: ``"8bit"``, ``"4bit"`` or ``"fp8"``.
      signed: which map (unused for fp8).
      shape: the moment's shape.

    Returns:
      float32 values of ``shape``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.torchao import dequantize, quantize
      >>> x = jnp.array([0.5, -1.0, 0.25, 2.0])
      >>> codes, scale = quantize(x, "8bit", True, 2)
      >>> [round(v, 4) for v in dequantize(codes, scale, "8bit", True, x.shape).tolist()]
      [0.5008, -0.993, 0.2422, 2.0]
    """
    rows = scale.shape[0]
    if form == "fp8":
        values = codes.astype(jnp.float32).reshape(rows, -1)
        return (values * scale.astype(jnp.float32)[:, None]).reshape(shape)
    codes = codes.astype(jnp.uint8)
    if form == "4bit":
        codes = blockwise.unpack_nibbles(codes)
    table = _table(form, signed)
    return blockwise.decode(codes.reshape(rows, -1), table, scale).reshape(shape)
