"""Adafactor (``torch.optim.Adafactor``): a factored second moment and relative steps.

With ``g`` the gradient (negated when ``maximize``), ``t`` the step and
``RMS(x) = ||x||_2 / sqrt(numel(x))``:

$$
\\begin{aligned}
\\hat\\beta_{2,t} &= 1 - t^{\\tau}, \\qquad
\\rho_t = \\min(\\gamma, 1/\\sqrt t), \\qquad
\\alpha_t = \\max(\\epsilon_2, \\mathrm{RMS}(p))\\,\\rho_t \\\\
p &\\leftarrow p\\,(1 - \\gamma\\lambda) \\\\
R_t &= \\hat\\beta_{2,t} R_{t-1} + (1-\\hat\\beta_{2,t})\\,\\mathrm{mean}_{-1}(g^2), \\quad
C_t = \\hat\\beta_{2,t} C_{t-1} + (1-\\hat\\beta_{2,t})\\,\\mathrm{mean}_{-2}(g^2) \\\\
\\hat V_t &= \\frac{R_t C_t}{\\max(\\mathrm{mean}_{-2}(R_t), \\epsilon_1)}
    \\quad\\text{(or, for a vector, } \\hat V_t = \\hat\\beta_{2,t}\\hat V_{t-1}
    + (1-\\hat\\beta_{2,t}) g^2) \\\\
U_t &= \\frac{g}{\\sqrt{\\max(\\hat V_t, \\epsilon_1^2)}}, \\qquad
p \\leftarrow p - \\frac{\\alpha_t}{\\max(1, \\mathrm{RMS}(U_t)/d)}\\,U_t
\\end{aligned}
$$

``tau`` is ``beta2_decay``, ``(eps1, eps2)`` is ``eps``, and ``eps1=None``
means the machine epsilon of the parameter's dtype. A parameter of two or more
dimensions keeps the row and column factors ``row_var`` (the last axis reduced,
kept as size 1) and ``col_var`` (the second-to-last axis reduced); a vector
(or a 0-d parameter) keeps the full ``variance``. ``RMS(p)`` is taken before
the weight decay, as torch does.

torch computes ``t**tau``, ``rho_t``, ``alpha_t`` and the clipping divisor as
host floats (``.item()``), the two maxima with Python's ``max``, where a NaN never
wins (a NaN gradient entry spoils its own entries, not the whole parameter); here
they are device scalars in the parameter's compute dtype, compared the same way, so
a step needs no host round trip and a float32 program needs no float64. This rule
reduces over whole parameters, so it is not elementwise: the compiled step updates
each parameter as itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._apply import is_number, is_zero
from ._math import guard, host_max, lerp
from ._signature import (
    FOREACH,
    KEYWORD_ONLY,
    MAXIMIZE,
    Arg,
    Example,
    Signature,
    lr,
    transform_of,
    weight_decay,
)
from .rule import Execution, OptionSpec, Rule

__all__ = [
    "AdafactorState",
    "adafactor",
]


class AdafactorState(NamedTuple):
    """The state of torch.optim.Adafactor, one entry per parameter (torch's names).

    Attributes:
      step: updates done (float32).
      row_var: the row means of the second moment, torch's keepdim shape (last axis 1), for
        parameters of two or more dimensions; else `None`.
      col_var: the column means of the second moment (second-to-last axis 1), for parameters
        of two or more dimensions; else `None`.
      variance: the second moment of a vector or 0-d parameter (its shape); else `None`.
    """

    step: Any
    row_var: Any
    col_var: Any
    variance: Any


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _validate_adafactor(o: dict) -> None:
    """torch's constructor checks, in torch's order and words (concrete numbers only)."""
    lr, beta2_decay, eps, d, weight_decay = (
        o["lr"],
        o["beta2_decay"],
        o["eps"],
        o["d"],
        o["weight_decay"],
    )
    if not isinstance(eps, Sequence) or isinstance(eps, str | bytes):
        raise TypeError(
            "eps must be a pair (eps1, eps2): eps1 a number, or None for the parameter "
            "dtype's machine epsilon, and eps2 a number, as torch's default (None, 1e-3); "
            f"but got {type(eps).__name__}: {eps!r}"
        )
    if len(eps) != 2:
        raise ValueError(f"eps must be a pair (eps1, eps2), got {eps!r}")
    eps1, eps2 = eps
    if is_number(lr):
        _check(lr >= 0.0, f"Learning rate should be >= 0 but is: {lr}")
    if is_number(beta2_decay):
        _check(beta2_decay <= 0.0, f"beta2_decay should be <= 0 but is: {beta2_decay}")
    if is_number(eps1):
        _check(eps1 >= 0.0, f"epsilon1 should be >= 0 but is: {eps1}")
    if is_number(eps2):
        _check(eps2 >= 0.0, f"epsilon2 should be >= 0 but is: {eps2}")
    if is_number(d):
        _check(d >= 1.0, f"Clipping threshold d should be >= 1 but is: {d}")
    if is_number(weight_decay):
        _check(weight_decay >= 0.0, f"weight_decay should be >= 0 but is: {weight_decay}")


def _as_pair(value: Any) -> Any:
    """``eps`` as torch keeps it: a list, tuple or 1-d array as a tuple; anything else
    (``None``, a number) as given, for `_validate_adafactor` to refuse in words."""
    if isinstance(value, list | tuple) or getattr(value, "ndim", None) == 1:
        return tuple(value)
    return value


def _split(o: dict) -> tuple[dict, dict]:
    eps1, eps2 = o["eps"]
    hyper = {
        "lr": o["lr"],
        "beta2_decay": o["beta2_decay"],
        "eps2": eps2,
        "d": o["d"],
        "weight_decay": o["weight_decay"],
    }
    if eps1 is not None:
        hyper["eps1"] = eps1
        if is_number(eps1):  # torch squares a float eps1 on the host, in double precision
            hyper["eps1_squared"] = float(eps1) * float(eps1)
    flags = {
        "maximize": bool(o["maximize"]),
        "use_weight_decay": not is_zero(o["weight_decay"]),
        "eps1_from_dtype": eps1 is None,
    }
    return hyper, flags


def _factored(param: Any) -> bool:
    return jnp.ndim(param) > 1


def _init(param, hyper, **_) -> AdafactorState:
    shape = jnp.shape(param)
    step = jnp.zeros((), jnp.float32)
    if _factored(param):
        row = jnp.zeros((*shape[:-1], 1), param.dtype)
        col = jnp.zeros((*shape[:-2], 1, shape[-1]), param.dtype)
        return AdafactorState(step=step, row_var=row, col_var=col, variance=None)
    return AdafactorState(step=step, row_var=None, col_var=None, variance=jnp.zeros_like(param))


def _rms(x: Any) -> Any:
    """``||x||_2 / sqrt(numel(x))`` (torch: ``x.norm(2) / numel**0.5``)."""
    return jnp.sqrt(jnp.sum(x * x)) / math.sqrt(max(int(np.prod(jnp.shape(x))), 1))


def _mean_square(g: Any, axis: int) -> Any:
    """torch's ``norm(g, dim=axis, keepdim=True).square() / g.size(axis)``: the mean of
    ``g**2`` along ``axis`` through the same rounding steps."""
    norm = jnp.sqrt(jnp.sum(g * g, axis=axis, keepdims=True))
    return (norm * norm) / g.shape[axis]


def _update(param, grad, state, h, *, maximize, use_weight_decay, eps1_from_dtype, storage_dtype):
    g = -grad if maximize else grad
    step = state.step + 1
    t = step.astype(param.dtype)
    lr = h["lr"]
    if eps1_from_dtype:
        eps1 = jnp.asarray(jnp.finfo(storage_dtype).eps, param.dtype)
        eps1_squared = eps1 * eps1
    else:
        eps1 = guard(h["eps1"])
        eps1_squared = guard(h["eps1_squared"]) if "eps1_squared" in h else eps1 * eps1
    weight = t ** h["beta2_decay"]  # 1 - beta2_t, torch's lerp weight
    rho = jnp.minimum(lr, 1 / jnp.sqrt(t))
    # torch: Python's max(eps2, rms) of host floats, so a NaN RMS gives eps2
    alpha = host_max(h["eps2"], _rms(param)) * rho  # RMS before the weight decay
    if use_weight_decay:
        param = param * (1 - lr * h["weight_decay"])
    row_var = col_var = variance = None
    if _factored(param):
        row_var = lerp(state.row_var, _mean_square(g, -1), weight)
        col_var = lerp(state.col_var, _mean_square(g, -2), weight)
        row_scale = jnp.maximum(jnp.mean(row_var, axis=-2, keepdims=True), eps1)
        var_estimate = (row_var * col_var) / row_scale  # torch: row_var @ col_var, an outer product
    else:
        variance = lerp(state.variance, g * g, weight)
        var_estimate = variance
    update = jax.lax.rsqrt(jnp.maximum(var_estimate, eps1_squared)) * g
    # torch: max(1.0, rms) on the host: a NaN entry spoils its own parameter entry, not all
    clip = host_max(jnp.ones_like(alpha), _rms(update) / h["d"])
    new_param = param + (-alpha / clip) * update
    return new_param, AdafactorState(step, row_var, col_var, variance)


ADAFACTOR = Rule(
    name="Adafactor",
    state=AdafactorState,
    options=OptionSpec(
        validate=_validate_adafactor,
        split=_split,
        guarded=("eps[0]",),
    ),
    init=_init,
    update=_update,
    supports_complex=False,
    storage_dtype=True,
    execution=Execution(
        elementwise=False,
        batched=True,
    ),
)


ADAFACTOR_SIGNATURE = Signature(
    (
        lr(
            1e-2,
            "γ, the cap of the relative step size `ρ_t = min(γ, 1/√t)`, and the "
            "factor of the decoupled weight decay",
        ),
        Arg("beta2_decay", -0.8, Any, "τ in `β₂_t = 1 - t^τ` (at most 0)."),
        Arg(
            "eps",
            (None, 1e-3),
            tuple[Any, Any],
            "(ε₁, ε₂): the floor of the "
            "second-moment estimate (`None`: the parameter dtype's machine epsilon) and "
            "of the parameter's RMS.",
            convert=_as_pair,
        ),
        Arg("d", 1.0, Any, "the clipping threshold of the update's RMS (at least 1)."),
        weight_decay(0.0, decoupled=True),
        KEYWORD_ONLY,
        FOREACH,
        MAXIMIZE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.8419, -1.8419], dtype=float32)"),
)

adafactor = transform_of(
    ADAFACTOR,
    ADAFACTOR_SIGNATURE,
    "adafactor",
    """`torch.optim.Adafactor` as an optax transformation.

    The state's `row_var`/`col_var` hold `None` at vector leaves and `variance` at matrix
    leaves.

    Examples:
      >>> import jax.numpy as jnp, optax, lucid.functional as LF
      >>> params = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
      >>> tx = LF.adafactor(lr=1e-2)
      >>> state = tx.init(params)
      >>> grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.full(3, 0.5)}
      >>> updates, state = tx.update(grads, state, params)
      >>> [round(x, 4) for x in optax.apply_updates(params, updates)["b"].tolist()]
      [0.99, 0.99, 0.99]""",
)
