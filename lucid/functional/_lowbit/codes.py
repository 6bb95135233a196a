"""The code books of low-bit optimizer state: sorted float32 values in ``[-1, 1]`` that a
code (a small integer) stands for, before its block's scale multiplies it.

* The **dynamic tree map** of Dettmers (2016), `dynamic_map`: bitsandbytes' 8-bit map
  (`create_dynamic_map`) and torchao's 8-bit and signed 4-bit maps are this one recipe,
  built from torch's float32 ``linspace``, and agree bit for bit (the tests compare each
  with its reference's own).
* torchao's unsigned **4-bit** map, ``1/16, 2/16, ..., 1`` (`qmap`).

Every map is a host (NumPy) array: a kernel takes it as a constant operand.
"""

from __future__ import annotations

import functools

import numpy as np


def linspace32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps, dtype=torch.float32)`` as torch's CPU kernel
    computes it, bit for bit.

    With ``d = float32((end - start) / (steps - 1))``, element ``i`` is
    ``fma(d, i, start)`` for ``i < steps // 2`` and ``fma(-d, steps - 1 - i, end)``
    otherwise, each rounded once to float32 (the float64 product of two float32
    numbers is exact, so a float64 multiply-add rounded to float32 is the fma).

    Args:
      start: the first value (rounded to float32 first, as torch rounds it).
      end: the last value (likewise).
      steps: the number of values, at least 2.

    Returns:
      A new float32 array of ``steps`` values.

    Examples:
      >>> linspace32(0.0, 1.0, 5).tolist()
      [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64((end32 - start32) / np.float32(steps - 1))
    index = np.arange(steps, dtype=np.float64)
    up = step * index + np.float64(start32)
    down = -step * (steps - 1 - index) + np.float64(end32)
    return np.where(index < steps // 2, up, down).astype(np.float32)


def _midpoints(pieces: int) -> np.ndarray:
    """The midpoints of ``pieces`` equal pieces of ``[0.1, 1]`` (float32)."""
    bounds = linspace32(0.1, 1.0, pieces + 1)
    return (bounds[:-1] + bounds[1:]) / np.float32(2)


def dynamic_map(signed: bool = True, exponent_bits: int = 7, total_bits: int = 8) -> np.ndarray:
    """The dynamic tree map (Dettmers, 2016), as bitsandbytes' `create_dynamic_map` and
    torchao's `create_dynamic_map` build it, bit for bit.

    With ``E = exponent_bits`` decades and ``F = total_bits - 1`` bits besides the sign,
    decade ``i < E`` holds ``10^(i + 1 - E) * mid(n_i)``, where ``mid(n)`` are the
    midpoints of ``n`` equal pieces of ``[0.1, 1]`` (`linspace32`) and
    ``n_i = 2^(i + F - E)`` (twice as many when unsigned); the largest decade adds
    ``10^0 * mid(2^(F - E) - 1)``; every value is negated too when ``signed``; then 0
    and 1, all sorted. Codes spent log-uniformly over the decades keep about the same
    relative precision for small and large values.

    Args:
      signed: a map for values of either sign (a first moment) or for non-negative ones.
      exponent_bits: the number of decades (7 for 8 bits, 3 for torchao's 4 bits).
      total_bits: the code width; the map has ``2^total_bits`` entries.

    Returns:
      A new float32 array of ``2^total_bits`` increasing values in ``[-1, 1]`` (``[0, 1]``
      unsigned), holding 0 and 1.

    Examples:
      >>> q = dynamic_map(signed=True)
      >>> q.shape, float(q[-1]), float(q[127]), round(float(q[0]), 4)
      ((256,), 1.0, 0.0, -0.993)
    """
    fraction_bits = total_bits - 1
    values: list[np.ndarray] = []
    decade = np.float32(1)
    for i in range(exponent_bits):
        means = _midpoints(2 ** (i + fraction_bits - exponent_bits + (0 if signed else 1)))
        decade = np.float32(10.0 ** (i + 1 - exponent_bits))
        values += [decade * means, -decade * means] if signed else [decade * means]
    extra = 2 ** (fraction_bits - exponent_bits) - 1
    if extra > 0:
        means = _midpoints(extra)
        values += [decade * means, -decade * means] if signed else [decade * means]
    values.append(np.array([0.0, 1.0], np.float32))
    table = np.sort(np.concatenate(values).astype(np.float32))
    assert table.size == 2**total_bits
    return table


@functools.cache
def qmap(bits: int, signed: bool) -> np.ndarray:
    """torchao's code map for ``bits``-bit state (8 or 4), signed or unsigned: the
    dynamic map of 7 decades (8 bits) or 3 (4 bits, signed); for 4 bits unsigned, the
    linear ``k/16``, ``k = 1..16`` (which has no zero).

    Args:
      bits: 8 or 4.
      signed: the first moment's map (signed) or the second moment's (unsigned).

    Returns:
      The map as a read-only float32 NumPy array (256 or 16 entries, increasing).

    Raises:
      ValueError: ``bits`` is neither 8 nor 4.

    Examples:
      >>> from lucid.functional.torchao import qmap
      >>> qmap(4, signed=False)[:3].tolist(), qmap(8, signed=True).shape
      ([0.0625, 0.125, 0.1875], (256,))
    """
    if bits == 8:
        table = dynamic_map(signed, 7, 8)
    elif bits == 4:
        table = dynamic_map(signed, 3, 4) if signed else linspace32(0.0, 1.0, 17)[1:]
    else:
        raise ValueError(f"torchao's code maps have 8 or 4 bits, not {bits}")
    table = np.array(table, np.float32)
    table.setflags(write=False)
    return table
