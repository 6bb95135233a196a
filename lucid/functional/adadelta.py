"""Adadelta (``torch.optim.Adadelta``).

With ``g`` the gradient (negated when ``maximize``):

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
v_t &= \\rho v_{t-1} + (1-\\rho) g^2 \\\\
\\Delta_t &= \\frac{\\sqrt{u_{t-1} + \\epsilon}}{\\sqrt{v_t + \\epsilon}}\\, g \\\\
u_t &= \\rho u_{t-1} + (1-\\rho) \\Delta_t^2 \\\\
p &\\leftarrow p - \\gamma \\Delta_t
\\end{aligned}
$$

``lr`` (default 1.0) multiplies the delta and the step descends, as in torch
(optax's ``adadelta`` with ``learning_rate=None`` ascends instead).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._apply import is_number, is_zero
from ._math import guard
from ._signature import (
    CAPTURABLE,
    DIFFERENTIABLE,
    FOREACH,
    KEYWORD_ONLY,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from .rule import OptionSpec, Rule

__all__ = [
    "AdadeltaState",
    "adadelta",
]


class AdadeltaState(NamedTuple):
    """The state of torch.optim.Adadelta, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      square_avg: v, the average of the squared gradient.
      acc_delta: u, the average of the squared update.
    """

    step: Any
    square_avg: Any
    acc_delta: Any


def _validate_adadelta(o: dict) -> None:
    _validate.common(o, "Adadelta")
    rho = o["rho"]
    if is_number(rho) and not 0.0 <= rho <= 1.0:
        raise ValueError(f"Invalid rho value: {rho}")
    _validate.non_negative(o["eps"], "epsilon value")
    _validate.non_negative(o["weight_decay"], "weight_decay value")


def _split(o: dict) -> tuple[dict, dict]:
    hyper = {"lr": o["lr"], "rho": o["rho"], "eps": o["eps"], "weight_decay": o["weight_decay"]}
    flags = {
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "maximize": bool(o["maximize"]),
    }
    return hyper, flags


def _init(param, hyper, **_) -> AdadeltaState:
    zeros = jnp.zeros_like(param)
    return AdadeltaState(step=jnp.zeros((), jnp.float32), square_avg=zeros, acc_delta=zeros)


def _update(param, grad, state, h, *, use_weight_decay, maximize):
    g = -grad if maximize else grad
    if use_weight_decay:
        g = g + h["weight_decay"] * param
    rho, one_minus_rho, eps = h["rho"], h["one_minus_rho"], guard(h["eps"])
    square_avg = state.square_avg * rho + one_minus_rho * g * g
    std = jnp.sqrt(square_avg + eps)
    delta = jnp.sqrt(state.acc_delta + eps) / std * g
    acc_delta = state.acc_delta * rho + one_minus_rho * delta * delta
    new_param = param + (-h["lr"]) * delta
    return new_param, AdadeltaState(state.step + 1, square_avg, acc_delta)


ADADELTA = Rule(
    name="Adadelta",
    state=AdadeltaState,
    options=OptionSpec(
        validate=_validate_adadelta,
        split=_split,
        complements=("rho",),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
)


ADADELTA_SIGNATURE = Signature(
    (
        lr(1.0),
        Arg(
            "rho",
            0.9,
            Any,
            "ρ: decay rate of the averages of the squared gradient (v) "
            "and of the squared update (u).",
        ),
        eps(1e-6, "inside both square roots"),
        weight_decay(0),
        FOREACH,
        KEYWORD_ONLY,
        CAPTURABLE,
        MAXIMIZE,
        DIFFERENTIABLE,
    ),
    Example(
        "lr=1.0", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.99679995, -1.9968    ], dtype=float32)"
    ),
)

adadelta = transform_of(
    ADADELTA,
    ADADELTA_SIGNATURE,
    "adadelta",
    "`torch.optim.Adadelta` as an optax transformation.",
)
