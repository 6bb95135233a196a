"""SGD with momentum, dampening, Nesterov and weight decay (``torch.optim.SGD``).

With ``g`` the gradient (negated when ``maximize``):

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
b_1 &= g, \\quad b_t = \\mu b_{t-1} + (1-\\tau) g \\\\
g &\\leftarrow g + \\mu b_t \\text{ (nesterov) or } b_t \\\\
p &\\leftarrow p - \\gamma g
\\end{aligned}
$$

The momentum buffer starts as the raw gradient, without dampening, as in
torch. torch keeps no ``step`` for SGD and creates the buffer at the first
step with momentum; lucid keeps a ``step`` (hidden from the state_dict) and a
zero buffer, and the traced first-step rule ``b = g where step == 0`` picks the
raw gradient, so the first step and every later one are the same program.
Momentum turned on after the state exists starts a new buffer from the next
gradient; turned off, it leaves the buffer untouched (torch's behaviour).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._apply import is_number, is_zero
from ._signature import (
    DIFFERENTIABLE,
    FOREACH,
    FUSED,
    KEYWORD_ONLY,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    lr,
    transform_of,
    weight_decay,
)
from .rule import FieldSpec, OptionSpec, Rule, SparseSpec

__all__ = [
    "SGDState",
    "sgd",
]


class SGDState(NamedTuple):
    """The state of torch.optim.SGD, one entry per parameter (torch's names).

    Attributes:
      step: updates done (lucid only: tells a new momentum buffer from a started one; not in
        the state_dict).
      momentum_buffer: b, the momentum buffer (with `momentum`); else `None`.
    """

    step: Any
    momentum_buffer: Any


def _validate_sgd(o: dict) -> None:
    _validate.common(o, "SGD")
    _validate.non_negative(o["momentum"], "momentum value")
    _validate.non_negative(o["weight_decay"], "weight_decay value")
    momentum, dampening = o["momentum"], o["dampening"]
    if o["nesterov"] and (
        (is_number(momentum) and momentum <= 0) or (is_number(dampening) and dampening != 0)
    ):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


def _split(o: dict) -> tuple[dict, dict]:
    hyper = {
        "lr": o["lr"],
        "momentum": o["momentum"],
        "dampening": o["dampening"],
        "weight_decay": o["weight_decay"],
    }
    flags = {
        "use_momentum": not is_zero(o["momentum"]),
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "nesterov": bool(o["nesterov"]),
        "maximize": bool(o["maximize"]),
    }
    return hyper, flags


def _init(param, hyper, *, use_momentum, **_) -> SGDState:
    buf = jnp.zeros_like(param) if use_momentum else None
    return SGDState(step=jnp.zeros((), jnp.float32), momentum_buffer=buf)


def _start_momentum(state: SGDState, param, flags) -> SGDState:
    """torch creates the buffer at the first step with momentum, from that gradient."""
    if flags["use_momentum"] and state.momentum_buffer is None:
        return SGDState(step=jnp.zeros((), jnp.float32), momentum_buffer=jnp.zeros_like(param))
    return state


def _update(param, grad, state, h, *, use_momentum, use_weight_decay, nesterov, maximize):
    g = -grad if maximize else grad
    if use_weight_decay:
        g = g + h["weight_decay"] * param
    buf = None
    if use_momentum:
        momentum = h["momentum"]
        buf = state.momentum_buffer * momentum + h["one_minus_dampening"] * g
        buf = jnp.where(state.step == 0, g, buf)  # torch's first step: the raw gradient
        g = g + momentum * buf if nesterov else buf
    new_param = param + (-h["lr"]) * g
    return new_param, SGDState(step=state.step + 1, momentum_buffer=buf)


def _update_sparse(param, grad, state, h, **flags):
    """A sparse gradient: torch's sparse path gives the dense path's numbers (absent
    entries add zero; the momentum buffer, sparse in torch, holds the same values)."""
    return _update(param, grad.todense().astype(param.dtype), state, h, **flags)


def _sparse_options(o: dict) -> None:
    """torch's sparse SGD cannot add ``weight_decay * param`` to a sparse gradient."""
    if _validate.scalar(o["weight_decay"], "weight_decay") not in (0, None):
        raise RuntimeError(
            "SGD with weight_decay does not support sparse gradients (torch: add(sparse, "
            "dense) is not supported)"
        )


SGD = Rule(
    name="SGD",
    state=SGDState,
    options=OptionSpec(
        validate=_validate_sgd,
        split=_split,
        complements=("dampening",),
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        optional={"momentum_buffer": "use_momentum"},
        start_optional=_start_momentum,
        hidden={"step": 1.0},
    ),
    sparse=SparseSpec(
        update=_update_sparse,
        check_options=_sparse_options,
    ),
)


SGD_SIGNATURE = Signature(
    (
        lr(1e-3),
        Arg(
            "momentum",
            0,
            Any,
            "μ: momentum factor; the buffer `b ← μ b + (1 - τ) g` starts as the first gradient.",
        ),
        Arg("dampening", 0, Any, "τ: dampening of the gradient added to the momentum buffer."),
        weight_decay(0),
        Arg(
            "nesterov",
            False,
            bool,
            "Nesterov momentum: step along `g + μ b` instead of "
            "`b` (needs a momentum and zero dampening).",
        ),
        KEYWORD_ONLY,
        MAXIMIZE,
        FOREACH,
        DIFFERENTIABLE,
        FUSED,
    ),
    Example(
        "lr=0.1, momentum=0.9", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"
    ),
)

sgd = transform_of(
    SGD,
    SGD_SIGNATURE,
    "sgd",
    """`torch.optim.SGD` as an optax transformation.

    A momentum given as an array or schedule always keeps a buffer (torch decides by
    `momentum != 0`, which a traced value cannot answer).""",
)
