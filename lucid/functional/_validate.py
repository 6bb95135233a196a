"""Hyper-parameter checks with torch.optim's conditions and wording.

Every hyper-parameter goes through `scalar` first: a real number (Python
or NumPy) or a one-element array (jax, NumPy or torch) is checked by value; a
multi-element array is torch's ``ValueError``; anything else (a string,
``None``, a list, a complex value) is a ``TypeError`` naming the argument.
Schedules (where the caller allows them) and traced arrays cannot be inspected
before they run: their type and size are checked, their value is not.
"""

from __future__ import annotations

import inspect
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import is_array, is_torch_tensor

_NOT_CONCRETE = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError)


def scalar(value: Any, what: str, *, schedules: bool = True) -> float | None:
    """The value of a real scalar hyper-parameter; ``None`` for a schedule or a traced
    array (value unknown until it runs).

    Raises:
      TypeError: ``value`` is not a real number, a real array or (with ``schedules``)
        a schedule; the message names ``what``.
      ValueError: ``value`` is an array of more than one element (torch's
        ``Tensor lr must be 1-element``).
    """
    if type(value) is float or type(value) is int:  # the common case, first
        return value
    if isinstance(value, numbers.Real):  # bool, NumPy scalars, fractions: torch compares them
        return float(value)
    if is_array(value):
        dtype = value.dtype
        if is_torch_tensor(value):
            real = not dtype.is_complex
            size = value.numel()
        else:
            real = any(jnp.issubdtype(dtype, kind) for kind in (jnp.floating, jnp.integer, bool))
            size = int(np.prod(np.shape(value)))
        if not real:
            raise TypeError(f"{what} must be a real number, but got an array of dtype {dtype}")
        if size != 1:
            raise ValueError(
                f"Tensor {what} must be 1-element, but got an array of shape "
                f"{tuple(np.shape(value))}"
            )
        if is_torch_tensor(value):
            return float(value.detach().reshape(()).item())
        try:
            return float(np.asarray(value).reshape(()))
        except _NOT_CONCRETE:
            return None
    if callable(value):
        if schedules:
            return None
        raise TypeError(
            f"{what} must be a real number or a one-element array, but got a "
            f"{type(value).__name__}: schedules belong to lucid.functional; with lucid.optim "
            "use an lr_scheduler"
        )
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise TypeError(
        f"{what} must be a real number or a one-element array, but got "
        f"{type(value).__name__}: {shown}"
    )


def non_negative(value: Any, what: str) -> None:
    """``ValueError(f"Invalid {what}: {value}")`` unless ``0 <= value`` (torch's form)."""
    number = scalar(value, what)
    if number is not None and not number >= 0.0:
        raise ValueError(f"Invalid {what}: {_shown(value, number)}")


def positive(value: Any, what: str, name: str | None = None) -> None:
    """``ValueError(f"Invalid {what}: {value}")`` unless ``0 < value``; a multi-element
    array is ``Tensor {name} must be 1-element`` (``name`` defaults to ``what``)."""
    number = scalar(value, name or what)
    if number is not None and not number > 0.0:
        raise ValueError(f"Invalid {what}: {_shown(value, number)}")


def lr(value: Any) -> None:
    """torch: ``Invalid learning rate: -1.0``; a multi-element array:
    ``Tensor lr must be 1-element``."""
    number = scalar(value, "lr")
    if number is not None and not number >= 0.0:
        raise ValueError(f"Invalid learning rate: {_shown(value, number)}")


def betas(values: Any) -> None:
    """torch: each beta in ``[0, 1)``, ``Invalid beta parameter at index i: b``."""
    check_pair(values, "betas")
    for index, beta in enumerate(values):
        number = scalar(beta, f"betas[{index}]")
        if number is not None and not 0.0 <= number < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {_shown(beta, number)}")


def check_pair(values: Any, name: str) -> None:
    """``betas``, ``etas``, ``step_sizes``: a pair (tuple or list) of scalars.

    Raises:
      TypeError: not a tuple or list (a string, a number, an array, ``None``).
      ValueError: a tuple or list whose length is not 2.
    """
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise TypeError(f"{name} must be a pair of numbers, but got {type(values).__name__}")
    if len(values) != 2:
        raise ValueError(f"{name} must be a pair, got {values!r}")
    for index, value in enumerate(values):
        scalar(value, f"{name}[{index}]")


def pair(values: Any, name: str) -> None:
    """``etas`` / ``step_sizes``: a pair of numbers."""
    check_pair(values, name)


def hypers(hyper: Mapping[str, Any], *, schedules: bool) -> None:
    """Every float hyper-parameter of a split group is a real scalar (or a schedule,
    where ``schedules``): catches those torch does not range-check (``dampening``)."""
    for name, value in hyper.items():
        if type(value) is not float:
            scalar(value, name, schedules=schedules)


# float32's smallest normal number: XLA flushes anything smaller (but zero) to zero
FLOAT32_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
_SMALLEST_SHOWN = str(np.float32(FLOAT32_SMALLEST_NORMAL))  # 1.1754944e-38


def flushed(options: Mapping[str, Any], name: str, guarded: Iterable[str] = ()) -> None:
    """``UserWarning`` for every hyper-parameter XLA would flush to zero: a nonzero
    value below float32's smallest normal number (1.1754944e-38).

    XLA on the CPU flushes subnormal numbers to zero in arithmetic (float32, and
    float64 below its own smallest normal), where torch computes with them, so such a
    value acts as 0. ``guarded`` names the options the rule keeps at the
    smallest normal instead (a guard like ``eps``, which then gives torch's numbers);
    they need no warning. A pair's elements are named ``betas[0]``.
    """
    skip = set(guarded)
    for key, value in options.items():
        items = (
            [(f"{key}[{i}]", v) for i, v in enumerate(value)]
            if isinstance(value, tuple | list)
            else [(key, value)]
        )
        for label, item in items:
            if key in ("params", "param_names") or label in skip:
                continue
            if isinstance(item, bool | str) or item is None:
                continue
            try:
                number = scalar(item, label, schedules=True)
            except (TypeError, ValueError):  # not a scalar: the value checks say so
                continue
            if number is not None and 0.0 < abs(number) < FLOAT32_SMALLEST_NORMAL:
                warnings.warn(
                    f"{name}: {label}={number!r} is below float32's smallest normal number "
                    f"({_SMALLEST_SHOWN}); XLA flushes such subnormal numbers to zero, so in "
                    "float32 arithmetic lucid computes with 0 where torch "
                    f"computes with {number!r}",
                    UserWarning,
                    stacklevel=caller_outside_lucid(),
                )


def caller_outside_lucid() -> int:
    """The ``stacklevel`` (seen from the function that calls this one and then
    ``warnings.warn``) of the first frame outside the lucid package: the user's line that
    made the transform, optimizer or group."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    here = inspect.currentframe()
    frame, level = (here.f_back if here is not None else None), 1  # flushed's frame
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def common(options: Mapping[str, Any], name: str) -> None:
    """Checks every optimizer shares: ``lr`` and the ``differentiable`` refusal."""
    lr(options["lr"])
    if options.get("differentiable", False):
        raise ValueError(
            f"{name}(differentiable=True) is not supported: lucid's updates are pure JAX "
            "functions, so differentiate through them with jax.grad instead."
        )


def _shown(value: Any, number: float) -> Any:
    """How torch's message shows a value: the number itself, an array as its float."""
    return value if isinstance(value, numbers.Real) else number
