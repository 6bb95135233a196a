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
import optax

from . import _validate
from ._math import lerp, one_minus_pow
from ._rule import Rule, is_zero, transform


class AdamaxState(NamedTuple):
    step: Any
    exp_avg: Any
    exp_inf: Any


def _validate_adamax(o: dict) -> None:
    _validate.common(o, "Adamax")
    _validate.non_negative(o["eps"], "epsilon value")
    _validate.betas(o["betas"])
    _validate.non_negative(o["weight_decay"], "weight_decay value")


def _split(o: dict) -> tuple[dict, dict]:
    beta1, beta2 = o["betas"]
    hyper = {
        "lr": o["lr"],
        "beta1": beta1,
        "beta2": beta2,
        "eps": o["eps"],
        "weight_decay": o["weight_decay"],
    }
    flags = {
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "maximize": bool(o["maximize"]),
    }
    return hyper, flags


def _init(param, hyper, **_) -> AdamaxState:
    zeros = jnp.zeros_like(param)
    return AdamaxState(step=jnp.zeros((), jnp.float32), exp_avg=zeros, exp_inf=zeros)


def _update(param, grad, state, h, *, use_weight_decay, maximize):
    step = state.step + 1
    t = step.astype(param.dtype)
    g = -grad if maximize else grad
    if use_weight_decay:
        g = g + h["weight_decay"] * param
    exp_avg = lerp(state.exp_avg, g, h["one_minus_beta1"])
    exp_inf = jnp.maximum(state.exp_inf * h["beta2"], jnp.abs(g) + h["eps"])
    clr = h["lr"] / one_minus_pow(h["one_minus_beta1"], t)
    new_param = param + (-clr) * exp_avg / exp_inf
    return new_param, AdamaxState(step, exp_avg, exp_inf)


ADAMAX = Rule(
    name="Adamax",
    state=AdamaxState,
    validate=_validate_adamax,
    split=_split,
    init=_init,
    update=_update,
    complements=("beta1",),
)


def adamax(
    lr: Any = 2e-3,
    betas: tuple[Any, Any] = (0.9, 0.999),
    eps: Any = 1e-8,
    weight_decay: Any = 0,
    foreach: bool | None = None,
    *,
    maximize: bool = False,
    differentiable: bool = False,
    capturable: bool = False,
) -> optax.GradientTransformation:
    """``torch.optim.Adamax`` as an optax transformation (``foreach`` and
    ``capturable`` are accepted and ignored)."""
    return transform(ADAMAX, locals())
