"""The two ways the schedules' math is evaluated: Python floats and jax arrays.

Every schedule's formula is written once, as a plain function of the step
count ``t`` and an *ops* object, and evaluated by both layers:

* `PYTHON` -- Python ints and floats in torch's own order of operations.
  The ``lucid.optim.lr_scheduler`` classes use it, so they compute what
  torch's classes compute, in double precision.
* `ArrayOps` -- ``jax.numpy`` in one float dtype, traceable with an
  integer array count, no Python control flow on the count. The functional
  schedules use it.

The ops object supplies the primitives whose accurate evaluation differs
between the two: branch selection, integer powers of a constant, the cosine
bump ``(1 + cos(pi * num / den)) / 2``, the triangle of a cycle and the
anneal between two values. torch's expressions, evaluated in float32, would
lose most of their digits in a few places, so in float32 `ArrayOps`
computes the same quantities another way:

* ``gamma ** k`` as ``exp(k * head) * exp(k * tail)``, ``log(gamma)`` split
  on the host so that ``k * head`` is exact: the float32 rounding of
  ``gamma`` is not raised to the ``k``-th power;
* ``(1 + cos(x)) / 2`` near ``x = pi`` (where ``1 + cos`` cancels) as
  ``sin(pi * u / (2 * den)) ** 2`` with ``u = den - (num mod 2 den)`` formed
  in integers;
* a cycle's triangle from the integer remainder ``t mod size`` (rising
  ``r / up``, falling ``(size - r) / down``) instead of ``1 + t/size -
  floor(1 + t/size)`` and ``(x - 1) / (ratio - 1)``;
* an anneal ``start -> end`` as a lerp that switches ends at weight 0.5
  (torch's CPU ``lerp`` does the same), the weight's complement formed from
  the steps remaining, so the value stays accurate where it approaches a
  tiny ``end`` (OneCycleLR's ``min_lr``).

In float64 `ArrayOps` keeps torch's expressions, so lucid reproduces
the rounding torch's own results carry where they are ill-conditioned (near a
cosine trough, relative to the true cosine it grows like ``1e-17 * T**2``;
at the end of a linear anneal to ``min_lr``, ``1e-11``), not only the exact
value. One guard: XLA turns a division by a constant into a multiplication
by its reciprocal, which breaks ``x / x = 1``; anneals restore it.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Scalar = Any  # a Python number, or a jax array in ArrayOps


class PythonOps:
    """Python numbers, evaluated as torch's lr_scheduler evaluates them."""

    @staticmethod
    def where(cond: Any, if_true: Any, if_false: Any) -> Any:
        return if_true if cond else if_false

    @staticmethod
    def minimum(a: Any, b: Any) -> Any:
        return min(a, b)

    @staticmethod
    def maximum(a: Any, b: Any) -> Any:
        return max(a, b)

    @staticmethod
    def floor_div(a: Any, b: Any) -> Any:
        return a // b

    @staticmethod
    def to_float(x: Any) -> Any:
        return x  # torch mixes ints and floats in its expressions; so do we

    @staticmethod
    def int_power(base: float, k: Any) -> Any:
        """``base ** k`` for an integer count ``k``."""
        return base**k

    @staticmethod
    def power(x: Any, p: float) -> Any:
        return x**p

    @staticmethod
    def cos_bump(num: Any, den: Any) -> Any:
        """``(1 + cos(pi * num / den)) / 2`` (halving is exact, so the product
        with it rounds as torch's ``x * (1 + cos(...)) / 2`` does)."""
        return (1 + math.cos(math.pi * num / den)) / 2

    @staticmethod
    def triangle(t: Any, total_size: float, step_ratio: float, up: Any, down: Any) -> tuple:
        """``(cycle, height)``: the 1-based cycle ``t`` is in, and the triangle's height
        in it (0 at the ends, 1 after ``step_ratio`` of the cycle): torch's CyclicLR."""
        cycle = math.floor(1 + t / total_size)
        x = 1.0 + t / total_size - cycle
        if x <= step_ratio:
            return cycle, x / step_ratio
        return cycle, (x - 1) / (step_ratio - 1)

    @staticmethod
    def anneal(
        start: Any, end: Any, t: Any, start_step: float, end_step: float, strategy: str
    ) -> Any:
        """From ``start`` (at ``start_step``) to ``end`` (at ``end_step``): torch's OneCycleLR
        ``cos`` (``end + (start - end) (1 + cos(pi pct)) / 2``) or ``linear``.

        Every phase is evaluated, so a zero-length one (``pct_start=1.0``'s last
        phase, where torch raises ZeroDivisionError once it is reached) divides by 1.
        """
        pct = (t - start_step) / ((end_step - start_step) or 1.0)
        if strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    @staticmethod
    def count_reached(sorted_points: Sequence[int], t: Any) -> Any:
        """How many of ``sorted_points`` are ``<= t`` (``bisect_right``)."""
        return bisect.bisect_right(sorted_points, t)


PYTHON = PythonOps()


_COMPUTE_DTYPE: contextvars.ContextVar[np.dtype | None] = contextvars.ContextVar(
    "lucid_schedule_dtype", default=None
)


def default_float_dtype() -> np.dtype:
    """The dtype a schedule computes in (read at trace time): the compute dtype of
    the step evaluating it (`computing_in`), else float64 when x64 is
    enabled and float32 otherwise."""
    dtype = _COMPUTE_DTYPE.get()
    if dtype is not None:
        return dtype
    return np.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))


@contextlib.contextmanager
def computing_in(dtype: Any) -> Iterator[None]:
    """Evaluate schedules in ``dtype``: a float32 step computes its learning rate in
    float32 even with x64 enabled, so its program holds no float64 value."""
    token = _COMPUTE_DTYPE.set(np.dtype(dtype))
    try:
        yield
    finally:
        _COMPUTE_DTYPE.reset(token)


def _split_head(value: float, bits: int) -> tuple[float, float]:
    """``value = head + tail`` with ``head`` holding ``bits`` significant bits."""
    if value == 0.0 or not math.isfinite(value):
        return value, 0.0
    mantissa, exponent = math.frexp(value)
    head = math.ldexp(round(math.ldexp(mantissa, bits)), exponent - bits)
    return head, value - head


class ArrayOps:
    """``jax.numpy`` in ``dtype`` (float32 or float64), traceable in the count."""

    def __init__(self, dtype: Any):
        self.dtype = np.dtype(dtype)
        self._mantissa_bits = np.finfo(self.dtype).nmant + 1

    def _number(self, x: Any) -> Any:
        """A Python number as an array of this dtype (float) or int32 (int); under x64 a
        bare Python number would be a float64 or int64 operand of jnp's functions."""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return x
        return jnp.asarray(x, self.dtype if isinstance(x, float) else jnp.int32)

    def where(self, cond: Any, if_true: Any, if_false: Any) -> jax.Array:
        return jnp.where(cond, self._number(if_true), self._number(if_false))

    def minimum(self, a: Any, b: Any) -> jax.Array:
        return jnp.minimum(a, b)

    def maximum(self, a: Any, b: Any) -> jax.Array:
        return jnp.maximum(a, b)

    def floor_div(self, a: Any, b: Any) -> jax.Array:
        return jnp.floor_divide(a, self._number(b))

    def to_float(self, x: Any) -> jax.Array:
        return jnp.asarray(x).astype(self.dtype)

    def int_power(self, base: float, k: Any) -> jax.Array:
        """``base ** k`` for an integer array ``k``, accurate to a few ulps.

        ``base`` is a Python float. Powers of two are exact (``ldexp``);
        otherwise ``exp(k * head) * exp(k * tail)`` with ``log|base|`` split on
        the host so that ``k * head`` is exact for ``k < 2**(mantissa/2)``.
        """
        k = jnp.asarray(k)
        base = float(base)
        if base == 0.0:
            return (k == 0).astype(self.dtype)
        magnitude = abs(base)
        mantissa, exponent = math.frexp(magnitude)
        if mantissa == 0.5:  # an exact power of two
            value = jnp.ldexp(jnp.ones((), self.dtype), (k * (exponent - 1)).astype(jnp.int32))
        else:
            head, tail = _split_head(math.log(magnitude), self._mantissa_bits // 2)
            kf = self.to_float(k)
            value = jnp.exp(kf * head) * jnp.exp(kf * tail)
        if base < 0:
            value = jnp.where(k % 2 == 1, -value, value)
        return value.astype(self.dtype)

    def power(self, x: Any, p: float) -> jax.Array:
        return jnp.power(self.to_float(x), p)

    def cos_bump(self, num: Any, den: Any) -> jax.Array:
        """``(1 + cos(pi * num / den)) / 2``; see the module docstring for float32."""
        if self.dtype == np.float64:
            return (1 + jnp.cos(jnp.pi * self.to_float(num) / den)) / 2
        distance = den - jnp.mod(num, self._number(2 * den))  # in (-den, den], exact
        if isinstance(den, (int, float)):
            angle_per_step = math.pi / (2 * den)  # on the host, in double
        else:
            angle_per_step = jnp.pi / (2 * self.to_float(den))
        half = jnp.sin(self.to_float(distance) * angle_per_step)
        return half * half

    def triangle(
        self, t: Any, total_size: float, step_ratio: float, up: Any, down: Any
    ) -> tuple[jax.Array, jax.Array]:
        """As `PythonOps.triangle`; in integers when ``up`` and ``down`` are whole."""
        t = jnp.asarray(t)
        whole = up is not None and down is not None
        whole = whole and float(up).is_integer() and float(down).is_integer()
        if whole and jnp.issubdtype(t.dtype, jnp.integer):
            size, up = int(up) + int(down), int(up)
            done = jnp.mod(t, self._number(size))
            rising = self.to_float(done) / (up or 1)
            falling = self.to_float(size - done) / ((size - up) or 1)
            cycle = self.to_float(1 + jnp.floor_divide(t, self._number(size)))
            return cycle, jnp.where(done <= up, rising, falling)
        ratio = self.to_float(t) / total_size
        cycle = jnp.floor(1 + ratio)
        x = 1.0 + ratio - cycle
        rising = x / (step_ratio or 1.0)
        falling = (x - 1) / ((step_ratio - 1) or 1.0)
        return cycle, jnp.where(x <= step_ratio, rising, falling)

    def _minus(self, a: Any, b: Any) -> jax.Array:
        """``a - b`` for an array ``a`` and a Python float ``b``, with ``b`` carried as
        head + tail in float32 so that a non-representable ``b`` costs nothing."""
        head = float(np.asarray(b, self.dtype))
        return (self.to_float(a) - head) - (b - head)

    def anneal(
        self, start: Any, end: Any, t: Any, start_step: float, end_step: float, strategy: str
    ) -> jax.Array:
        """As `PythonOps.anneal`; see the module docstring for float32."""
        length = (end_step - start_step) or 1.0  # a zero-length phase is never selected
        done = self._minus(t, start_step)
        if self.dtype == np.float64:
            pct = jnp.where(done == length, self._number(1.0), done / length)  # x/x = 1
            if strategy == "cos":
                return end + (start - end) / 2.0 * (jnp.cos(jnp.pi * pct) + 1)
            return (end - start) * pct + start
        remaining = -self._minus(t, end_step)
        if strategy == "cos":
            toward_end = jnp.sin(done * (math.pi / (2 * length))) ** 2
            toward_start = jnp.sin(remaining * (math.pi / (2 * length))) ** 2
        else:
            toward_end, toward_start = done / length, remaining / length
        return jnp.where(
            toward_end < 0.5,
            start + (end - start) * toward_end,
            end - (end - start) * toward_start,
        )

    def count_reached(self, sorted_points: Sequence[int], t: Any) -> jax.Array:
        if not sorted_points:
            return jnp.zeros_like(jnp.asarray(t))
        t = jnp.asarray(t)
        points = jnp.asarray(list(sorted_points), t.dtype)
        return jnp.sum(points <= t[..., None], axis=-1, dtype=t.dtype)
