"""Adam and AdamW, with AMSGrad (``torch.optim.Adam``, ``torch.optim.AdamW``).

With ``g`` the gradient (negated when ``maximize``) and ``t`` the step:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p
    \\quad\\text{or, decoupled,}\\quad p \\leftarrow p(1 - \\gamma\\lambda) \\\\
m_t &= \\beta_1 m_{t-1} + (1-\\beta_1) g, \\qquad
v_t = \\beta_2 v_{t-1} + (1-\\beta_2) g^2 \\\\
\\hat v_t &= \\max(\\hat v_{t-1}, v_t) \\text{ (amsgrad, on the raw moment)} \\\\
p &\\leftarrow p - \\frac{\\gamma}{1-\\beta_1^t}\\,
    \\frac{m_t}{\\sqrt{v_t}/\\sqrt{1-\\beta_2^t} + \\epsilon}
\\end{aligned}
$$

``eps`` is added after the bias correction of ``sqrt(v)``, and AMSGrad keeps
the maximum of the *uncorrected* second moment, as torch does (optax's
``amsgrad`` differs in both). AdamW is Adam with
``decoupled_weight_decay=True`` and a default ``weight_decay`` of 1e-2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp
import optax

from . import _validate
from ._math import lerp, one_minus_pow
from ._rule import Rule, is_zero, transform


class AdamState(NamedTuple):
    step: Any
    exp_avg: Any
    exp_avg_sq: Any
    max_exp_avg_sq: Any  # None unless amsgrad


def validate_adam_family(o: dict, name: str) -> None:
    """torch's checks for Adam-like optimizers: lr, eps, betas, weight_decay."""
    _validate.common(o, name)
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
        "amsgrad": bool(o["amsgrad"]),
        "maximize": bool(o["maximize"]),
        "decoupled_weight_decay": bool(o["decoupled_weight_decay"]),
        "use_weight_decay": not is_zero(o["weight_decay"]),
    }
    return hyper, flags


def _init(param, hyper, *, amsgrad, **_) -> AdamState:
    zeros = jnp.zeros_like(param)
    return AdamState(
        step=jnp.zeros((), jnp.float32),
        exp_avg=zeros,
        exp_avg_sq=zeros,
        max_exp_avg_sq=zeros if amsgrad else None,
    )


def _update(param, grad, state, h, *, amsgrad, maximize, decoupled_weight_decay, use_weight_decay):
    step = state.step + 1
    t = step.astype(param.dtype)
    lr = h["lr"]
    g = -grad if maximize else grad
    if use_weight_decay:
        if decoupled_weight_decay:
            param = param * (1 - lr * h["weight_decay"])
        else:
            g = g + h["weight_decay"] * param
    exp_avg = lerp(state.exp_avg, g, h["one_minus_beta1"])
    exp_avg_sq = state.exp_avg_sq * h["beta2"] + h["one_minus_beta2"] * g * g
    step_size = lr / one_minus_pow(h["one_minus_beta1"], t)
    bias_correction2_sqrt = jnp.sqrt(one_minus_pow(h["one_minus_beta2"], t))
    max_exp_avg_sq = None
    second_moment = exp_avg_sq
    if amsgrad:
        max_exp_avg_sq = jnp.maximum(state.max_exp_avg_sq, exp_avg_sq)
        second_moment = max_exp_avg_sq
    denom = jnp.sqrt(second_moment) / bias_correction2_sqrt + h["eps"]
    new_param = param + (-step_size) * exp_avg / denom
    return new_param, AdamState(step, exp_avg, exp_avg_sq, max_exp_avg_sq)


ADAM = Rule(
    name="Adam",
    state=AdamState,
    validate=lambda o: validate_adam_family(o, "Adam"),
    split=_split,
    init=_init,
    update=_update,
    complements=("beta1", "beta2"),
)
ADAMW = dataclasses.replace(ADAM, name="AdamW", validate=lambda o: validate_adam_family(o, "AdamW"))


def adam(
    lr: Any = 1e-3,
    betas: tuple[Any, Any] = (0.9, 0.999),
    eps: Any = 1e-8,
    weight_decay: Any = 0,
    amsgrad: bool = False,
    *,
    foreach: bool | None = None,
    maximize: bool = False,
    capturable: bool = False,
    differentiable: bool = False,
    fused: bool | None = None,
    decoupled_weight_decay: bool = False,
) -> optax.GradientTransformation:
    """``torch.optim.Adam`` as an optax transformation (``foreach``, ``capturable``
    and ``fused`` are accepted and ignored)."""
    return transform(ADAM, locals())


def adamw(
    lr: Any = 1e-3,
    betas: tuple[Any, Any] = (0.9, 0.999),
    eps: Any = 1e-8,
    weight_decay: Any = 1e-2,
    amsgrad: bool = False,
    *,
    maximize: bool = False,
    foreach: bool | None = None,
    capturable: bool = False,
    differentiable: bool = False,
    fused: bool | None = None,
) -> optax.GradientTransformation:
    """``torch.optim.AdamW``: Adam with decoupled weight decay (default 1e-2)."""
    return transform(ADAMW, {**locals(), "decoupled_weight_decay": True})
