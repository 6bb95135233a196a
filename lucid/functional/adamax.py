"""Adamax, Adam with the infinity norm (``torch.optim.Adamax``).

With ``g`` the gradient (negated when ``maximize``) and ``t`` the step:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
m_t &= \\beta_1 m_{t-1} + (1-\\beta_1) g \\\\
u_t &= \\max(\\beta_2 u_{t-1},\\; |g| + \\epsilon) \\\\
p &\\leftarrow p - \\frac{\\gamma}{1-\\beta_1^t}\\, \\frac{m_t}{u_t}
\\end{aligned}
$$

``eps`` sits inside the maximum and only the first moment is bias-corrected,
as in torch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from ._adam_family import decayed, split_adam_family, validate_adam_family
from ._math import guard, lerp, one_minus_pow
from ._signature import (
    CAPTURABLE,
    DIFFERENTIABLE,
    FOREACH,
    KEYWORD_ONLY,
    MAXIMIZE,
    Example,
    Signature,
    betas,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from .rule import OptionSpec, Rule

__all__ = [
    "AdamaxState",
    "adamax",
]


class AdamaxState(NamedTuple):
    """The state of torch.optim.Adamax, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      exp_avg: m, the average of the gradient.
      exp_inf: u, the exponentially weighted infinity norm.
    """

    step: Any
    exp_avg: Any
    exp_inf: Any


def _split(o: dict) -> tuple[dict, dict]:
    return split_adam_family(o)


def _init(param, hyper, **_) -> AdamaxState:
    zeros = jnp.zeros_like(param)
    return AdamaxState(step=jnp.zeros((), jnp.float32), exp_avg=zeros, exp_inf=zeros)


def _update(param, grad, state, h, *, use_weight_decay, maximize):
    step = state.step + 1
    t = step.astype(param.dtype)
    param, g = decayed(
        param, grad, h, maximize=maximize, use_weight_decay=use_weight_decay, decoupled=False
    )
    exp_avg = lerp(state.exp_avg, g, h["one_minus_beta1"])
    exp_inf = jnp.maximum(state.exp_inf * h["beta2"], jnp.abs(g) + guard(h["eps"]))
    clr = h["lr"] / one_minus_pow(h["one_minus_beta1"], t)
    new_param = param + (-clr) * exp_avg / exp_inf
    return new_param, AdamaxState(step, exp_avg, exp_inf)


ADAMAX = Rule(
    name="Adamax",
    state=AdamaxState,
    options=OptionSpec(
        validate=lambda o: validate_adam_family(o, "Adamax"),
        split=_split,
        complements=("beta1",),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
)


ADAMAX_SIGNATURE = Signature(
    (
        lr(2e-3),
        betas(
            (0.9, 0.999),
            "(β₁, β₂): decay rates of the gradient's average (m) and of the infinity norm (u).",
        ),
        eps(1e-8, "to `|g|` inside the infinity norm"),
        weight_decay(0),
        FOREACH,
        KEYWORD_ONLY,
        MAXIMIZE,
        DIFFERENTIABLE,
        CAPTURABLE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
)

adamax = transform_of(
    ADAMAX,
    ADAMAX_SIGNATURE,
    "adamax",
    "`torch.optim.Adamax` as an optax transformation.",
)
