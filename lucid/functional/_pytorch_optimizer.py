"""The checks ``pytorch_optimizer``'s constructors make, in its words and exception types.

The ``pytorch-optimizer`` package (the reference of `lucid.optim.SOAP` and
`lucid.optim.Shampoo`) checks its options with ``BaseOptimizer.validate_*``: a negative
learning rate is its ``NegativeLRError``, a step count below one its
``NegativeStepError``, every other bad value a ``ValueError``. lucid raises the same
messages; its two exception classes carry the package's names and are ``ValueError``\\ s
(as every bad value is in lucid), so ``except ValueError`` catches all of them.
"""

from __future__ import annotations

from typing import Any

from ._apply import is_number

__all__ = ["NegativeLRError", "NegativeStepError"]


class NegativeLRError(ValueError):
    """A negative learning rate (``pytorch_optimizer``'s ``NegativeLRError``).

    Examples:
      >>> str(NegativeLRError(-1.0))
      'learning rate must be positive. (-1.0 > 0)'
    """

    def __init__(self, lr: Any, lr_type: str = "") -> None:
        note = lr_type or "learning rate"
        super().__init__(f"{note} must be positive. ({lr} > 0)")


class NegativeStepError(ValueError):
    """A step count below one (``pytorch_optimizer``'s ``NegativeStepError``).

    Examples:
      >>> str(NegativeStepError(0, "preconditioning_compute_steps"))
      'preconditioning_compute_steps must be positive. (0 > 0)'
    """

    def __init__(self, num_steps: Any, step_type: str = "") -> None:
        note = step_type or "step"
        super().__init__(f"{note} must be positive. ({num_steps} > 0)")


def learning_rate(lr: Any) -> None:
    """``validate_learning_rate``: ``NegativeLRError`` for a negative number."""
    if is_number(lr) and lr < 0.0:
        raise NegativeLRError(lr)


def in_range(x: Any, name: str, low: float, high: float) -> None:
    """``validate_range(..., '[)')``: ``low <= x < high``."""
    if is_number(x) and not low <= x < high:
        raise ValueError(f"{name} must be in the range [{low}, {high})")


def non_negative(x: Any, name: str) -> None:
    """``validate_non_negative``: ``None`` passes, a negative number does not."""
    if is_number(x) and x < 0.0:
        raise ValueError(f"{name} must be non-negative")


def positive(x: Any, name: str) -> None:
    """``validate_positive``: zero or a negative number does not pass."""
    if is_number(x) and x <= 0:
        raise ValueError(f"{name} must be positive")


def step_count(x: Any, name: str) -> None:
    """``validate_step``: ``NegativeStepError`` below one."""
    if is_number(x) and x < 1:
        raise NegativeStepError(x, name)


def integer(x: Any, name: str) -> None:
    """A count lucid needs as a whole number (the package takes any number and fails, or
    counts differently, later)."""
    if not (is_number(x) and float(x) == int(x)):
        raise TypeError(f"{name} must be a whole number, got {x!r}")
