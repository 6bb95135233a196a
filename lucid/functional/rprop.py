"""Resilient backpropagation (``torch.optim.Rprop``).

With ``g`` the gradient (negated when ``maximize``), ``g'`` the stored
previous gradient, $\\eta^-, \\eta^+$ the ``etas`` and
$[\\Delta_{min}, \\Delta_{max}]$ the ``step_sizes``:

$$
\\begin{aligned}
s &= \\operatorname{sign}(g\\, g'), \\qquad
f = \\eta^+ \\text{ if } s > 0,\\ \\eta^- \\text{ if } s < 0,\\ 1 \\text{ if } s = 0 \\\\
\\Delta &\\leftarrow \\operatorname{clamp}(\\Delta f, \\Delta_{min}, \\Delta_{max}) \\\\
g &\\leftarrow 0 \\text{ where } f = \\eta^- \\\\
p &\\leftarrow p - \\operatorname{sign}(g)\\, \\Delta, \\qquad g' \\leftarrow g
\\end{aligned}
$$

``sign`` is torch's, 0 for NaN: a NaN gradient entry keeps its step size and
its parameter, as in torch. The per-element step size ``step_size`` starts as
``lr`` everywhere (``lr`` has no effect after that), and where the gradient
changed sign the *zeroed* gradient is what is stored as ``prev``, as in torch.
(``optax.rprop`` differs: it returns the previous step's update.)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _math, _validate
from ._apply import is_number
from ._signature import (
    CAPTURABLE,
    DIFFERENTIABLE,
    FOREACH,
    KEYWORD_ONLY,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    lr,
    transform_of,
)
from .rule import OptionSpec, Rule

__all__ = [
    "RpropState",
    "rprop",
]


class RpropState(NamedTuple):
    """The state of torch.optim.Rprop, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      prev: the previous gradient (zeroed where its sign flipped).
      step_size: each element's step size.
    """

    step: Any
    prev: Any
    step_size: Any


def _validate_rprop(o: dict) -> None:
    _validate.common(o, "Rprop")
    _validate.pair(o["etas"], "etas")
    _validate.pair(o["step_sizes"], "step_sizes")
    etaminus, etaplus = o["etas"]
    if is_number(etaminus) and is_number(etaplus) and not 0.0 < etaminus < 1.0 < etaplus:
        raise ValueError(f"Invalid eta values: {etaminus}, {etaplus}")


def _split(o: dict) -> tuple[dict, dict]:
    etaminus, etaplus = o["etas"]
    step_size_min, step_size_max = o["step_sizes"]
    hyper = {
        "lr": o["lr"],
        "etaminus": etaminus,
        "etaplus": etaplus,
        "step_size_min": step_size_min,
        "step_size_max": step_size_max,
    }
    return hyper, {"maximize": bool(o["maximize"])}


def _init(param, hyper, **_) -> RpropState:
    return RpropState(
        step=jnp.zeros((), jnp.float32),
        prev=jnp.zeros_like(param),
        step_size=jnp.full_like(param, hyper["lr"]),
    )


def _update(param, grad, state, h, *, maximize):
    g = -grad if maximize else grad
    # torch's sign: 0 for NaN, so a NaN gradient entry keeps its step size and parameter
    sign = _math.sign(g * state.prev)
    one = jnp.ones((), g.dtype)  # a Python 1 would be an int64 constant with x64 on
    factor = jnp.where(sign > 0, h["etaplus"], jnp.where(sign < 0, h["etaminus"], one))
    factor = factor.astype(g.dtype)
    step_size = jnp.clip(state.step_size * factor, h["step_size_min"], h["step_size_max"])
    g = jnp.where(factor == h["etaminus"], jnp.zeros_like(g), g)
    new_param = param - _math.sign(g) * step_size
    return new_param, RpropState(state.step + 1, g, step_size)


RPROP = Rule(
    name="Rprop",
    state=RpropState,
    options=OptionSpec(
        validate=_validate_rprop,
        split=_split,
    ),
    init=_init,
    update=_update,
)


RPROP_SIGNATURE = Signature(
    (
        lr(1e-2, "γ, each element's first step size"),
        Arg(
            "etas",
            (0.5, 1.2),
            tuple[Any, Any],
            "(η₋, η₊): factors a step size is "
            "multiplied by when the gradient's sign flips (η₋ < 1) or holds (η₊ > 1).",
        ),
        Arg(
            "step_sizes", (1e-6, 50), tuple[Any, Any], "(Γ_min, Γ_max): bounds of every step size."
        ),
        KEYWORD_ONLY,
        CAPTURABLE,
        FOREACH,
        MAXIMIZE,
        DIFFERENTIABLE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
)

rprop = transform_of(
    RPROP, RPROP_SIGNATURE, "rprop", "`torch.optim.Rprop` as an optax transformation."
)
