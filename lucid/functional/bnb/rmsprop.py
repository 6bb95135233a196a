"""bitsandbytes' RMSprop (`bitsandbytes.optim.RMSprop`, `RMSprop8bit`, `RMSprop32bit`).

With `g` the gradient and `s` the average of its square:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
s &\\leftarrow \\alpha s + (1 - \\alpha) g^2 \\\\
p &\\leftarrow p - \\gamma\\, \\frac{g}{\\sqrt{s} + \\epsilon}
\\end{aligned}
$$

As in bitsandbytes, `alpha = 0` and `centered=True` are refused
(`NotImplementedError`), `momentum` is accepted and not used by the kernel, and the
step reads `alpha` from the group's `betas` (`(alpha, momentum)`, bitsandbytes' entry).
In the 8-bit kernel `s` is stored in the signed dynamic map (bitsandbytes' choice).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .._apply import is_zero
from .._signature import Arg, Example, Signature, eps, lr
from . import _family as F

__all__ = [
    "rmsprop",
    "rmsprop8bit",
    "rmsprop32bit",
]


def _step32(p, g, s1, s2, h, t, flags):
    if flags["use_weight_decay"]:
        g = h["weight_decay"] * p + g
    s1 = (h["one_minus_beta1"] * g) * g + F.rounded(s1, h["beta1"])
    update = g / (jnp.sqrt(s1) + h["eps"])
    return update * -h["lr"] + p, s1, None, None


def _step8(p, g, s1, s2, h, t, flags):
    g = h["weight_decay"] * p + g
    s1 = (h["one_minus_beta1"] * g) * g + F.rounded(s1, h["beta1"])
    return p + (-h["lr"] * g) / (jnp.sqrt(s1) + h["eps"]), s1, None


RMSPROP_KERNEL = F.Kernel("rmsprop", two_states=False, step32=_step32, step8=_step8)


def _split(o: Any) -> tuple[dict, dict]:
    hyper = {**F.values_of(o, "lr", "eps", "weight_decay"), "beta1": o["betas"][0]}
    return hyper, {"use_weight_decay": not is_zero(o["weight_decay"])}


def _validate(name: str):
    def validate(o: Any) -> None:
        F.check_args(o, name)
        if o["alpha"] == 0:
            raise NotImplementedError("RMSprop with alpha==0.0 is not supported!")
        if o["centered"]:
            raise NotImplementedError("Centered RMSprop is not supported!")
        F.check_base(o, betas=(o["alpha"], o["momentum"]))

    return validate


def _complete(options: dict) -> dict:
    """bitsandbytes' group keys: `betas = (alpha, momentum)`."""
    return {**options, "betas": (options["alpha"], options["momentum"])}


def _signature(bits: int | None) -> Signature:
    args = [
        lr(1e-2),
        Arg("alpha", 0.99, Any, "α, the decay of the squared-gradient average (not 0)."),
        eps(1e-8, "to √s"),
        Arg("weight_decay", 0, Any, "λ: L2 penalty, `g ← g + λ p` first."),
        Arg("momentum", 0, Any, "accepted and not used by bitsandbytes' kernel."),
        Arg("centered", False, bool, "bitsandbytes refuses `True` (`NotImplementedError`)."),
    ]
    if bits is None:
        args.append(F.optim_bits(32))
    args += [F.ARGS, F.MIN_8BIT_SIZE]
    example = Example("lr=0.01", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)")
    return Signature(tuple(args), example, complete=_complete)


def _rmsprop(name: str, bits: int | None):
    rule = F.rule(name, RMSPROP_KERNEL, _validate(name), _split, bits=bits, complements=("beta1",))
    return rule, _signature(bits)


SPECS = {
    "RMSprop": _rmsprop("RMSprop", None),
    "RMSprop8bit": _rmsprop("RMSprop8bit", 8),
    "RMSprop32bit": _rmsprop("RMSprop32bit", 32),
}
"""`{bitsandbytes class name: (rule, signature)}` of this family."""

rmsprop = F.transform(SPECS, "RMSprop", "RMSprop, `optim_bits` 32 or 8.")
rmsprop8bit = F.transform(SPECS, "RMSprop8bit", "RMSprop with 8-bit block-wise state.")
rmsprop32bit = F.transform(SPECS, "RMSprop32bit", "RMSprop with float32 state.")
