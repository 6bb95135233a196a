"""What Adam, AdamW, Adamax, RAdam and NAdam share: torch's checks, and how their
keyword options split into hyper-parameters and static flags."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._arrays import is_array
from . import _validate
from ._apply import is_zero
from ._math import lerp


def validate_adam_family(o: dict, name: str) -> None:
    """torch's checks for Adam-like optimizers: lr, eps, betas, weight_decay; for Adam
    and AdamW also torch's rules for arrays (tensors) as ``lr`` and ``betas``."""
    tensor_rules = name in ("Adam", "AdamW")
    # torch refuses tensor hyper-parameters with foreach=True unless capturable=True
    # (lucid ignores both knobs, but keeps torch's contract)
    foreach_only = bool(o.get("foreach")) and not o.get("capturable", False)
    if tensor_rules and foreach_only and is_array(o["lr"]):
        raise ValueError("lr as a Tensor is not supported for capturable=False and foreach=True")
    _validate.common(o, name)
    _validate.non_negative(o["eps"], "epsilon value")
    _validate.betas(o["betas"])
    _validate.non_negative(o["weight_decay"], "weight_decay value")
    if tensor_rules:
        kinds = {_kind(beta) for beta in o["betas"]}
        if kinds not in ({"float"}, {"array"}):
            raise ValueError("betas must be either both floats or both Tensors")
        if kinds == {"array"} and foreach_only:
            raise ValueError(
                "betas[0] as a Tensor is not supported for capturable=False and foreach=True"
            )


def _kind(beta: Any) -> str:
    """torch's kinds of beta: a Python float, a tensor (here: any array), or neither."""
    if isinstance(beta, float):
        return "float"
    return "array" if is_array(beta) and not isinstance(beta, np.generic) else "other"


def split_adam_family(
    o: dict, hyper: Iterable[str] = (), flags: Iterable[str] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``lr, betas, eps, weight_decay`` (plus ``hyper``) as hyper-parameters;
    ``maximize``, whether weight decay applies at all, and ``flags`` as flags."""
    beta1, beta2 = o["betas"]
    values = {
        "lr": o["lr"],
        "beta1": beta1,
        "beta2": beta2,
        "eps": o["eps"],
        "weight_decay": o["weight_decay"],
        **{name: o[name] for name in hyper},
    }
    static = {
        "maximize": bool(o["maximize"]),
        "use_weight_decay": not is_zero(o["weight_decay"]),
        **{name: bool(o[name]) for name in flags},
    }
    return values, static


def decayed(
    param: Any, grad: Any, h: dict, *, maximize: bool, use_weight_decay: bool, decoupled: bool
) -> tuple[Any, Any]:
    """The step's gradient and parameter before the moments, in torch's order:
    ``g = -grad`` when maximizing, then ``g += wd * p`` or, decoupled,
    ``p *= 1 - lr * wd``."""
    g = -grad if maximize else grad
    if use_weight_decay:
        if decoupled:
            param = param * (1 - h["lr"] * h["weight_decay"])
        else:
            g = g + h["weight_decay"] * param
    return param, g


def moments(exp_avg: Any, exp_avg_sq: Any, g: Any, h: dict) -> tuple[Any, Any]:
    """torch's ``exp_avg.lerp_(g, 1-b1)`` and ``exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)``."""
    return (
        lerp(exp_avg, g, h["one_minus_beta1"]),
        exp_avg_sq * h["beta2"] + h["one_minus_beta2"] * g * g,
    )
