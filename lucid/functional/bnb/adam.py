"""bitsandbytes' Adam, AdamW and LAMB (`bitsandbytes.optim.Adam8bit`, `AdamW8bit`,
`PagedAdamW8bit`, `LAMB8bit`, ... and their 32-bit forms).

With `g` the gradient, `t` the step, `c_1 = 1 - \\beta_1^t`, `c_2 = \\sqrt{1 - \\beta_2^t}`:

$$
\\begin{aligned}
m &\\leftarrow \\beta_1 m + (1 - \\beta_1) g, \\qquad
v \\leftarrow \\beta_2 v + (1 - \\beta_2) g^2 \\\\
p &\\leftarrow p\\,(1 - \\gamma\\lambda) \\quad (\\lambda > 0) \\\\
\\text{8-bit:}\\quad p &\\leftarrow p - \\frac{\\gamma}{c_1}\\,
    \\frac{m}{\\sqrt{v}/c_2 + \\epsilon} \\\\
\\text{32-bit:}\\quad p &\\leftarrow p - \\gamma\\,\\frac{c_2}{c_1}\\, r\\,
    \\frac{m}{\\sqrt{v} + \\epsilon\\, c_2}
\\end{aligned}
$$

The weight decay is decoupled in all of them, Adam's included (bitsandbytes' kernel has
one Adam; `Adam` and `AdamW` differ only in the default `weight_decay`, 0 and 1e-2).
`r` is LAMB's trust ratio, `min(1, max_unorm |p| / |u|)` of the update `u` (`|p|` before
the step), applied by the 32-bit kernel only; Adam's `r` is 1. `amsgrad` is accepted by
the 32-bit classes and ignored, as bitsandbytes ignores it; the 8-bit classes refuse it.
In the 8-bit kernel `m` is stored in the signed dynamic map and `v` in the unsigned one.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .._apply import is_zero
from .._signature import Arg, Example, Signature, betas, eps, lr
from . import _family as F

__all__ = [
    "adam",
    "adam8bit",
    "adam32bit",
    "adamw",
    "adamw8bit",
    "adamw32bit",
    "lamb",
    "lamb8bit",
    "lamb32bit",
    "paged_adam",
    "paged_adam8bit",
    "paged_adam32bit",
    "paged_adamw",
    "paged_adamw8bit",
    "paged_adamw32bit",
]


def _step32(p, g, s1, s2, h, t, flags):
    s1 = h["one_minus_beta1"] * g + F.rounded(s1, h["beta1"])
    s2 = (h["one_minus_beta2"] * g) * g + F.rounded(s2, h["beta2"])
    c1, c2 = F.corrections(h, t)
    step_size = (-h["lr"] * c2) / c1
    before = p
    p = F.decayed(p, h, flags)
    update = s1 / (jnp.sqrt(s2) + h["eps"] * c2)
    scale, unorm = F.trust_ratio(update, before, h, flags)
    return update * (step_size * scale) + p, s1, s2, unorm


def _step8(p, g, s1, s2, h, t, flags):
    s1 = h["one_minus_beta1"] * g + F.rounded(s1, h["beta1"])
    s2 = (h["one_minus_beta2"] * g) * g + F.rounded(s2, h["beta2"])
    c1, c2 = F.corrections(h, t)
    denom = jnp.sqrt(s2) / c2 + h["eps"]
    p = F.decayed(p, h, flags)
    return p + ((-h["lr"] / c1) * s1) / denom, s1, s2


ADAM_KERNEL = F.Kernel("adam", two_states=True, step32=_step32, step8=_step8, corrected=True)


def _split(o: Any) -> tuple[dict, dict]:
    beta1, beta2 = o["betas"][0], o["betas"][1]
    hyper = {**F.values_of(o, "lr", "eps", "weight_decay"), "beta1": beta1, "beta2": beta2}
    hyper["decay"] = F.decay_factor(o["lr"], o["weight_decay"])
    if "max_unorm" in o:
        hyper["max_unorm"] = o["max_unorm"]
    return hyper, {"use_weight_decay": not is_zero(o["weight_decay"])}


def _validate(name: str, eight: bool, lamb: bool = False):
    def validate(o: Any) -> None:
        F.check_args(o, name)
        if eight and o["amsgrad"]:
            raise ValueError(f"{name} does not support amsgrad=True")
        if eight and not lamb and o["optim_bits"] != 32:
            raise ValueError(
                f"{name} only supports optim_bits=32 (default value for compatibility)"
            )
        if eight and lamb and o["max_unorm"] != 1.0:
            raise ValueError(
                f"{name} only supports max_unorm=1.0 (default value for compatibility)"
            )
        F.check_base(o)

    return validate


AMSGRAD = Arg(
    "amsgrad",
    False,
    bool,
    "bitsandbytes has no AMSGrad kernel: the 32-bit classes accept and ignore it, the "
    "8-bit ones refuse `True` (`ValueError`).",
)
BIAS_CORRECTION = Arg(
    "bias_correction", True, bool, "LAMB's bias correction: accepted and ignored (always on)."
)
ADAM_W_MODE = Arg(
    "adam_w_mode",
    True,
    bool,
    "accepted and ignored (the weight decay is always decoupled).",
)
_COMMON = "weight decay λ, decoupled: `p ← p (1 - γ λ)` before the update."
_FILLED = {"alpha": 0.0, "t_alpha": None, "t_beta3": None}  # bitsandbytes' group keys


def _complete(options: dict) -> dict:
    """bitsandbytes' two-state groups also hold AdEMAMix's `alpha`, `t_alpha`, `t_beta3`."""
    return {**options, **_FILLED}


def _adam_signature(weight_decay: float, bits: int | None, paged_arg: bool) -> Signature:
    args = [
        lr(1e-3),
        betas(),
        eps(1e-8, "to √v after its bias correction (8-bit) or to √v times c₂ (32-bit)"),
        Arg("weight_decay", weight_decay, Any, _COMMON),
        AMSGRAD,
        F.optim_bits(32, fixed=bits),
        F.ARGS,
        F.MIN_8BIT_SIZE,
    ]
    if paged_arg:
        args.append(F.IS_PAGED)
    result = "Array([ 0.9, -1.9], dtype=float32)"
    if weight_decay:
        result = "Array([ 0.899, -1.898], dtype=float32)"
    return Signature(
        tuple(args), Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", result), complete=_complete
    )


def _lamb_signature(bits: int | None) -> Signature:
    args = [
        lr(1e-3),
        BIAS_CORRECTION,
        betas(),
        eps(1e-8, "to √v times c₂ (32-bit) or to √v after its bias correction (8-bit)"),
        Arg("weight_decay", 0, Any, _COMMON),
        AMSGRAD,
        ADAM_W_MODE,
    ]
    if bits is None:
        args.append(F.optim_bits(32))
    args += [F.ARGS, F.MIN_8BIT_SIZE, F.max_unorm(1.0)]
    return Signature(
        tuple(args),
        Example(
            "lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95     , -1.9499999], dtype=float32)"
        ),
        complete=_complete,
    )


def _adam(name: str, weight_decay: float, bits: int | None, paged_arg: bool = True):
    rule = F.rule(name, ADAM_KERNEL, _validate(name, bits == 8), _split, bits=bits)
    return rule, _adam_signature(weight_decay, bits, paged_arg)


def _lamb(name: str, bits: int | None):
    rule = F.rule(name, ADAM_KERNEL, _validate(name, bits == 8, lamb=True), _split, bits=bits)
    return rule, _lamb_signature(bits)


SPECS = {
    "Adam": _adam("Adam", 0, None),
    "Adam8bit": _adam("Adam8bit", 0, 8),
    "Adam32bit": _adam("Adam32bit", 0, 32),
    "PagedAdam": _adam("PagedAdam", 0, None),
    "PagedAdam8bit": _adam("PagedAdam8bit", 0, 8),
    "PagedAdam32bit": _adam("PagedAdam32bit", 0, 32),
    "AdamW": _adam("AdamW", 1e-2, None),
    "AdamW8bit": _adam("AdamW8bit", 1e-2, 8),
    "AdamW32bit": _adam("AdamW32bit", 1e-2, 32),
    "PagedAdamW": _adam("PagedAdamW", 1e-2, None, paged_arg=False),
    "PagedAdamW8bit": _adam("PagedAdamW8bit", 1e-2, 8, paged_arg=False),
    "PagedAdamW32bit": _adam("PagedAdamW32bit", 1e-2, 32, paged_arg=False),
    "LAMB": _lamb("LAMB", None),
    "LAMB8bit": _lamb("LAMB8bit", 8),
    "LAMB32bit": _lamb("LAMB32bit", 32),
}
"""`{bitsandbytes class name: (rule, signature)}` of this family."""


_ADAM = "Adam with decoupled weight decay"
adam = F.transform(SPECS, "Adam", f"{_ADAM}, `optim_bits` 32 or 8.")
adam8bit = F.transform(SPECS, "Adam8bit", f"{_ADAM}, 8-bit block-wise state.")
adam32bit = F.transform(SPECS, "Adam32bit", f"{_ADAM}, float32 state.")
paged_adam = F.transform(SPECS, "PagedAdam", f"{_ADAM} (paging is a no-op in JAX).")
paged_adam8bit = F.transform(SPECS, "PagedAdam8bit", f"{_ADAM}, 8-bit (paging is a no-op in JAX).")
paged_adam32bit = F.transform(
    SPECS, "PagedAdam32bit", f"{_ADAM}, 32-bit (paging is a no-op in JAX)."
)
adamw = F.transform(SPECS, "AdamW", f"{_ADAM} (default 1e-2), `optim_bits` 32 or 8.")
adamw8bit = F.transform(SPECS, "AdamW8bit", f"{_ADAM} (default 1e-2), 8-bit block-wise state.")
adamw32bit = F.transform(SPECS, "AdamW32bit", f"{_ADAM} (default 1e-2), float32 state.")
paged_adamw = F.transform(SPECS, "PagedAdamW", f"{_ADAM} (default 1e-2; paging is a no-op in JAX).")
paged_adamw8bit = F.transform(
    SPECS, "PagedAdamW8bit", f"{_ADAM} (default 1e-2), 8-bit (no paging)."
)
paged_adamw32bit = F.transform(
    SPECS, "PagedAdamW32bit", f"{_ADAM} (default 1e-2), 32-bit (no paging)."
)
lamb = F.transform(
    SPECS, "LAMB", "Adam with LAMB's trust ratio (32-bit kernel), `optim_bits` 32 or 8."
)
lamb8bit = F.transform(SPECS, "LAMB8bit", "LAMB with 8-bit state (its 8-bit kernel is Adam's).")
lamb32bit = F.transform(SPECS, "LAMB32bit", "LAMB with float32 state and the trust ratio.")
