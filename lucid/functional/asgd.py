"""Averaged SGD (``torch.optim.ASGD``).

With ``g`` the gradient (negated when ``maximize``), ``t`` the step, ``eta``
and ``mu`` from the previous step (``eta`` starts at ``lr``, ``mu`` at 1):

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda_{wd} p \\\\
p &\\leftarrow p(1 - \\lambda\\eta), \\qquad p \\leftarrow p - \\eta g \\\\
a &\\leftarrow a + \\mu(p - a)
    \\quad (\\text{a plain copy } a \\leftarrow p \\text{ when } \\mu = 1) \\\\
\\eta &\\leftarrow \\gamma / (1 + \\lambda\\gamma t)^\\alpha, \\qquad
\\mu \\leftarrow 1 / \\max(1, t - t_0)
\\end{aligned}
$$

``ax`` is the running average of the iterates (torch's ``ax``); with the
default ``t0 = 1e6`` it just copies ``p``. ``eta`` and ``mu`` are 0-d per
parameter, as in torch, where they live in the default dtype.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._apply import is_zero
from ._signature import (
    CAPTURABLE,
    DIFFERENTIABLE,
    FOREACH,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    lr,
    transform_of,
    weight_decay,
)
from .rule import FieldSpec, OptionSpec, Rule

__all__ = [
    "ASGDState",
    "asgd",
]


class ASGDState(NamedTuple):
    """The state of torch.optim.ASGD, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      eta: η, the current step size.
      mu: μ, the averaging coefficient.
      ax: the averaged parameter.
    """

    step: Any
    eta: Any
    mu: Any
    ax: Any


def _validate_asgd(o: dict) -> None:
    """torch 2.15's checks, in its order: ``lr``, ``lambd``, ``alpha``, ``weight_decay``
    (torch 2.13 checked neither ``lambd`` nor ``alpha``)."""
    _validate.common(o, "ASGD")
    _validate.non_negative(o["lambd"], "lambd value")
    _validate.non_negative(o["alpha"], "alpha value")
    _validate.non_negative(o["weight_decay"], "weight_decay value")


def _split(o: dict) -> tuple[dict, dict]:
    hyper = {
        "lr": o["lr"],
        "lambd": o["lambd"],
        "alpha": o["alpha"],
        "t0": o["t0"],
        "weight_decay": o["weight_decay"],
    }
    flags = {
        "maximize": bool(o["maximize"]),
        "use_weight_decay": not is_zero(o["weight_decay"]),
    }
    return hyper, flags


def _init(param, hyper, **_) -> ASGDState:
    lr = hyper["lr"]
    return ASGDState(
        step=jnp.zeros((), jnp.float32),
        eta=lr,
        mu=jnp.ones((), lr.dtype),
        ax=jnp.zeros_like(param),
    )


def _update(param, grad, state, h, *, maximize, use_weight_decay):
    step = state.step + 1
    t = step.astype(param.dtype)
    lr, lambd, eta, mu = h["lr"], h["lambd"], state.eta, state.mu
    g = -grad if maximize else grad
    if use_weight_decay:
        g = g + h["weight_decay"] * param
    param = param * (1 - lambd * eta)
    param = param + (-eta) * g
    # torch tests `mu.item() != 1` and copies p exactly in that case.
    ax = jnp.where(mu != 1, state.ax + (param - state.ax) * mu, param)
    # (1 + lambd*lr*t)**alpha through log1p, since lambd*lr*t is tiny next to 1.
    new_eta = lr / jnp.exp(h["alpha"] * jnp.log1p(lambd * lr * t))
    new_mu = 1 / jnp.maximum(1, t - h["t0"])
    return param, ASGDState(step, new_eta, new_mu, ax)


ASGD = Rule(
    name="ASGD",
    state=ASGDState,
    options=OptionSpec(
        validate=_validate_asgd,
        split=_split,
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        scalar=("step", "eta", "mu"),
    ),
)


ASGD_SIGNATURE = Signature(
    (
        lr(1e-2),
        Arg(
            "lambd",
            1e-4,
            Any,
            "λ: decay term; each step scales the parameter by "
            "`1 - λ η` and the step size `η` decays as `γ / (1 + λ γ t)^α`. At least 0 "
            "(torch 2.15's check; torch 2.13 took any value).",
        ),
        Arg(
            "alpha",
            0.75,
            Any,
            "α: power of the step size's decay. At least 0 (torch 2.15's check; torch 2.13 "
            "took any value).",
        ),
        Arg(
            "t0",
            1e6,
            Any,
            "t₀: the step from which the average `ax` is taken "
            "(before it, `ax` follows the parameter).",
        ),
        weight_decay(0),
        FOREACH,
        MAXIMIZE,
        DIFFERENTIABLE,
        CAPTURABLE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"),
)

asgd = transform_of(
    ASGD,
    ASGD_SIGNATURE,
    "asgd",
    "`torch.optim.ASGD` as an optax transformation (torch's signature has no "
    "keyword-only marker, and neither has this one).",
)
