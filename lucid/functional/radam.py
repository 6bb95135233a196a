"""RAdam, rectified Adam (``torch.optim.RAdam``).

With ``g`` the gradient (negated when ``maximize``), ``t`` the step and
$\\rho_\\infty = 2/(1-\\beta_2) - 1$:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\quad\\text{or, decoupled,}\\quad
    p \\leftarrow p(1 - \\gamma\\lambda) \\\\
m_t &= \\beta_1 m_{t-1} + (1-\\beta_1) g, \\qquad
v_t = \\beta_2 v_{t-1} + (1-\\beta_2) g^2 \\\\
\\rho_t &= \\rho_\\infty - 2t\\beta_2^t / (1-\\beta_2^t) \\\\
r_t &= \\sqrt{\\frac{(\\rho_t-4)(\\rho_t-2)\\rho_\\infty}
    {(\\rho_\\infty-4)(\\rho_\\infty-2)\\rho_t}},
\\qquad l_t = \\frac{\\sqrt{1-\\beta_2^t}}{\\sqrt{v_t} + \\epsilon} \\\\
p &\\leftarrow p - \\frac{\\gamma\\, m_t}{1-\\beta_1^t}\\, r_t\\, l_t
    \\text{ if } \\rho_t > 5, \\text{ else }
    p \\leftarrow p - \\frac{\\gamma\\, m_t}{1-\\beta_1^t}
\\end{aligned}
$$

The rectification test ``rho_t > 5`` is strict and made per step inside the
graph; ``eps`` is added to the raw ``sqrt(v)`` (unlike Adam, where it follows
the bias correction), as in torch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from ._adam_family import decayed, moments, split_adam_family, validate_adam_family
from ._math import guard, one_minus_pow, power
from ._signature import (
    CAPTURABLE,
    DECOUPLED_WEIGHT_DECAY,
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
    "RAdamState",
    "radam",
]


class RAdamState(NamedTuple):
    """The state of torch.optim.RAdam, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      exp_avg: m, the average of the gradient.
      exp_avg_sq: v, the average of the squared gradient.
    """

    step: Any
    exp_avg: Any
    exp_avg_sq: Any


def _split(o: dict) -> tuple[dict, dict]:
    return split_adam_family(o, flags=("decoupled_weight_decay",))


def _init(param, hyper, **_) -> RAdamState:
    zeros = jnp.zeros_like(param)
    return RAdamState(step=jnp.zeros((), jnp.float32), exp_avg=zeros, exp_avg_sq=zeros)


def _rectification(rho_t, rho_inf):
    """``r_t``, the variance rectification factor (real where ``rho_t > 4``)."""
    return jnp.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))


def _bernoulli_tail(x):
    """``x/expm1(x) - 1 + x/2`` for ``|x| < 1`` by its series
    ``x^2/12 - x^4/720 + x^6/30240 - x^8/1209600`` (truncation < 3e-7 relative)."""
    x2 = x * x
    return x2 / 12 * (1 - x2 / 60 * (1 - x2 / 42 * (1 - x2 / 40)))


def _rho(t, one_minus_beta2, rho_inf, bias_correction2):
    """``rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)``.

    torch evaluates this in double, and float64 uses it as written. In float32
    the difference of two numbers near ``rho_inf`` (~2000 for beta2 = 0.999)
    leaves ``r_t`` up to 4e-5 off while ``t*L < 1``, ``L = -log(beta2)``; there
    the same value is computed without cancellation as
    ``t - (2/L) * (E(t*L) - E(L))``, ``E`` = ``_bernoulli_tail`` (``r_t``
    then within 3e-7 of torch's double value).
    """
    direct = rho_inf - 2 * t * power(one_minus_beta2, t) / bias_correction2
    if t.dtype == jnp.float64:
        return direct
    log_inv_beta2 = -jnp.log1p(-one_minus_beta2)
    x = t * log_inv_beta2
    series = t - (2 / log_inv_beta2) * (_bernoulli_tail(x) - _bernoulli_tail(log_inv_beta2))
    return jnp.where(x < 1, series, direct)


def _update(param, grad, state, h, *, maximize, decoupled_weight_decay, use_weight_decay):
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
    bias_correction1 = one_minus_pow(h["one_minus_beta1"], t)
    bias_correction2 = one_minus_pow(h["one_minus_beta2"], t)
    bias_corrected_exp_avg = exp_avg / bias_correction1

    rho_inf = 2 / h["one_minus_beta2"] - 1
    rho_t = _rho(t, h["one_minus_beta2"], rho_inf, bias_correction2)
    rectify = rho_t > 5
    # Outside the rectified branch r_t can be the square root of a negative
    # number; evaluate it at rho_inf there (r = 1) so no NaN enters jax.grad.
    rect = _rectification(jnp.where(rectify, rho_t, rho_inf), rho_inf)
    # torch: python_float / tensor is tensor.reciprocal() * python_float.
    adaptive_lr = (1 / (jnp.sqrt(exp_avg_sq) + guard(h["eps"]))) * jnp.sqrt(bias_correction2)
    update = jnp.where(
        rectify,
        bias_corrected_exp_avg * lr * adaptive_lr * rect,
        bias_corrected_exp_avg * lr,
    )
    return param - update, RAdamState(step, exp_avg, exp_avg_sq)


RADAM = Rule(
    name="RAdam",
    state=RAdamState,
    options=OptionSpec(
        validate=lambda o: validate_adam_family(o, "RAdam"),
        split=_split,
        complements=("beta1", "beta2"),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
)


RADAM_SIGNATURE = Signature(
    (
        lr(1e-3),
        betas(),
        eps(1e-8, "to √v"),
        weight_decay(0, decoupled=None),
        DECOUPLED_WEIGHT_DECAY,
        KEYWORD_ONLY,
        FOREACH,
        MAXIMIZE,
        CAPTURABLE,
        DIFFERENTIABLE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"),
)

radam = transform_of(
    RADAM, RADAM_SIGNATURE, "radam", "`torch.optim.RAdam` as an optax transformation."
)
