"""Adagrad with learning-rate decay (``torch.optim.Adagrad``).

With ``g`` the gradient (negated when ``maximize``) and ``t`` the step:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p \\\\
\\tilde\\gamma &= \\gamma / (1 + (t-1)\\eta) \\\\
s_t &= s_{t-1} + g^2, \\qquad s_0 = \\text{initial\\_accumulator\\_value} \\\\
p &\\leftarrow p - \\tilde\\gamma\\, g / (\\sqrt{s_t} + \\epsilon)
\\end{aligned}
$$

``eps`` (default 1e-10) is added outside the square root, as in torch.
A ``jax.experimental.sparse.BCOO`` gradient follows torch's sparse path: only its
stored entries change (``weight_decay`` is refused, as torch refuses it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._apply import is_zero
from ._math import guard
from ._signature import (
    DIFFERENTIABLE,
    FOREACH,
    FUSED,
    KEYWORD_ONLY,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from ._sparse import dense, stored_entries
from .rule import OptionSpec, Rule, SparseSpec

__all__ = [
    "AdagradState",
    "adagrad",
]


class AdagradState(NamedTuple):
    """The state of torch.optim.Adagrad, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      sum: the sum of squared gradients, from `initial_accumulator_value`.
    """

    step: Any
    sum: Any


def _validate_adagrad(o: dict) -> None:
    _validate.common(o, "Adagrad")
    _validate.non_negative(o["lr_decay"], "lr_decay value")
    _validate.non_negative(o["weight_decay"], "weight_decay value")
    _validate.non_negative(o["initial_accumulator_value"], "initial_accumulator_value value")
    _validate.non_negative(o["eps"], "epsilon value")


def _split(o: dict) -> tuple[dict, dict]:
    hyper = {
        "lr": o["lr"],
        "lr_decay": o["lr_decay"],
        "weight_decay": o["weight_decay"],
        "initial_accumulator_value": o["initial_accumulator_value"],
        "eps": o["eps"],
    }
    flags = {
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "maximize": bool(o["maximize"]),
    }
    return hyper, flags


def _init(param, hyper, **_) -> AdagradState:
    return AdagradState(
        step=jnp.zeros((), jnp.float32),
        sum=jnp.full_like(param, hyper["initial_accumulator_value"]),
    )


def _update(param, grad, state, h, *, use_weight_decay, maximize):
    step = state.step + 1
    t = step.astype(param.dtype)
    g = -grad if maximize else grad
    if use_weight_decay:
        g = g + h["weight_decay"] * param
    clr = h["lr"] / (1 + (t - 1) * h["lr_decay"])
    state_sum = state.sum + g * g
    std = jnp.sqrt(state_sum) + guard(h["eps"])
    new_param = param + (-clr) * g / std
    return new_param, AdagradState(step, state_sum)


def _update_masked(param, grad, present, state, h, **flags):
    """torch's sparse Adagrad, the gradient given dense with the mask of its stored
    entries: ``sum`` and the parameter change where ``present`` only (elsewhere the
    dense rule adds nothing, but divides ``0/0`` when ``eps`` and the accumulator are
    zero; a stored zero divides ``0/0`` there in torch too)."""
    new_param, new_state = _update(param, grad, state, h, **flags)
    return jnp.where(present, new_param, param), new_state._replace(
        sum=jnp.where(present, new_state.sum, state.sum)
    )


def _update_sparse(param, grad, state, h, **flags):
    """torch's sparse Adagrad for a BCOO gradient (`_update_masked` at its entries)."""
    values = dense(grad).astype(param.dtype)
    return _update_masked(param, values, stored_entries(grad), state, h, **flags)


def _sparse_options(o: dict) -> None:
    if _validate.scalar(o["weight_decay"], "weight_decay") not in (0, None):
        raise RuntimeError("weight_decay option is not compatible with sparse gradients")


ADAGRAD = Rule(
    name="Adagrad",
    state=AdagradState,
    options=OptionSpec(
        validate=_validate_adagrad,
        split=_split,
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
    sparse=SparseSpec(
        update=_update_sparse,
        masked_update=_update_masked,
        check_options=_sparse_options,
    ),
)


ADAGRAD_SIGNATURE = Signature(
    (
        lr(1e-2),
        Arg("lr_decay", 0, Any, "η: the step size decays as `γ / (1 + (t - 1) η)`."),
        weight_decay(0),
        Arg(
            "initial_accumulator_value",
            0,
            Any,
            "the value the sum of squared gradients (`sum`) starts from.",
        ),
        eps(1e-10, "to `√sum`"),
        FOREACH,
        KEYWORD_ONLY,
        MAXIMIZE,
        DIFFERENTIABLE,
        FUSED,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
)

adagrad = transform_of(
    ADAGRAD,
    ADAGRAD_SIGNATURE,
    "adagrad",
    "`torch.optim.Adagrad` as an optax transformation.",
)
