"""bitsandbytes' SGD with momentum and LARS (`bitsandbytes.optim.SGD8bit`, `LARS8bit`, ...).

With `g` the gradient, `b` the momentum buffer and `t` the step:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
b &\\leftarrow g \\ (t = 1), \\qquad b \\leftarrow \\mu b + g \\ (t > 1) \\\\
p &\\leftarrow p - \\gamma\\, r\\, b
\\end{aligned}
$$

`r` is LARS's trust ratio, `min(1, max_unorm |p| / |b|)` (`|p|` before the step),
applied by the 32-bit kernel only; SGD's `r` is 1. As in bitsandbytes, momentum 0 is
refused (`NotImplementedError`), and `dampening` and `nesterov` are accepted and not
used by the kernel. The step reads the momentum from the group's `betas`
(`(momentum, dampening)`, bitsandbytes' group entry), as bitsandbytes does.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .._apply import is_zero
from .._signature import Arg, Example, Signature, lr
from . import _family as F

__all__ = [
    "lars",
    "lars8bit",
    "lars32bit",
    "sgd",
    "sgd8bit",
    "sgd32bit",
]


def _step32(p, g, s1, s2, h, t, flags):
    if flags["use_weight_decay"]:
        g = h["weight_decay"] * p + g
    s1 = jnp.where(t == 1, g, F.rounded(s1, h["beta1"]) + g)
    scale, unorm = F.trust_ratio(s1, p, h, flags)
    return s1 * (-h["lr"] * scale) + p, s1, None, unorm


def _step8(p, g, s1, s2, h, t, flags):
    g = h["weight_decay"] * p + g
    s1 = jnp.where(t == 1, g, F.rounded(s1, h["beta1"]) + g)
    return s1 * -h["lr"] + p, s1, None


MOMENTUM_KERNEL = F.Kernel("momentum", two_states=False, step32=_step32, step8=_step8)


def _split(o: Any) -> tuple[dict, dict]:
    hyper = {**F.values_of(o, "lr", "weight_decay"), "beta1": o["betas"][0]}
    if "max_unorm" in o:
        hyper["max_unorm"] = o["max_unorm"]
    return hyper, {"use_weight_decay": not is_zero(o["weight_decay"])}


def _validate(name: str, family: str):
    def validate(o: Any) -> None:
        F.check_args(o, name)
        if o["momentum"] == 0:
            raise NotImplementedError(f"{family} without momentum is not supported!")
        F.check_base(o, betas=(o["momentum"], o["dampening"]), eps=0.0)

    return validate


def _complete(options: dict) -> dict:
    """bitsandbytes' group keys: `betas = (momentum, dampening)`, `eps = 0`."""
    return {**options, "betas": (options["momentum"], options["dampening"]), "eps": 0.0}


MOMENTUM = Arg(
    "momentum",
    0,
    Any,
    "μ, the momentum factor; bitsandbytes refuses 0 (`NotImplementedError`), so give it.",
)
DAMPENING = Arg("dampening", 0, Any, "accepted and not used by bitsandbytes' kernel.")
NESTEROV = Arg("nesterov", False, bool, "accepted and not used by bitsandbytes' kernel.")


def _signature(bits: int | None, lars: bool) -> Signature:
    args = [
        lr(F.REQUIRED, "learning rate γ (required)"),
        MOMENTUM,
        DAMPENING,
        Arg("weight_decay", 0, Any, "λ: L2 penalty, `g ← g + λ p` before the momentum."),
        NESTEROV,
    ]
    if bits is None:
        args.append(F.optim_bits(32))
    args += [F.ARGS, F.MIN_8BIT_SIZE]
    if lars:
        args.append(F.max_unorm(0.02))
    result = "Array([ 0.99799997, -1.9959999 ], dtype=float32)"
    if not lars:
        result = "Array([ 0.95, -1.9 ], dtype=float32)"
    example = Example("lr=0.1, momentum=0.9", "[1.0, -2.0]", "[0.5, -1.0]", result)
    return Signature(tuple(args), example, complete=_complete)


def _sgd(name: str, bits: int | None, lars: bool = False):
    family = "LARS" if lars else "SGD"
    rule = F.rule(name, MOMENTUM_KERNEL, _validate(name, family), _split, bits=bits, complements=())
    return rule, _signature(bits, lars)


SPECS = {
    "SGD": _sgd("SGD", None),
    "SGD8bit": _sgd("SGD8bit", 8),
    "SGD32bit": _sgd("SGD32bit", 32),
    "LARS": _sgd("LARS", None, lars=True),
    "LARS8bit": _sgd("LARS8bit", 8, lars=True),
    "LARS32bit": _sgd("LARS32bit", 32, lars=True),
}
"""`{bitsandbytes class name: (rule, signature)}` of this family."""

sgd = F.transform(SPECS, "SGD", "SGD with momentum, `optim_bits` 32 or 8.")
sgd8bit = F.transform(SPECS, "SGD8bit", "SGD with momentum and an 8-bit block-wise buffer.")
sgd32bit = F.transform(SPECS, "SGD32bit", "SGD with momentum and a float32 buffer.")
lars = F.transform(SPECS, "LARS", "SGD with LARS's trust ratio (32-bit kernel), 32 or 8 bits.")
lars8bit = F.transform(SPECS, "LARS8bit", "LARS with 8-bit state (its 8-bit kernel is SGD's).")
lars32bit = F.transform(SPECS, "LARS32bit", "LARS with a float32 buffer and the trust ratio.")
