"""bitsandbytes' AdEMAMix (`bitsandbytes.optim.AdEMAMix`, `AdEMAMix8bit`, `PagedAdEMAMix8bit`,
...): Adam with a second, slow first moment mixed in.

With `g` the gradient, `t` the step, `c_1 = 1 - \\beta_1^t`, `c_2 = \\sqrt{1 - \\beta_2^t}`:

$$
\\begin{aligned}
m_1 &\\leftarrow \\beta_1 m_1 + (1 - \\beta_1) g, \\quad
m_2 \\leftarrow \\beta_3 m_2 + (1 - \\beta_3) g, \\quad
\\nu \\leftarrow \\beta_2 \\nu + (1 - \\beta_2) g^2 \\\\
p &\\leftarrow p\\,(1 - \\gamma\\lambda) \\quad (\\lambda > 0) \\\\
p &\\leftarrow p - \\gamma\\, \\frac{m_1 / c_1 + \\alpha\\, m_2}{\\sqrt{\\nu}/c_2 + \\epsilon}
\\end{aligned}
$$

With `t_alpha` and `t_beta3` (bitsandbytes' schedulers; 0 or `None` turns them off),
with `s = t / t_{\\beta_3}`:

$$
\\alpha_t = \\min\\Big(\\frac{t\\,\\alpha}{t_\\alpha}, \\alpha\\Big), \\qquad
\\beta_{3,t} = \\min\\Big(\\exp\\frac{\\ln\\beta_1 \\ln\\beta_3}
    {(1 - s)\\ln\\beta_3 + s \\ln\\beta_1}, \\beta_3\\Big)
$$

`state1` holds `m_1` and `m_2` stacked, `state2` holds `\\nu`; in the 8-bit kernel each
moment has its own absmax (`absmax1` is `(2, blocks)`).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from .._apply import is_number, is_zero
from .._signature import Arg, Example, Signature, eps, lr
from . import _family as F

__all__ = [
    "ademamix",
    "ademamix8bit",
    "ademamix32bit",
    "paged_ademamix",
    "paged_ademamix8bit",
    "paged_ademamix32bit",
]


def _beta3(h, t, flags):
    """`(beta3_t, 1 - beta3_t)`, scheduled when `t_beta3` is on (accurate near 1)."""
    if not flags["use_t_beta3"]:
        return h["beta3"], h["one_minus_beta3"]
    s = t / h["t_beta3"]
    y = (h["log_beta1"] * h["log_beta3"]) / ((1 - s) * h["log_beta3"] + s * h["log_beta1"])
    below = jnp.exp(y) < h["beta3"]
    return (
        jnp.where(below, jnp.exp(y), h["beta3"]),
        jnp.where(below, -jnp.expm1(y), h["one_minus_beta3"]),
    )


def _alpha(h, t, flags):
    if not flags["use_t_alpha"]:
        return h["alpha"]
    return jnp.minimum(t * h["alpha"] / h["t_alpha"], h["alpha"])


def _moments(g, s1, s2, h, t, flags):
    beta3, one_minus_beta3 = _beta3(h, t, flags)
    m1 = h["one_minus_beta1"] * g + F.rounded(s1[0], h["beta1"])
    m2 = one_minus_beta3 * g + F.rounded(s1[1], beta3)
    nu = (h["one_minus_beta2"] * g) * g + F.rounded(s2, h["beta2"])
    return m1, m2, nu


def _step32(p, g, s1, s2, h, t, flags):
    m1, m2, nu = _moments(g, s1, s2, h, t, flags)
    c1, c2 = F.corrections(h, t)
    p = F.decayed(p, h, flags)
    mixed = F.rounded(m2, _alpha(h, t, flags)) + m1 / c1
    update = mixed / (jnp.sqrt(nu) / c2 + h["eps"])
    return update * -h["lr"] + p, jnp.stack([m1, m2]), nu, None


def _step8(p, g, s1, s2, h, t, flags):
    m1, m2, nu = _moments(g, s1, s2, h, t, flags)
    c1, c2 = F.corrections(h, t)
    update = (F.rounded(m2, _alpha(h, t, flags)) + m1 / c1) / (jnp.sqrt(nu) / c2 + h["eps"])
    p = F.decayed(p, h, flags)
    return update * -h["lr"] + p, jnp.stack([m1, m2]), nu


ADEMAMIX_KERNEL = F.Kernel("ademamix", two_states=True, step32=_step32, step8=_step8, double=True)


def _log(value: Any) -> Any:
    if is_number(value):
        return float(np.log(float(value)))
    if callable(value):
        return lambda count: jnp.log(value(count))
    return jnp.log(value)


def _split(o: Any) -> tuple[dict, dict]:
    beta1, beta2, beta3 = o["betas"][0], o["betas"][1], o["betas"][2]
    hyper = {
        **F.values_of(o, "lr", "eps", "weight_decay", "alpha"),
        "beta1": beta1,
        "beta2": beta2,
        "beta3": beta3,
        "decay": F.decay_factor(o["lr"], o["weight_decay"]),
    }
    flags = {
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "use_t_alpha": bool(o["t_alpha"]),
        "use_t_beta3": bool(o["t_beta3"]),
    }
    if flags["use_t_alpha"]:
        hyper["t_alpha"] = o["t_alpha"]
    if flags["use_t_beta3"]:
        hyper.update(t_beta3=o["t_beta3"], log_beta1=_log(beta1), log_beta3=_log(beta3))
    return hyper, flags


def _validate(o: Any) -> None:
    F.check_base(o)
    if len(o["betas"]) != 3:
        raise ValueError(f"AdEMAMix takes three betas (beta1, beta2, beta3), got {o['betas']}")


T_ALPHA = Arg(
    "t_alpha",
    None,
    Any,
    "steps over which α warms up linearly from 0 (`None` or 0: no warm-up).",
)
T_BETA3 = Arg(
    "t_beta3",
    None,
    Any,
    "steps over which β₃ rises from β₁ to its value (`None` or 0: fixed β₃).",
)


def _signature(bits: int | None, paged_arg: bool) -> Signature:
    args = [
        lr(1e-3),
        Arg(
            "betas",
            (0.9, 0.999, 0.9999),
            tuple[Any, Any, Any],
            "(β₁, β₂, β₃): decay rates of the fast first moment, of the second moment and of "
            "the slow first moment.",
            convert=lambda value: tuple(value) if isinstance(value, list | tuple) else value,
        ),
        Arg("alpha", 5.0, Any, "α, the weight of the slow first moment."),
        T_ALPHA,
        T_BETA3,
        eps(1e-8, "to √ν after its bias correction"),
        Arg("weight_decay", 1e-2, Any, "weight decay λ, decoupled: `p ← p (1 - γ λ)`."),
    ]
    if bits is None:
        args.append(F.optim_bits(32))
    args.append(F.MIN_8BIT_SIZE)
    if paged_arg:
        args.append(F.IS_PAGED)
    example = Example(
        "lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.899, -1.898], dtype=float32)"
    )
    return Signature(tuple(args), example)


def _ademamix(name: str, bits: int | None, paged_arg: bool = True):
    rule = F.rule(
        name,
        ADEMAMIX_KERNEL,
        _validate,
        _split,
        bits=bits,
        complements=("beta1", "beta2", "beta3"),
    )
    return rule, _signature(bits, paged_arg)


SPECS = {
    "AdEMAMix": _ademamix("AdEMAMix", None),
    "AdEMAMix8bit": _ademamix("AdEMAMix8bit", 8),
    "AdEMAMix32bit": _ademamix("AdEMAMix32bit", 32),
    "PagedAdEMAMix": _ademamix("PagedAdEMAMix", None, paged_arg=False),
    "PagedAdEMAMix8bit": _ademamix("PagedAdEMAMix8bit", 8, paged_arg=False),
    "PagedAdEMAMix32bit": _ademamix("PagedAdEMAMix32bit", 32, paged_arg=False),
}
"""`{bitsandbytes class name: (rule, signature)}` of this family."""

ademamix = F.transform(SPECS, "AdEMAMix", "AdEMAMix, `optim_bits` 32 or 8.")
ademamix8bit = F.transform(SPECS, "AdEMAMix8bit", "AdEMAMix with 8-bit block-wise state.")
ademamix32bit = F.transform(SPECS, "AdEMAMix32bit", "AdEMAMix with float32 state.")
paged_ademamix = F.transform(SPECS, "PagedAdEMAMix", "AdEMAMix (paging is a no-op in JAX).")
paged_ademamix8bit = F.transform(SPECS, "PagedAdEMAMix8bit", "8-bit AdEMAMix (no paging in JAX).")
paged_ademamix32bit = F.transform(
    SPECS, "PagedAdEMAMix32bit", "32-bit AdEMAMix (no paging in JAX)."
)
