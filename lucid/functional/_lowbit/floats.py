"""float32 values rounded to narrower floats: ``float8_e4m3fn`` (torchao's fp8 state) to
nearest, ties to even, and ``bfloat16`` stochastically (torchao's bf16 parameters).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array

FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0
"""The largest finite ``float8_e4m3fn``."""


def to_fp8(x: Array) -> Array:
    """``x`` (float32, within ``±FP8_MAX``) as ``float8_e4m3fn``, rounded to the nearest
    code, ties to even, as torch's ``x.to(torch.float8_e4m3fn)``.

    The rounding is done here, onto e4m3fn's grid (3 mantissa bits; spacing
    ``2**(e-3)`` in the binade ``2**e``, ``2**-9`` below the smallest normal
    ``2**-6``), so the cast that follows is exact: older XLA versions (jax < 0.5)
    round a direct float32 to float8 cast differently in a few codes in a thousand.

    Examples:
      >>> import jax.numpy as jnp
      >>> to_fp8(jnp.array([1.0625, 1.1875, 300.0])).astype(jnp.float32).tolist()
      [1.0, 1.25, 288.0]
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

    Examples:
      >>> import jax.numpy as jnp
      >>> to_fp8_by_bits(jnp.array([1.0625, 1.1875, 300.0])).astype(jnp.float32).tolist()
      [1.0, 1.25, 288.0]
    """
    return jax.lax.bitcast_convert_type(fp8_bits(x), FP8)


def fp8_bits(x: Array, rint: Callable[[Array], Array] = jnp.round) -> Array:
    """The ``uint8`` bits of `to_fp8_by_bits`' code of ``x``; ``rint`` rounds the
    non-negative subnormal mantissas (values below 8) to the nearest integer, ties to
    even (a kernel that has no ``round`` passes `rint_small`)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    sign = (bits >> 24) & jnp.uint32(0x80)
    magnitude = bits & jnp.uint32(0x7FFFFFFF)
    rounded = magnitude + jnp.uint32(0x7FFFF) + ((magnitude >> 20) & jnp.uint32(1))
    normal = (rounded >> 20) - jnp.uint32(120 << 3)
    small = rint(jnp.abs(x) * jnp.float32(512)).astype(jnp.uint32)
    code = jnp.where(magnitude < jnp.uint32(0x3C800000), small, normal)
    code = jnp.where(jnp.isnan(x), jnp.uint32(0x7F), code) | sign
    return code.astype(jnp.uint8)


def rint_small(y: Array) -> Array:
    """``round(y)``, ties to even, for float32 ``0 <= y < 2**22`` by adding and taking
    away ``2**23`` (each sum rounded to float32 drops the fraction as the rounding mode
    does); NaN stays NaN.

    Examples:
      >>> import jax.numpy as jnp
      >>> rint_small(jnp.array([0.5, 1.5, 2.5, 3.4999998, 7.5])).tolist()
      [0.0, 2.0, 2.0, 3.0, 8.0]
    """
    shift = jnp.float32(2.0**23)
    return (y + shift) - shift


def from_fp8_bits(code: Array) -> Array:
    """The float32 value of each ``float8_e4m3fn`` code given as its ``uint8`` bits, as
    the cast of the float8 value: exponent ``e`` and mantissa ``m`` give ``(1 + m/8)
    2^(e-7)`` (rebiased into float32's bits), ``m 2^-9`` when ``e`` is 0, NaN for
    ``0x7F`` and ``0xFF``; the sign bit is kept.

    Examples:
      >>> import jax.numpy as jnp
      >>> from_fp8_bits(jnp.array([0x38, 0x01, 0xC0, 0x7E], jnp.uint8)).tolist()
      [1.0, 0.001953125, -2.0, 448.0]
    """
    code = code.astype(jnp.uint32)
    sign = (code & jnp.uint32(0x80)) << 24
    rest = code & jnp.uint32(0x7F)
    normal = jax.lax.bitcast_convert_type(sign | ((rest + jnp.uint32(120 << 3)) << 20), jnp.float32)
    small = (rest & jnp.uint32(7)).astype(jnp.float32) * jnp.float32(2.0**-9)
    small = jnp.where(sign != 0, -small, small)
    value = jnp.where(rest < jnp.uint32(8), small, normal)
    nan = jax.lax.bitcast_convert_type(sign | jnp.uint32(0x7FC00000), jnp.float32)
    return jnp.where(rest == jnp.uint32(0x7F), nan, value)


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
