"""The nearest code of a scaled value: the two references' rules.

Both count the decision points below the value: the code of ``y`` in a sorted map
``q`` is the number of thresholds ``t_c`` (one between each two consecutive codes)
that ``y`` passes. They differ in the thresholds and in what is compared:

* **bitsandbytes** (`position_table`, `table_index`): ``y`` is first placed on a grid
  of 65536 positions over ``[-1, 1]``, ``k = trunc(((y + 1) / 2) * 65535 + 0.5)``, and
  the code is the number of midpoints ``(q_c + q_{c+1}) / 2`` strictly below
  ``-1 + 2k / 65535`` (a 65536-entry table). So a value within 1/32768 of a midpoint
  may go either way, exactly as bitsandbytes' CPU kernel sends it.
* **torchao** (`thresholds`, `nearest_codes`): the largest ``c`` with ``q_c <= y``
  (code 0 when there is none, NaN included), plus one when
  ``y - q_c >= (q_{c+1} - q_c) * 0.5`` in float32 (ties round up): exactly torchao's
  branchless binary search and rounding.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

POSITIONS = 65536
"""Positions of bitsandbytes' grid over ``[-1, 1]``."""


def position_table(code: np.ndarray) -> np.ndarray:
    """bitsandbytes' table from a grid position to its code: entry ``k`` is the number
    of midpoints of consecutive codes strictly below ``-1 + 2k / 65535`` (float32).

    Args:
      code: a sorted map of at most 256 codes in ``[-1, 1]``.

    Returns:
      A new ``uint8`` array of `POSITIONS` codes (host).

    Examples:
      >>> table = position_table(np.array([-1.0, 0.0, 1.0], np.float32))
      >>> table[[0, 16383, 16384, 32767, 49151, 49152, 65535]].tolist()
      [0, 0, 1, 1, 1, 2, 2]
    """
    code = np.asarray(code, np.float32)
    midpoints = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    grid = (
        np.float32(-1.0)
        + (np.float32(2.0) * np.arange(POSITIONS, dtype=np.float32)) / np.float32(POSITIONS - 1)
    ).astype(np.float32)
    return np.searchsorted(midpoints, grid, side="left").astype(np.uint8)


def table_index(blocks: Array, absmax: Array) -> Array:
    """Where each value of float32 ``blocks`` (one block a row, its absmax in ``absmax``)
    reads bitsandbytes' `position_table`: int32 in ``[0, 65535]``.

    ``y = clip(x * (1 / absmax), -1, 1)``, then ``k = trunc(((y + 1) * 0.5) * 65535 +
    0.5)`` (bitsandbytes' index, a fused multiply-add in its kernel, as XLA emits it on
    the CPU); a NaN and every value of a block of zeros read entry 0, code 0 (each table
    starts with it: code 0 is the map's smallest).
    """
    inverse = (1.0 / absmax)[:, None]
    y = jnp.clip(blocks * inverse, jnp.float32(-1.0), jnp.float32(1.0))
    position = ((y + 1.0) * 0.5) * float(POSITIONS - 1) + 0.5
    bad = jnp.isnan(position) | (absmax[:, None] == 0)
    return jnp.where(bad, jnp.float32(0), position).astype(jnp.int32)


def _ordered(bits: Any) -> Any:
    """float32 bit patterns (int32) as integers in the order of the floats they encode
    (``-0.0`` and ``0.0`` alike); works on NumPy and jax arrays."""
    return _where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _where(condition: Any, a: Any, b: Any) -> Any:
    module = np if isinstance(condition, np.ndarray | np.generic | bool) else jnp
    return module.where(condition, a, b)


def _from_ordered(ordinal: int) -> np.float32:
    bits = ordinal if ordinal >= 0 else (-ordinal) | -(2**31)
    return np.array(bits, np.int32).view(np.float32)[()]


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

    Examples:
      >>> thresholds(np.array([0.0, 0.5, 1.0], np.float32)).tolist()
      [0.25, 0.75]
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


_RANGE = 1.5  # scaled values lie in [-1, 1] (an ulp more after XLA's reciprocal)


@functools.cache
def _lookup(table_bytes: bytes) -> tuple[int, int, np.ndarray]:
    """A bucket table over float32 ordinals for the map whose bytes are given:
    ``(shift, first bucket, rows)``, each row ``(thresholds below the bucket, its first
    threshold, its second)`` (``inf`` for none), with the shift chosen so that no bucket
    holds more than two thresholds."""
    cuts = thresholds(np.frombuffer(table_bytes, np.float32))
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

    Examples:
      >>> import jax.numpy as jnp
      >>> table = np.array([0.0, 0.5, 1.0], np.float32)
      >>> nearest_codes(jnp.array([0.2, 0.25, 0.8, jnp.nan]), table).tolist()
      [0, 1, 2, 0]
    """
    table = np.asarray(table, np.float32)
    if columns and table.size == 16:  # 15 comparisons, vectorized, for a 16-entry map
        return count_thresholds(x, table)
    shift, first, rows = _lookup(table.tobytes())
    index = bucket_index(x, shift, first)
    if columns:
        below, low, high = (
            jnp.take(jnp.asarray(np.ascontiguousarray(rows[:, k])), index, mode="clip")
            for k in range(3)
        )
    else:
        row = jnp.take(jnp.asarray(rows), index, axis=0, mode="clip")
        below, low, high = row[..., 0], row[..., 1], row[..., 2]
    return count_in_bucket(x, below, low, high)


def bucket_table(table: np.ndarray) -> tuple[int, int, np.ndarray]:
    """`nearest_codes`' bucket table of a map: ``(shift, first, rows)``, ``rows`` of
    ``(thresholds below the bucket, its first threshold, its second)`` (``inf`` for
    none), read by `bucket_index` (clipped to the rows) and `count_in_bucket`.

    Examples:
      >>> shift, first, rows = bucket_table(np.array([0.0, 0.5, 1.0], np.float32))
      >>> rows.shape[1], bool(np.isinf(rows[0, 1]))
      (3, True)
    """
    return _lookup(np.asarray(table, np.float32).tobytes())


def bucket_index(x: Array, shift: int, first: int) -> Array:
    """The row of `bucket_table` that holds the thresholds near each float32 value (not
    yet clipped to the table: a reader clips it)."""
    # float32 bounds: a Python float is a float64 operand of jnp.clip's own jit under x64
    bound = np.float32(_RANGE)
    clipped = jnp.clip(x.astype(jnp.float32), -bound, bound)
    ordinal = _ordered(jax.lax.bitcast_convert_type(clipped, jnp.int32))
    return (ordinal >> shift) - first


def count_in_bucket(x: Array, below: Array, low: Array, high: Array) -> Array:
    """The code of each value from its bucket's row: the thresholds below the bucket
    plus those of the bucket at most ``x`` (code 0 for NaN)."""
    count = below + (x >= low) + (x >= high)
    return jnp.where(jnp.isnan(x), 0, count.astype(jnp.int32))


def count_thresholds(x: Array, table: np.ndarray) -> Array:
    """The code of each value as the number of `thresholds` of ``table`` at most ``x``,
    one comparison each (NaN passes none: code 0); for a small map."""
    count = sum((x >= cut).astype(jnp.int32) for cut in thresholds(table))
    return jnp.asarray(count, jnp.int32)
