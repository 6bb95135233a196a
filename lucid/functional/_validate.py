"""Hyper-parameter checks with torch.optim's conditions and wording.

A check only looks at concrete numbers; traced values and schedules are the
caller's responsibility (they cannot be inspected before they run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._rule import is_number


def non_negative(value: Any, what: str) -> None:
    """``ValueError(f"Invalid {what}: {value}")`` unless ``0 <= value`` (torch's form)."""
    if is_number(value) and not value >= 0.0:
        raise ValueError(f"Invalid {what}: {value}")


def positive(value: Any, what: str) -> None:
    """``ValueError(f"Invalid {what}: {value}")`` unless ``0 < value``."""
    if is_number(value) and not value > 0.0:
        raise ValueError(f"Invalid {what}: {value}")


def lr(value: Any) -> None:
    """torch: ``Invalid learning rate: -1.0``."""
    non_negative(value, "learning rate")


def betas(values: Sequence[Any]) -> None:
    """torch: each beta in ``[0, 1)``, ``Invalid beta parameter at index i: b``."""
    if not isinstance(values, Sequence) or len(values) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {values!r}")
    for index, beta in enumerate(values):
        if is_number(beta) and not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")


def pair(values: Any, name: str) -> None:
    """``etas`` / ``step_sizes``: a pair of numbers."""
    if not isinstance(values, Sequence) or len(values) != 2:
        raise ValueError(f"{name} must be a pair, got {values!r}")


def common(options: Mapping[str, Any], name: str) -> None:
    """Checks every optimizer shares: ``lr`` and the ``differentiable`` refusal."""
    lr(options["lr"])
    if options.get("differentiable", False):
        raise ValueError(
            f"{name}(differentiable=True) is not supported: lucid's updates are pure JAX "
            "functions, so differentiate through them with jax.grad instead."
        )
