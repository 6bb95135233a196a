"""Multiplicative decays: StepLR, MultiStepLR, ExponentialLR, ConstantLR, LinearLR,
PolynomialLR, LambdaLR, MultiplicativeLR.

torch's ``step()`` reaches each of these (except LambdaLR) by scaling the
group's *current* lr by a per-step factor. With base lr ``b`` the product of
those factors telescopes to the closed forms below, which equal torch's
sequence up to rounding (``lucid.optim.lr_scheduler`` keeps the recursive
step itself, so chaining and edited learning rates behave as in torch):

=================  =========================================================
step_lr            ``b * gamma ** (t // step_size)``
multi_step_lr      ``b * gamma ** #{milestones <= t}`` (a repeated milestone
                   counts twice)
exponential_lr     ``b * gamma ** t``
constant_lr        ``b * factor`` for ``t < total_iters``, then ``b``
linear_lr          ``b * (s + (e - s) * min(t, T) / T)``
polynomial_lr      ``b * ((T - min(t, T)) / T) ** power``
lambda_lr          ``b * lr_lambda(t)``
multiplicative_lr  ``b * prod_{i=1..t} lr_lambda(i)``
=================  =========================================================

When ``total_iters <= 0`` torch's recursion never reaches its end step, so
ConstantLR and LinearLR keep their first factor and PolynomialLR keeps ``b``;
the closed forms here do the same.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._core import Schedule, from_formula
from ._ops import PYTHON, Scalar

# -- formulas shared with lucid.optim.lr_scheduler (ops=PYTHON there) ---------------------


def step_lr_at(t: Any, base_lr: Any, step_size: Any, gamma: float, ops: Any = PYTHON) -> Scalar:
    return base_lr * ops.int_power(gamma, ops.floor_div(t, step_size))


def multi_step_lr_at(
    t: Any, base_lr: Any, milestones: Sequence[int], gamma: float, ops: Any = PYTHON
) -> Scalar:
    """``milestones`` sorted, with repeats (torch's ``Counter.elements()``)."""
    return base_lr * ops.int_power(gamma, ops.count_reached(milestones, t))


def exponential_lr_at(t: Any, base_lr: Any, gamma: float, ops: Any = PYTHON) -> Scalar:
    return base_lr * ops.int_power(gamma, t)


def constant_lr_at(
    t: Any, base_lr: Any, factor: float, total_iters: Any, ops: Any = PYTHON
) -> Scalar:
    if total_iters <= 0:
        return base_lr * factor
    return base_lr * ops.where(t < total_iters, factor, 1.0)


def linear_lr_at(
    t: Any,
    base_lr: Any,
    start_factor: float,
    end_factor: float,
    total_iters: Any,
    ops: Any = PYTHON,
) -> Scalar:
    if total_iters <= 0:
        return base_lr * start_factor
    reached = ops.to_float(ops.minimum(total_iters, t))
    return base_lr * (start_factor + (end_factor - start_factor) * reached / total_iters)


def polynomial_lr_at(
    t: Any, base_lr: Any, total_iters: Any, power: float, ops: Any = PYTHON
) -> Scalar:
    if total_iters <= 0:
        return base_lr
    remaining = ops.to_float(total_iters - ops.minimum(total_iters, t))
    return base_lr * ops.power(remaining / total_iters, power)


# -- validation shared with the classes (torch's conditions and wording) -------------------


def validate_constant_lr(factor: float) -> None:
    if factor > 1.0 or factor < 0:
        raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")


def validate_linear_lr(start_factor: float, end_factor: float) -> None:
    if start_factor > 1.0 or start_factor <= 0:
        raise ValueError(
            "Starting multiplicative factor expected to be greater than 0 and less or equal to 1."
        )
    if end_factor > 1.0 or end_factor < 0:
        raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")


def _require_nonzero(value: Any, name: str) -> None:
    if value == 0:
        raise ValueError(f"{name} must be nonzero (torch divides by it), got {value}")


# -- the functional schedules --------------------------------------------------------------


def step_lr(base_lr: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``torch.optim.lr_scheduler.StepLR``: ``base_lr * gamma ** (count // step_size)``."""
    _require_nonzero(step_size, "step_size")
    return from_formula(lambda t, ops: step_lr_at(t, base_lr, step_size, gamma, ops), "step_lr")


def multi_step_lr(base_lr: float, milestones: Iterable[int], gamma: float = 0.1) -> Schedule:
    """``MultiStepLR``: ``base_lr * gamma ** (number of milestones <= count)``.

    Milestones are a multiset, as torch's ``Counter``: one repeated decays twice.
    Negative milestones are never reached by torch's step() and are dropped.
    """
    points = sorted(int(m) for m in milestones if m >= 0)
    return from_formula(
        lambda t, ops: multi_step_lr_at(t, base_lr, points, gamma, ops), "multi_step_lr"
    )


def exponential_lr(base_lr: float, gamma: float) -> Schedule:
    """``ExponentialLR``: ``base_lr * gamma ** count``."""
    return from_formula(lambda t, ops: exponential_lr_at(t, base_lr, gamma, ops), "exponential_lr")


def constant_lr(base_lr: float, factor: float = 1.0 / 3, total_iters: int = 5) -> Schedule:
    """``ConstantLR``: ``base_lr * factor`` until ``total_iters``, then ``base_lr``."""
    validate_constant_lr(factor)
    return from_formula(
        lambda t, ops: constant_lr_at(t, base_lr, factor, total_iters, ops), "constant_lr"
    )


def linear_lr(
    base_lr: float,
    start_factor: float = 1.0 / 3,
    end_factor: float = 1.0,
    total_iters: int = 5,
) -> Schedule:
    """``LinearLR``: the factor moves linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` steps, then stays."""
    validate_linear_lr(start_factor, end_factor)
    return from_formula(
        lambda t, ops: linear_lr_at(t, base_lr, start_factor, end_factor, total_iters, ops),
        "linear_lr",
    )


def polynomial_lr(base_lr: float, total_iters: int = 5, power: float = 1.0) -> Schedule:
    """``PolynomialLR``: ``base_lr * (1 - min(count, total_iters) / total_iters) ** power``."""
    return from_formula(
        lambda t, ops: polynomial_lr_at(t, base_lr, total_iters, power, ops), "polynomial_lr"
    )


def lambda_lr(base_lr: float, lr_lambda: Callable[[jax.Array], Any]) -> Schedule:
    """``LambdaLR``: ``base_lr * lr_lambda(count)``.

    ``lr_lambda`` receives the integer count array and must be traceable
    (jnp operations, no Python branching on the count).
    """
    return from_formula(lambda t, ops: base_lr * ops.to_float(lr_lambda(t)), "lambda_lr")


def multiplicative_lr(base_lr: float, lr_lambda: Callable[[jax.Array], Any]) -> Schedule:
    """``MultiplicativeLR``: ``base_lr * prod_{i=1..count} lr_lambda(i)``.

    torch multiplies the current lr by ``lr_lambda(epoch)`` at every step
    after construction; with an arbitrary lambda there is no closed form, so
    the product is a ``fori_loop`` of ``count`` iterations (traceable, O(count)).
    ``lr_lambda`` receives the integer step index and must be traceable. A
    lambda that returns a plain number (a constant factor) is ``gamma**count``,
    evaluated as ExponentialLR is; otherwise float32 accumulates the rounding
    of each factor (``count`` times float32's epsilon, relative, at worst).
    """

    def formula(t: jax.Array, ops: Any) -> jax.Array:
        probe = lr_lambda(jnp.ones_like(t))
        if isinstance(probe, numbers.Real):  # a constant factor: no loop, no drift
            return base_lr * ops.int_power(float(probe), t)

        def body(i: jax.Array, product: jax.Array) -> jax.Array:
            return product * ops.to_float(lr_lambda(i))

        def product_up_to(count: jax.Array) -> jax.Array:
            start = jnp.ones((), ops.dtype)
            return jax.lax.fori_loop(jnp.ones_like(count), count + 1, body, start)

        if t.ndim:
            return base_lr * jax.vmap(product_up_to)(t.ravel()).reshape(t.shape)
        return base_lr * product_up_to(t)

    return from_formula(formula, "multiplicative_lr")
