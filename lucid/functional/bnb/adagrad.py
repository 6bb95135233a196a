"""bitsandbytes' Adagrad (`bitsandbytes.optim.Adagrad`, `Adagrad8bit`, `Adagrad32bit`).

With `g` the gradient and `s` the sum of its squares:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p, \\qquad s \\leftarrow s + g^2 \\\\
p &\\leftarrow p - \\gamma\\, \\frac{g}{\\sqrt{s} + \\epsilon}
\\end{aligned}
$$

As in bitsandbytes, `lr_decay` and `initial_accumulator_value` other than 0 are refused
(`ValueError`). In the 8-bit kernel `s` is stored in the signed dynamic map.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .. import _validate as V
from .._apply import is_zero
from .._signature import Arg, Example, Signature, eps, lr
from . import _family as F

__all__ = [
    "adagrad",
    "adagrad8bit",
    "adagrad32bit",
]


def _step32(p, g, s1, s2, h, t, flags):
    if flags["use_weight_decay"]:
        g = h["weight_decay"] * p + g
    s1 = g * g + s1
    update = g / (jnp.sqrt(s1) + h["eps"])
    return update * -h["lr"] + p, s1, None, None


def _step8(p, g, s1, s2, h, t, flags):
    g = h["weight_decay"] * p + g
    s1 = g * g + s1
    return p + (-h["lr"] * g) / (jnp.sqrt(s1) + h["eps"]), s1, None


ADAGRAD_KERNEL = F.Kernel("adagrad", two_states=False, step32=_step32, step8=_step8)


def _split(o: Any) -> tuple[dict, dict]:
    hyper = F.values_of(o, "lr", "eps", "weight_decay")
    return hyper, {"use_weight_decay": not is_zero(o["weight_decay"])}


def _validate(name: str, eight: bool):
    def validate(o: Any) -> None:
        F.check_args(o, name)
        V.lr(o["lr"])
        V.non_negative(o["weight_decay"], "weight_decay value")
        V.non_negative(o["eps"], "epsilon value")
        if o["initial_accumulator_value"] != 0.0:
            raise ValueError("Initial accumulator value != 0.0 not supported!")
        if o["lr_decay"] != 0.0:
            raise ValueError("Lr Decay != 0.0 not supported!")
        if eight and o["optim_bits"] != 8:
            raise ValueError(f"{name} only supports optim_bits=8 (default value for compatibility)")
        F.check_base(o, betas=(0.0, 0.0))

    return validate


def _complete(options: dict) -> dict:
    """bitsandbytes' group keys: `betas = (0, 0)`."""
    return {**options, "betas": (0.0, 0.0)}


def _signature(bits: int | None) -> Signature:
    args = [
        lr(1e-2),
        Arg("lr_decay", 0, Any, "bitsandbytes refuses a value other than 0 (`ValueError`)."),
        Arg("weight_decay", 0, Any, "λ: L2 penalty, `g ← g + λ p` first."),
        Arg(
            "initial_accumulator_value",
            0,
            Any,
            "bitsandbytes refuses a value other than 0 (`ValueError`).",
        ),
        eps(1e-10, "to √s"),
        F.optim_bits(8 if bits == 8 else 32, fixed=bits),
        F.ARGS,
        F.MIN_8BIT_SIZE,
    ]
    example = Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)")
    return Signature(tuple(args), example, complete=_complete)


def _adagrad(name: str, bits: int | None):
    rule = F.rule(
        name, ADAGRAD_KERNEL, _validate(name, bits == 8), _split, bits=bits, complements=()
    )
    return rule, _signature(bits)


SPECS = {
    "Adagrad": _adagrad("Adagrad", None),
    "Adagrad8bit": _adagrad("Adagrad8bit", 8),
    "Adagrad32bit": _adagrad("Adagrad32bit", 32),
}
"""`{bitsandbytes class name: (rule, signature)}` of this family."""

adagrad = F.transform(SPECS, "Adagrad", "Adagrad, `optim_bits` 32 or 8.")
adagrad8bit = F.transform(SPECS, "Adagrad8bit", "Adagrad with 8-bit block-wise state.")
adagrad32bit = F.transform(SPECS, "Adagrad32bit", "Adagrad with float32 state.")
