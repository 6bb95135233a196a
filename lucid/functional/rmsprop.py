"""RMSprop, centered or not, with momentum (``torch.optim.RMSprop``).

With ``g`` the gradient (negated when ``maximize``):

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
v_t &= \\alpha v_{t-1} + (1-\\alpha) g^2, \\qquad
\\bar g_t = \\alpha \\bar g_{t-1} + (1-\\alpha) g \\text{ (centered)} \\\\
a_t &= \\sqrt{v_t - \\bar g_t^2} + \\epsilon
    \\quad\\text{or, not centered,}\\quad \\sqrt{v_t} + \\epsilon \\\\
b_t &= \\mu b_{t-1} + g / a_t, \\quad p \\leftarrow p - \\gamma b_t
    \\quad\\text{or, without momentum,}\\quad p \\leftarrow p - \\gamma g / a_t
\\end{aligned}
$$

``eps`` is added outside the square root, and the momentum buffer holds
``g / a_t``: the *current* learning rate multiplies the whole buffer, as in
torch (optax applies momentum after the learning rate).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._apply import is_number, is_zero
from ._math import guard, lerp
from ._signature import (
    CAPTURABLE,
    DIFFERENTIABLE,
    FOREACH,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from .rule import FieldSpec, OptionSpec, Rule

__all__ = [
    "RMSpropState",
    "rmsprop",
]


class RMSpropState(NamedTuple):
    """The state of torch.optim.RMSprop, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      square_avg: v, the average of the squared gradient.
      momentum_buffer: b, the momentum buffer (with `momentum`); else `None`.
      grad_avg: ḡ, the average of the gradient (`centered`); else `None`.
    """

    step: Any
    square_avg: Any
    momentum_buffer: Any
    grad_avg: Any


def _validate_rmsprop(o: dict) -> None:
    _validate.common(o, "RMSprop")
    _validate.non_negative(o["eps"], "epsilon value")
    _validate.non_negative(o["momentum"], "momentum value")
    _validate.non_negative(o["weight_decay"], "weight_decay value")
    _validate.non_negative(o["alpha"], "alpha value")


def _split(o: dict) -> tuple[dict, dict]:
    hyper = {
        "lr": o["lr"],
        "alpha": o["alpha"],
        "eps": o["eps"],
        "weight_decay": o["weight_decay"],
        "momentum": o["momentum"],
    }
    flags = {
        "use_momentum": not (is_number(o["momentum"]) and o["momentum"] <= 0),
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "centered": bool(o["centered"]),
        "maximize": bool(o["maximize"]),
    }
    return hyper, flags


def _init(param, hyper, *, use_momentum, centered, **_) -> RMSpropState:
    zeros = jnp.zeros_like(param)
    return RMSpropState(
        step=jnp.zeros((), jnp.float32),
        square_avg=zeros,
        momentum_buffer=zeros if use_momentum else None,
        grad_avg=zeros if centered else None,
    )


def _update(param, grad, state, h, *, use_momentum, use_weight_decay, centered, maximize):
    g = -grad if maximize else grad
    if use_weight_decay:
        g = g + h["weight_decay"] * param
    square_avg = state.square_avg * h["alpha"] + h["one_minus_alpha"] * g * g
    grad_avg = None
    if centered:
        grad_avg = lerp(state.grad_avg, g, h["one_minus_alpha"])
        avg = jnp.sqrt(square_avg - grad_avg * grad_avg) + guard(h["eps"])
    else:
        avg = jnp.sqrt(square_avg) + guard(h["eps"])
    buf = None
    if use_momentum:
        buf = state.momentum_buffer * h["momentum"] + g / avg
        new_param = param + (-h["lr"]) * buf
    else:
        new_param = param + (-h["lr"]) * g / avg
    return new_param, RMSpropState(state.step + 1, square_avg, buf, grad_avg)


RMSPROP = Rule(
    name="RMSprop",
    state=RMSpropState,
    options=OptionSpec(
        validate=_validate_rmsprop,
        split=_split,
        complements=("alpha",),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        optional={"momentum_buffer": "use_momentum", "grad_avg": "centered"},
    ),
)


RMSPROP_SIGNATURE = Signature(
    (
        lr(1e-2),
        Arg(
            "alpha",
            0.99,
            Any,
            "α: smoothing constant of the average of the squared "
            "gradient (v) and, centered, of the gradient (ḡ).",
        ),
        eps(1e-8, "outside the square root, `√v + ε`"),
        weight_decay(0),
        Arg("momentum", 0, Any, "μ: momentum factor; the buffer holds `g / a_t`."),
        Arg(
            "centered",
            False,
            bool,
            "divide by the estimated standard deviation `√(v - ḡ²)` instead of `√v`.",
        ),
        CAPTURABLE,
        FOREACH,
        MAXIMIZE,
        DIFFERENTIABLE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0., -1.], dtype=float32)"),
)

rmsprop = transform_of(
    RMSPROP,
    RMSPROP_SIGNATURE,
    "rmsprop",
    """`torch.optim.RMSprop` as an optax transformation (none of its arguments
    keyword-only, as in torch).

    A momentum given as an array or schedule always keeps a buffer (torch decides by
    `momentum > 0`, which a traced value cannot answer).""",
)
