"""Multiplicative decays: StepLR, MultiStepLR, ExponentialLR, ConstantLR, LinearLR,
PolynomialLR, LambdaLR, MultiplicativeLR.

torch's `step()` reaches each of these (except LambdaLR) by scaling the
group's *current* lr by a per-step factor. With base lr `b` the product of
those factors telescopes to the closed forms below, which equal torch's
sequence up to rounding (`lucid.optim.lr_scheduler` keeps the recursive
step itself, so chaining and edited learning rates behave as in torch):

| schedule | lr after `t` steps |
| --- | --- |
| `step_lr` | `b * gamma ** (t // step_size)` |
| `multi_step_lr` | `b * gamma ** #{milestones <= t}` (a repeated milestone counts twice) |
| `exponential_lr` | `b * gamma ** t` |
| `constant_lr` | `b * factor` for `t < total_iters`, then `b` |
| `linear_lr` | `b * (s + (e - s) * min(t, T) / T)` |
| `polynomial_lr` | `b * ((T - min(t, T)) / T) ** power` |
| `lambda_lr` | `b * lr_lambda(t)` |
| `multiplicative_lr` | `b * prod_{i=1..t} lr_lambda(i)` |

When `total_iters <= 0` torch's recursion never reaches its end step, so
ConstantLR and LinearLR keep their first factor and PolynomialLR keeps `b`;
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

__all__ = [
    "constant_lr",
    "exponential_lr",
    "lambda_lr",
    "linear_lr",
    "multi_step_lr",
    "multiplicative_lr",
    "polynomial_lr",
    "step_lr",
]

# -- formulas shared with lucid.optim.lr_scheduler (ops=PYTHON there) ---------------------


def step_lr_at(t: Any, base_lr: Any, step_size: Any, gamma: float, ops: Any = PYTHON) -> Scalar:
    return base_lr * ops.int_power(gamma, ops.floor_div(t, step_size))


def multi_step_lr_at(
    t: Any, base_lr: Any, milestones: Sequence[int], gamma: float, ops: Any = PYTHON
) -> Scalar:
    """`milestones` sorted, with repeats (torch's `Counter.elements()`)."""
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
    """torch's `StepLR` as a function: decay by `gamma` every `step_size` steps.

    $$
    \\eta(t) = b \\, \\gamma^{\\lfloor t / \\text{step\\_size} \\rfloor}
    $$

    Args:
      base_lr: the lr $b$ at the start (torch: the group's `initial_lr`).
      step_size: the period of the decay, in steps (nonzero).
      gamma: the factor $\\gamma$ of each decay.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: `step_size` is 0.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.step_lr(1.0, step_size=2, gamma=0.5)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    """
    _require_nonzero(step_size, "step_size")
    return from_formula(lambda t, ops: step_lr_at(t, base_lr, step_size, gamma, ops), "step_lr")


def multi_step_lr(base_lr: float, milestones: Iterable[int], gamma: float = 0.1) -> Schedule:
    """torch's `MultiStepLR` as a function: decay by `gamma` at each milestone.

    $$
    \\eta(t) = b \\, \\gamma^{\\#\\{m \\in \\text{milestones} : m \\le t\\}}
    $$

    Milestones are a multiset, as torch's `Counter`: one repeated decays
    twice. Negative milestones are never reached by torch's `step()` and are
    dropped.

    Args:
      base_lr: the lr $b$ at the start.
      milestones: the steps at which the lr decays (any order).
      gamma: the factor $\\gamma$ of each decay.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.multi_step_lr(1.0, milestones=[2, 4, 4], gamma=0.5)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [1.0, 1.0, 0.5, 0.5, 0.125, 0.125]
    """
    points = sorted(int(m) for m in milestones if m >= 0)
    return from_formula(
        lambda t, ops: multi_step_lr_at(t, base_lr, points, gamma, ops), "multi_step_lr"
    )


def exponential_lr(base_lr: float, gamma: float) -> Schedule:
    """torch's `ExponentialLR` as a function: decay by `gamma` every step.

    $\\eta(t) = b \\, \\gamma^{t}$.

    Args:
      base_lr: the lr $b$ at the start.
      gamma: the factor $\\gamma$ of each step's decay.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.exponential_lr(1.0, gamma=0.5)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [1.0, 0.5, 0.25, 0.125, 0.0625, 0.0312]
    """
    return from_formula(lambda t, ops: exponential_lr_at(t, base_lr, gamma, ops), "exponential_lr")


def constant_lr(base_lr: float, factor: float = 1.0 / 3, total_iters: int = 5) -> Schedule:
    """torch's `ConstantLR` as a function: a constant `factor` for `total_iters` steps.

    $$
    \\eta(t) = \\begin{cases} b \\cdot \\text{factor} & t < \\text{total\\_iters} \\\\
    b & t \\ge \\text{total\\_iters} \\end{cases}
    $$

    Args:
      base_lr: the lr $b$ after the constant phase.
      factor: the factor, in $[0, 1]$.
      total_iters: the number of steps the factor lasts (with `<= 0`, it
        lasts for ever, as torch's recursion never reaches its end).

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: `factor` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.constant_lr(1.0, factor=0.5, total_iters=3)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]
    """
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
    """torch's `LinearLR` as a function: a linear factor from `start_factor` to `end_factor`.

    $$
    \\eta(t) = b \\left(s + (e - s) \\frac{\\min(t, T)}{T}\\right)
    $$

    Args:
      base_lr: the lr $b$ the factors multiply.
      start_factor: the factor $s$ at step 0, in $(0, 1]$.
      end_factor: the factor $e$ from step `total_iters` on, in $[0, 1]$.
      total_iters: the number of steps $T$ the factor takes to reach $e$
        (with `<= 0`, the factor stays $s$, as in torch).

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Raises:
      ValueError: `start_factor` outside $(0, 1]$ or `end_factor` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.linear_lr(1.0, start_factor=0.25, total_iters=3)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    """
    validate_linear_lr(start_factor, end_factor)
    return from_formula(
        lambda t, ops: linear_lr_at(t, base_lr, start_factor, end_factor, total_iters, ops),
        "linear_lr",
    )


def polynomial_lr(base_lr: float, total_iters: int = 5, power: float = 1.0) -> Schedule:
    """torch's `PolynomialLR` as a function: a polynomial decay to zero over `total_iters` steps.

    $$
    \\eta(t) = b \\left(1 - \\frac{\\min(t, T)}{T}\\right)^{p}
    $$

    Args:
      base_lr: the lr $b$ at the start.
      total_iters: the number of steps $T$ the decay takes (with `<= 0` the
        lr stays $b$, as in torch).
      power: the power $p$ of the polynomial (1: linear).

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.polynomial_lr(1.0, total_iters=4, power=2.0)
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [1.0, 0.5625, 0.25, 0.0625, 0.0, 0.0]
    """
    return from_formula(
        lambda t, ops: polynomial_lr_at(t, base_lr, total_iters, power, ops), "polynomial_lr"
    )


def lambda_lr(base_lr: float, lr_lambda: Callable[[jax.Array], Any]) -> Schedule:
    """torch's `LambdaLR` as a function: the base lr times a function of the step.

    $\\eta(t) = b \\, \\lambda(t)$.

    Args:
      base_lr: the lr $b$ the factor multiplies.
      lr_lambda: $\\lambda$, given the integer count array; it must be
        traceable (jnp operations, no Python branching on the count).

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.lambda_lr(1.0, lambda t: 1.0 / (1 + t))
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [1.0, 0.5, 0.3333, 0.25, 0.2, 0.1667]
    """
    return from_formula(lambda t, ops: base_lr * ops.to_float(lr_lambda(t)), "lambda_lr")


def multiplicative_lr(base_lr: float, lr_lambda: Callable[[jax.Array], Any]) -> Schedule:
    """torch's `MultiplicativeLR` as a function: the product of a function's factors.

    $$
    \\eta(t) = b \\prod_{i=1}^{t} \\lambda(i)
    $$

    torch multiplies the current lr by `lr_lambda(epoch)` at every step
    after construction; with an arbitrary lambda there is no closed form, so
    the product is a `fori_loop` of `count` iterations (traceable, O(count)).
    A lambda that returns a plain number (a constant factor) is
    $\\gamma^{t}$, evaluated as `exponential_lr` is; otherwise float32
    accumulates the rounding of each factor (`count` times float32's
    epsilon, relative, at worst).

    Args:
      base_lr: the lr $b$ at the start.
      lr_lambda: $\\lambda$, given the integer step index $i$ (an array); it
        must be traceable.

    Returns:
      A [Schedule][lucid.functional.schedules.Schedule], `count -> lr`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> schedule = LF.schedules.multiplicative_lr(1.0, lambda i: 1.0 / (1 + i))
      >>> [round(lr, 4) for lr in schedule(jnp.arange(6)).tolist()]
      [1.0, 0.5, 0.1667, 0.0417, 0.0083, 0.0014]
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
