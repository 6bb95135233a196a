"""NAdam, Adam with Nesterov momentum (``torch.optim.NAdam``).

With ``g`` the gradient (negated when ``maximize``), ``t`` the step and
Dozat's momentum schedule $\\mu_t = \\beta_1(1 - \\tfrac12\\, 0.96^{t\\psi})$
($\\psi$ = ``momentum_decay``):

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\quad\\text{or, decoupled,}\\quad
    p \\leftarrow p(1 - \\gamma\\lambda) \\\\
\\Pi_t &= \\Pi_{t-1}\\,\\mu_t \\quad (\\Pi_0 = 1,\\ \\text{kept as }\\mathtt{mu\\_product}) \\\\
m_t &= \\beta_1 m_{t-1} + (1-\\beta_1) g, \\qquad
v_t = \\beta_2 v_{t-1} + (1-\\beta_2) g^2 \\\\
d &= \\sqrt{v_t / (1-\\beta_2^t)} + \\epsilon \\\\
p &\\leftarrow p - \\frac{\\gamma(1-\\mu_t)}{1-\\Pi_t}\\,\\frac{g}{d}
    - \\frac{\\gamma\\,\\mu_{t+1}}{1-\\Pi_t\\mu_{t+1}}\\,\\frac{m_t}{d}
\\end{aligned}
$$

applied as two ``addcdiv`` steps in that order, as torch does. torch keeps
``mu_product`` as a 0-d tensor in its default dtype; here it is a 0-d array in
the compute dtype (float32, or float64 for float64 parameters).
``optax.nadam`` equals this only as ``momentum_decay`` goes to infinity.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._adam_family import decayed, moments, split_adam_family, validate_adam_family
from ._math import guard, one_minus_pow
from ._signature import (
    CAPTURABLE,
    DECOUPLED_WEIGHT_DECAY,
    DIFFERENTIABLE,
    FOREACH,
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
    "NAdamState",
    "nadam",
]


class NAdamState(NamedTuple):
    """The state of torch.optim.NAdam, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      exp_avg: m, the average of the gradient.
      exp_avg_sq: v, the average of the squared gradient.
      mu_product: the product of the momentum schedule μ_1 ⋯ μ_t.
    """

    step: Any
    exp_avg: Any
    exp_avg_sq: Any
    mu_product: Any


def _validate_nadam(o: dict) -> None:
    validate_adam_family(o, "NAdam")
    _validate.non_negative(o["momentum_decay"], "momentum_decay value")


def _split(o: dict) -> tuple[dict, dict]:
    return split_adam_family(o, hyper=("momentum_decay",), flags=("decoupled_weight_decay",))


def _init(param, hyper, **_) -> NAdamState:
    zeros = jnp.zeros_like(param)
    return NAdamState(
        step=jnp.zeros((), jnp.float32),
        exp_avg=zeros,
        exp_avg_sq=zeros,
        mu_product=jnp.ones((), hyper["lr"].dtype),
    )


def _momentum(beta1, momentum_decay, t):
    """Dozat's schedule ``mu_t = beta1 * (1 - 0.5 * 0.96**(t * momentum_decay))``."""
    return beta1 * (1 - 0.5 * jnp.power(jnp.asarray(0.96, t.dtype), t * momentum_decay))


def _update(param, grad, state, h, *, maximize, decoupled_weight_decay, use_weight_decay):
    step = state.step + 1
    t = step.astype(param.dtype)
    lr = h["lr"]
    bias_correction2 = one_minus_pow(h["one_minus_beta2"], t)
    param, g = decayed(
        param,
        grad,
        h,
        maximize=maximize,
        use_weight_decay=use_weight_decay,
        decoupled=decoupled_weight_decay,
    )
    mu = _momentum(h["beta1"], h["momentum_decay"], t)
    mu_next = _momentum(h["beta1"], h["momentum_decay"], t + 1)
    mu_product = state.mu_product * mu
    mu_product_next = mu_product * mu_next
    exp_avg, exp_avg_sq = moments(state.exp_avg, state.exp_avg_sq, g, h)
    denom = jnp.sqrt(exp_avg_sq / bias_correction2) + guard(h["eps"])
    param = param + (-lr * (1 - mu) / (1 - mu_product)) * g / denom
    param = param + (-lr * mu_next / (1 - mu_product_next)) * exp_avg / denom
    return param, NAdamState(step, exp_avg, exp_avg_sq, mu_product)


NADAM = Rule(
    name="NAdam",
    state=NAdamState,
    options=OptionSpec(
        validate=_validate_nadam,
        split=_split,
        complements=("beta1", "beta2"),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        scalar=("step", "mu_product"),
    ),
)


NADAM_SIGNATURE = Signature(
    (
        lr(2e-3),
        betas(),
        eps(1e-8, "to √v̂"),
        weight_decay(0, decoupled=None),
        Arg(
            "momentum_decay",
            4e-3,
            Any,
            "ψ in Dozat's momentum schedule `μ_t = β₁ (1 - 0.5 · 0.96^(t ψ))`.",
        ),
        DECOUPLED_WEIGHT_DECAY,
        KEYWORD_ONLY,
        FOREACH,
        MAXIMIZE,
        CAPTURABLE,
        DIFFERENTIABLE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.8944, -1.8944], dtype=float32)"),
)

nadam = transform_of(
    NADAM, NADAM_SIGNATURE, "nadam", "`torch.optim.NAdam` as an optax transformation."
)
