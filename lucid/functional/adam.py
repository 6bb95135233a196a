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

from ._adam_family import decayed, moments, split_adam_family, validate_adam_family
from ._math import guard, one_minus_pow
from ._signature import (
    CAPTURABLE,
    DECOUPLED_WEIGHT_DECAY,
    DIFFERENTIABLE,
    FOREACH,
    FUSED,
    KEYWORD_ONLY,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    betas,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from .rule import FieldSpec, OptionSpec, Rule

__all__ = [
    "AdamState",
    "adam",
    "adamw",
]


class AdamState(NamedTuple):
    """The state of torch.optim.Adam and AdamW, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      exp_avg: m, the average of the gradient.
      exp_avg_sq: v, the average of the squared gradient.
      max_exp_avg_sq: the running maximum of v (`amsgrad`); else `None`.
    """

    step: Any
    exp_avg: Any
    exp_avg_sq: Any
    max_exp_avg_sq: Any


def _split(o: dict) -> tuple[dict, dict]:
    return split_adam_family(o, flags=("amsgrad", "decoupled_weight_decay"))


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
    param, g = decayed(
        param,
        grad,
        h,
        maximize=maximize,
        use_weight_decay=use_weight_decay,
        decoupled=decoupled_weight_decay,
    )
    exp_avg, exp_avg_sq = moments(state.exp_avg, state.exp_avg_sq, g, h)
    step_size = lr / one_minus_pow(h["one_minus_beta1"], t)
    bias_correction2_sqrt = jnp.sqrt(one_minus_pow(h["one_minus_beta2"], t))
    max_exp_avg_sq = None
    second_moment = exp_avg_sq
    if amsgrad:
        max_exp_avg_sq = jnp.maximum(state.max_exp_avg_sq, exp_avg_sq)
        second_moment = max_exp_avg_sq
    denom = jnp.sqrt(second_moment) / bias_correction2_sqrt + guard(h["eps"])
    new_param = param + (-step_size) * exp_avg / denom
    return new_param, AdamState(step, exp_avg, exp_avg_sq, max_exp_avg_sq)


ADAM = Rule(
    name="Adam",
    state=AdamState,
    options=OptionSpec(
        validate=lambda o: validate_adam_family(o, "Adam"),
        split=_split,
        complements=("beta1", "beta2"),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        optional={"max_exp_avg_sq": "amsgrad"},
    ),
)
ADAMW = dataclasses.replace(
    ADAM,
    name="AdamW",
    options=dataclasses.replace(ADAM.options, validate=lambda o: validate_adam_family(o, "AdamW")),
)


AMSGRAD = Arg(
    "amsgrad",
    False,
    bool,
    "AMSGrad: divide by the running maximum of v (kept as `max_exp_avg_sq`, before bias "
    "correction) instead of by v.",
)
ADAM_SIGNATURE = Signature(
    (
        lr(1e-3),
        betas(first_two=True),
        eps(1e-8, "to √v after its bias correction"),
        weight_decay(0, decoupled=None),
        AMSGRAD,
        KEYWORD_ONLY,
        FOREACH,
        MAXIMIZE,
        CAPTURABLE,
        DIFFERENTIABLE,
        FUSED,
        DECOUPLED_WEIGHT_DECAY,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
)
ADAMW_SIGNATURE = Signature(
    (
        lr(1e-3),
        betas(first_two=True),
        eps(1e-8, "to √v after its bias correction"),
        weight_decay(1e-2, decoupled=True),
        AMSGRAD,
        KEYWORD_ONLY,
        MAXIMIZE,
        FOREACH,
        CAPTURABLE,
        DIFFERENTIABLE,
        FUSED,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.899, -1.898], dtype=float32)"),
    fixed={"decoupled_weight_decay": True},
)

adam = transform_of(ADAM, ADAM_SIGNATURE, "adam", "`torch.optim.Adam` as an optax transformation.")
adamw = transform_of(
    ADAMW,
    ADAMW_SIGNATURE,
    "adamw",
    "`torch.optim.AdamW` as an optax transformation: Adam with decoupled weight decay "
    "(default 1e-2).",
)
