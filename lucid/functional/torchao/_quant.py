"""torchao's block-wise quantization of optimizer state, and its bf16 stochastic rounding.

torchao (`torchao.optim`, 0.18) stores each Adam moment of a large enough
tensor in one of three forms, each with one float32 scale per block of the
flattened tensor (``block_size`` consecutive elements):

* **8 bits** (`Adam8bit`): ``x / s`` with ``s = max(max|x|, 1e-12)`` over the
  block, coded as the index of the nearest entry of a 256-entry *dynamic tree
  map* (the bitsandbytes map, without its zero padding: signed for the first
  moment, unsigned for the second). Codes are ``uint8``, shaped as the tensor.
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

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._math import max_abs

Array = jax.Array

FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
SCALE_FLOOR = 1e-12  # torchao clips every block's max |x| from below by this


def _linspace32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace`` in float32 as torch's CPU kernel computes it: a float32
    step, the first half ``fma(step, i, start)``, the second half
    ``fma(-step, steps - 1 - i, end)`` (one rounding each; the float64 product of
    two float32 numbers is exact)."""
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64((end32 - start32) / np.float32(steps - 1))
    index = np.arange(steps, dtype=np.float64)
    up = step * index + np.float64(start32)
    down = -step * (steps - 1 - index) + np.float64(end32)
    return np.where(index < steps // 2, up, down).astype(np.float32)


def dynamic_map(signed: bool, exponent_bits: int, total_bits: int) -> np.ndarray:
    """The dynamic tree map of Dettmers (2016) as torchao builds it (float32, sorted).

    For each decade ``10^(i - exponent_bits + 1)``, ``i < exponent_bits``, the
    midpoints of an even split of ``[0.1, 1]`` into ``2^(i + total_bits - 1 -
    exponent_bits)`` pieces (twice as many when unsigned), negated too when
    signed; the largest decade adds ``2^(total_bits - 1 - exponent_bits) - 1``
    more; then 0 and 1.

    Args:
      signed: a map for signed values (the first moment) or for non-negative ones.
      exponent_bits: the number of decades (7 for 8 bits, 3 for 4 bits).
      total_bits: the code width; the map has ``2^total_bits`` entries.

    Returns:
      The map, ``2^total_bits`` float32 values in increasing order.
    """
    fraction_bits = total_bits - 1
    values: list[np.ndarray] = []
    decade = np.float32(1)
    for i in range(exponent_bits):
        count = 2 ** (i + fraction_bits - exponent_bits + (0 if signed else 1)) + 1
        bounds = _linspace32(0.1, 1.0, count)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2)
        decade = np.float32(10.0 ** (i + 1 - exponent_bits))
        values.append(decade * means)
        if signed:
            values.append(-decade * means)
    extra = 2 ** (fraction_bits - exponent_bits) - 1
    if extra > 0:
        bounds = _linspace32(0.1, 1.0, extra + 1)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2)
        values.append(decade * means)
        if signed:
            values.append(-decade * means)
    values.append(np.array([0.0, 1.0], np.float32))
    table = np.sort(np.concatenate(values).astype(np.float32))
    assert table.size == 2**total_bits
    return table


@functools.cache
def qmap(bits: int, signed: bool) -> np.ndarray:
    """torchao's code map for ``bits``-bit state (8 or 4), signed or unsigned.

    Args:
      bits: 8 or 4.
      signed: the first moment's map (signed) or the second moment's (unsigned).

    Returns:
      The map as a read-only float32 NumPy array (256 or 16 entries, increasing).

    Examples:
      >>> from lucid.functional.torchao import qmap
      >>> qmap(4, signed=False)[:3].tolist(), qmap(8, signed=True).shape
      ([0.0625, 0.125, 0.1875], (256,))
    """
    if bits == 8:
        table = dynamic_map(signed, 7, 8)
    elif bits == 4:
        table = dynamic_map(signed, 3, 4) if signed else _linspace32(0.0, 1.0, 17)[1:]
    else:
        raise ValueError(f"torchao's code maps have 8 or 4 bits, not {bits}")
    table = np.array(table, np.float32)
    table.setflags(write=False)
    return table


def _scale(blocks: Array) -> Array:
    """Each block's ``max(max |x|, 1e-12)``, NaN for a block holding a NaN (torchao's
    ``amax``: the whole block's values then read NaN)."""
    return jnp.maximum(max_abs(blocks, axis=-1), jnp.float32(SCALE_FLOOR))


def _ordered(bits: Any) -> Any:
    """float32 bit patterns (int32) as integers in the order of the floats they encode
    (``-0.0`` and ``0.0`` alike); works on NumPy and jax arrays."""
    return _where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _where(condition: Any, a: Any, b: Any) -> Any:
    module = np if isinstance(condition, np.ndarray | np.generic | bool) else jnp
    return module.where(condition, a, b)


def thresholds(table: np.ndarray) -> np.ndarray:
    """Where torchao's rule moves from one code to the next, as float32 values.

    torchao's code of ``x`` is the largest ``c`` with ``map[c] <= x``, plus one when
    ``x - map[c] >= (map[c+1] - map[c]) * 0.5`` in float32. Both tests are monotone in
    ``x``, so the code is the number of thresholds ``t_c <= x``, ``t_c`` the smallest
    float32 ``x >= map[c]`` that rounds up (found exactly, by bisection over float32).

    Args:
      table: a code map (`qmap`), increasing.

    Returns:
      ``table.size - 1`` increasing float32 thresholds.
    """
    out = np.empty(table.size - 1, np.float32)
    for c in range(table.size - 1):
        a, b = table[c], table[c + 1]
        half = np.float32(np.float32(b - a) * np.float32(0.5))
        low, high = int(_ordered(a.view(np.int32))), int(_ordered(b.view(np.int32)))
        while low < high:  # the smallest ordinal in [a, b] whose value rounds up
            middle = (low + high) // 2
            if np.float32(_from_ordered(middle) - a) >= half:
                high = middle
            else:
                low = middle + 1
        out[c] = _from_ordered(low)
    return out


def _from_ordered(ordinal: int) -> np.float32:
    bits = ordinal if ordinal >= 0 else (-ordinal) | -(2**31)
    return np.array(bits, np.int32).view(np.float32)[()]


_RANGE = 1.5  # scaled values lie in [-1, 1] (an ulp more after XLA's reciprocal)


@functools.cache
def _lookup(bits: int, signed: bool) -> tuple[int, int, np.ndarray]:
    """A bucket table over float32 ordinals: ``(shift, first bucket, rows)``, each row
    ``(thresholds below the bucket, its first threshold, its second)`` (``inf`` for
    none), with the shift chosen so that no bucket holds more than two thresholds."""
    cuts = thresholds(qmap(bits, signed))
    ordinals = _ordered(cuts.view(np.int32)).astype(np.int64)
    low = int(_ordered(np.float32(-_RANGE).view(np.int32)))
    high = int(_ordered(np.float32(_RANGE).view(np.int32)))
    for shift in range(24, 0, -1):
        buckets = ordinals >> shift
        if np.unique(buckets, return_counts=True)[1].max() <= 2:
            break
    first = low >> shift
    rows = (high >> shift) - first + 1
    index = np.arange(rows) + first
    below = np.searchsorted(buckets, index, side="left")
    table = np.full((rows, 3), np.inf, np.float32)
    table[:, 0] = below
    for column in (1, 2):
        at = below + column - 1
        inside = (at < cuts.size) & (buckets[np.minimum(at, cuts.size - 1)] == index)
        table[inside, column] = cuts[at[inside]]
    table.setflags(write=False)
    return shift, first, table


def nearest_codes(x: Array, table: np.ndarray, columns: bool = False) -> Array:
    """torchao's code of each (scaled) value: the largest code whose map value is at
    most ``x`` (code 0 when none is, NaN included), rounded half up to the next.

    Computed as the number of `thresholds` at most ``x``: one lookup in a table of
    float32 buckets (each holding at most two thresholds) and two comparisons, the
    same codes as torchao's eight-step binary search and rounding.

    Args:
      x: float32 values, in ``[-1, 1]`` after scaling.
      table: the code map (`qmap`).
      columns: read the bucket table's three columns as three tables, and for a
        16-entry map count the 15 thresholds by comparisons (the same codes; on the CPU
        XLA reads three floats from three tables twice as fast as a row of three from
        one, and compares faster than it reads).

    Returns:
      int32 codes, shaped as ``x``.
    """
    bits, signed = (8 if table.size == 256 else 4), bool(table[0] < 0)
    if columns and bits == 4:  # 15 comparisons, vectorized, for a 16-entry map
        count = sum((x >= cut).astype(jnp.int32) for cut in thresholds(table))
        return jnp.asarray(count, jnp.int32)
    shift, first, rows = _lookup(bits, signed)
    # float32 bounds: a Python float is a float64 operand of jnp.clip's own jit under x64
    bound = np.float32(_RANGE)
    clipped = jnp.clip(x.astype(jnp.float32), -bound, bound)
    ordinal = _ordered(jax.lax.bitcast_convert_type(clipped, jnp.int32))
    index = (ordinal >> shift) - first
    if columns:
        below, low, high = (
            jnp.take(jnp.asarray(np.ascontiguousarray(rows[:, k])), index, mode="clip")
            for k in range(3)
        )
    else:
        row = jnp.take(jnp.asarray(rows), index, axis=0, mode="clip")
        below, low, high = row[..., 0], row[..., 1], row[..., 2]
    count = below + (x >= low) + (x >= high)
    return jnp.where(jnp.isnan(x), 0, count.astype(jnp.int32))


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
    """Each block's float32 scale, as `quantize` computes it (a row reduction over the
    ``(blocks, block_size)`` view of ``x``, into which XLA fuses what produces ``x``)."""
    scale = _scale(x.astype(jnp.float32).reshape(-1, block_size))
    if form == "fp8":
        # a division by a materialized array: XLA would turn ``scale / 448`` into
        # ``scale * (1/448)``, an ulp off torch's quotient for many scales
        scale = scale / jax.lax.optimization_barrier(jnp.full(scale.shape, FP8_MAX, jnp.float32))
    return scale


def encode(
    x: Array, scale: Array, form: str, signed: bool, block_size: int, cpu: bool = False
) -> Array:
    """The codes of ``x`` in blocks of scale ``scale`` (from `block_scale`): the
    elementwise half of `quantize` (``cpu``: in the formulations the CPU runs fastest,
    the same codes)."""
    blocks = x.astype(jnp.float32).reshape(-1, block_size)
    if form == "fp8":
        scaled = blocks / scale[:, None]
        return (to_fp8_by_bits(scaled) if cpu else to_fp8(scaled)).reshape(x.shape)
    scaled = (blocks / scale[:, None]).reshape(-1)
    codes = nearest_codes(scaled, qmap(8 if form == "8bit" else 4, signed), columns=cpu)
    if form == "8bit":
        return codes.astype(jnp.uint8).reshape(x.shape)
    pairs = codes.reshape(-1, 2)
    return ((pairs[:, 0] << 4) | pairs[:, 1]).astype(jnp.uint8)


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
    else:
        codes = codes.astype(jnp.uint8)
        if form == "4bit":  # the high nibble first; a broadcast, which XLA fuses
            codes = (codes[:, None] >> jnp.array([4, 0], jnp.uint8)) & jnp.uint8(0xF)
        table = jnp.asarray(qmap(8 if form == "8bit" else 4, signed))
        values = table[codes.reshape(rows, -1)]  # unsigned indices: no wrap of negatives
    return (values * scale.astype(jnp.float32)[:, None]).reshape(shape)


def bf16_stochastic_round(x: Array, key: Array) -> Array:
    """torchao's ``_fp32_to_bf16_sr``: float32 to bfloat16, rounding away from zero
    with probability (the 16 bits dropped) / 2^16, so that the expected result is
    ``x``.

    torchao draws the 16 random bits from torch's generator; lucid draws them from
    ``key`` (``jax.random.bits``), so single results differ from torchao's while
    the distribution is the same.

    Args:
      x: float32 values.
      key: a PRNG key (raw ``uint32[2]`` or typed).

    Returns:
      bfloat16 values, each one of the two bfloat16 neighbours of ``x`` (``x``
      itself when it is a bfloat16 value).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from lucid.functional.torchao import bf16_stochastic_round
      >>> x = jnp.full((20000,), 1.0 + 2.0**-9)  # a quarter of the way to the next bf16
      >>> y = bf16_stochastic_round(x, jax.random.PRNGKey(0)).astype(jnp.float32)
      >>> sorted(set(y.tolist())), bool(abs(y.mean() - x[0]) < 2e-4)
      ([1.0, 1.0078125], True)
    """
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    random16 = jax.random.bits(key, x.shape, jnp.uint32) >> 16
    toward_zero = bits & jnp.uint32(0xFFFF0000)
    away = random16 < (bits & jnp.uint32(0xFFFF))
    rounded = jnp.where(away, toward_zero + jnp.uint32(0x10000), toward_zero)
    return jax.lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)


def to_fp8(x: Array) -> Array:
    """``x`` (float32, within ``±FP8_MAX``) as ``float8_e4m3fn``, rounded to the nearest
    code, ties to even, as torch's ``x.to(torch.float8_e4m3fn)``.

    The rounding is done here, onto e4m3fn's grid (3 mantissa bits; spacing
    ``2**(e-3)`` in the binade ``2**e``, ``2**-9`` below the smallest normal
    ``2**-6``), so the cast that follows is exact: older XLA versions (jax < 0.5)
    round a direct float32 to float8 cast differently in a few codes in a thousand.
    """
    _, exponent = jnp.frexp(x)  # |x| = m * 2**exponent, 0.5 <= m < 1
    binade = jnp.maximum(exponent - 1, -6)
    spacing = jnp.ldexp(jnp.ones_like(x), binade - 3)
    return (jnp.round(x / spacing) * spacing).astype(FP8)


def to_fp8_by_bits(x: Array) -> Array:
    """`to_fp8` computed on the float32 bits (the same codes; on the CPU it takes a few
    integer operations where `frexp`, `ldexp` and XLA's float8 conversion take dozens).

    At or above e4m3fn's smallest normal ``2**-6`` the mantissa is rounded to 3 bits,
    ties to even, by adding ``0x7FFFF`` plus the lowest kept bit and truncating (a carry
    moves to the next binade), and the float32 exponent is rebiased (127 -> 7); below,
    the code is ``round(|x| * 2**9)`` (e4m3fn's subnormal mantissa, 8 for ``2**-6``).
    The sign bit is kept; NaN becomes e4m3fn's NaN (``0x7F`` and the sign).
    """
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    sign = (bits >> 24) & jnp.uint32(0x80)
    magnitude = bits & jnp.uint32(0x7FFFFFFF)
    rounded = magnitude + jnp.uint32(0x7FFFF) + ((magnitude >> 20) & jnp.uint32(1))
    normal = (rounded >> 20) - jnp.uint32(120 << 3)
    small = jnp.round(jnp.abs(x) * jnp.float32(512)).astype(jnp.uint32)
    code = jnp.where(magnitude < jnp.uint32(0x3C800000), small, normal)
    code = jnp.where(jnp.isnan(x), jnp.uint32(0x7F), code) | sign
    return jax.lax.bitcast_convert_type(code.astype(jnp.uint8), FP8)
