"""bitsandbytes' Lion (`bitsandbytes.optim.Lion`, `Lion8bit`, `PagedLion8bit`, ...).

With `g` the gradient and `m` the state:

$$
\\begin{aligned}
p &\\leftarrow p\\,(1 - \\gamma\\lambda) \\quad (\\lambda > 0) \\\\
p &\\leftarrow p - \\gamma\\,\\operatorname{sign}\\big(\\beta_1 m + (1 - \\beta_1) g\\big) \\\\
m &\\leftarrow \\beta_2 m + (1 - \\beta_2) g
\\end{aligned}
$$

`sign` is torch's, 0 for NaN (bitsandbytes' kernels use `torch.sign`): a NaN
gradient entry leaves its parameter as it is, and spoils only the average `m`.
In the 8-bit kernel `m` is stored in the signed dynamic map.
"""

from __future__ import annotations

from typing import Any

from .. import _math
from .._apply import is_zero
from .._signature import Arg, Example, Signature, betas, lr
from . import _family as F

__all__ = [
    "lion",
    "lion8bit",
    "lion32bit",
    "paged_lion",
    "paged_lion8bit",
    "paged_lion32bit",
]


def _step32(p, g, s1, s2, h, t, flags):
    p = F.decayed(p, h, flags)
    update = h["one_minus_beta1"] * g + F.rounded(s1, h["beta1"])
    p = _math.sign(update) * -h["lr"] + p
    s1 = h["one_minus_beta2"] * g + F.rounded(s1, h["beta2"])
    return p, s1, None, None


def _step8(p, g, s1, s2, h, t, flags):
    p = F.decayed(p, h, flags)
    update = F.rounded(s1, h["beta1"]) + F.rounded(g, h["one_minus_beta1"])
    p = _math.sign(update) * -h["lr"] + p
    s1 = h["one_minus_beta2"] * g + F.rounded(s1, h["beta2"])
    return p, s1, None


LION_KERNEL = F.Kernel("lion", two_states=False, step32=_step32, step8=_step8)


def _split(o: Any) -> tuple[dict, dict]:
    beta1, beta2 = o["betas"][0], o["betas"][1]
    hyper = {**F.values_of(o, "lr", "weight_decay"), "beta1": beta1, "beta2": beta2}
    hyper["decay"] = F.decay_factor(o["lr"], o["weight_decay"])
    return hyper, {"use_weight_decay": not is_zero(o["weight_decay"])}


def _validate(name: str):
    def validate(o: Any) -> None:
        F.check_args(o, name)
        F.check_base(o)

    return validate


def _complete(options: dict) -> dict:
    return {**options, "eps": 0.0}  # bitsandbytes' group keys


def _signature(bits: int | None, paged_arg: bool) -> Signature:
    args = [
        lr(1e-4),
        betas(
            (0.9, 0.99),
            "(β₁, β₂): the interpolation of the update's sign and the decay of the average m.",
        ),
        Arg("weight_decay", 0, Any, "weight decay λ, decoupled: `p ← p (1 - γ λ)` first."),
    ]
    if bits is None:
        args.append(F.optim_bits(32))
    args += [F.ARGS, F.MIN_8BIT_SIZE]
    if paged_arg:
        args.append(F.IS_PAGED)
    example = Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)")
    return Signature(tuple(args), example, complete=_complete)


def _lion(name: str, bits: int | None, paged_arg: bool = True):
    rule = F.rule(name, LION_KERNEL, _validate(name), _split, bits=bits)
    return rule, _signature(bits, paged_arg)


SPECS = {
    "Lion": _lion("Lion", None),
    "Lion8bit": _lion("Lion8bit", 8),
    "Lion32bit": _lion("Lion32bit", 32),
    "PagedLion": _lion("PagedLion", None, paged_arg=False),
    "PagedLion8bit": _lion("PagedLion8bit", 8, paged_arg=False),
    "PagedLion32bit": _lion("PagedLion32bit", 32, paged_arg=False),
}
"""`{bitsandbytes class name: (rule, signature)}` of this family."""

lion = F.transform(SPECS, "Lion", "Lion, `optim_bits` 32 or 8.")
lion8bit = F.transform(SPECS, "Lion8bit", "Lion with 8-bit block-wise state.")
lion32bit = F.transform(SPECS, "Lion32bit", "Lion with float32 state.")
paged_lion = F.transform(SPECS, "PagedLion", "Lion (paging is a no-op in JAX).")
paged_lion8bit = F.transform(SPECS, "PagedLion8bit", "8-bit Lion (paging is a no-op in JAX).")
paged_lion32bit = F.transform(SPECS, "PagedLion32bit", "32-bit Lion (paging is a no-op in JAX).")
