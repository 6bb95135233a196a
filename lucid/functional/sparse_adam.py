"""SparseAdam: Adam with lazy moments (``torch.optim.SparseAdam``).

Only the gradient's *present* entries change: the stored indices of a
``jax.experimental.sparse.BCOO`` gradient (duplicates summed, as torch's
``coalesce`` does), or the nonzero entries of a dense gradient. With ``g`` the
gradient (negated when ``maximize``), ``t`` the parameter's step counter and
``present`` that mask:

$$
\\begin{aligned}
m &\\leftarrow m + (1-\\beta_1)(g - m), \\qquad
v \\leftarrow v + (1-\\beta_2)(g^2 - v) \\\\
p &\\leftarrow p - \\gamma\\,\\frac{\\sqrt{1-\\beta_2^t}}{1-\\beta_1^t}\\,
    \\frac{m}{\\sqrt{v} + \\epsilon}
\\qquad\\text{(all three where present; unchanged elsewhere)}
\\end{aligned}
$$

Unlike Adam, ``eps`` is added to the *uncorrected* ``sqrt(v)``, and the bias
corrections use the parameter's own step counter, which counts every update
of the parameter, also one whose gradient has no present entry (torch counts
it before it skips an empty gradient). torch keeps that counter as a Python
int; here it is a float32 0-d array like every other rule's ``step``.

A BCOO gradient is handled in O(nnz log nnz): param, ``exp_avg`` and
``exp_avg_sq`` are gathered at the stored indices, updated by the same
elementwise rule and scattered back; padding (out-of-bounds indices holding
zero: ``sum_duplicates`` under ``jax.jit`` pads with the shape as index) is
dropped. A *nonzero* value at an out-of-bounds index is torch's ``IndexError``,
raised before anything changes wherever the gradient is concrete (not while
tracing). No cumulative sum is involved, so the same program runs on Apple
GPUs. The update handed to optax is dense.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from . import _validate
from ._math import guard, one_minus_pow
from ._signature import MAXIMIZE, Example, Signature, betas, eps, lr, transform_of
from ._sparse import coalesced, unbatched
from .rule import OptionSpec, Rule, SparseSpec

__all__ = [
    "SparseAdamState",
    "sparse_adam",
]

Array = jax.Array


class SparseAdamState(NamedTuple):
    """The state of torch.optim.SparseAdam, one entry per parameter (torch's names).

    Attributes:
      step: updates done.
      exp_avg: m, the average of the gradient (updated where the gradient is present).
      exp_avg_sq: v, the average of the squared gradient (updated where present).
    """

    step: Any
    exp_avg: Any
    exp_avg_sq: Any


def _validate_sparse_adam(o: dict) -> None:
    """torch's constructor checks, in its order: ``0 < lr``, ``0 < eps``, betas in [0, 1)."""
    _validate.positive(o["lr"], "learning rate", name="lr")
    _validate.positive(o["eps"], "epsilon value")
    _validate.betas(o["betas"])


def _split(o: dict) -> tuple[dict, dict]:
    beta1, beta2 = o["betas"]
    hyper = {"lr": o["lr"], "beta1": beta1, "beta2": beta2, "eps": o["eps"]}
    return hyper, {"maximize": bool(o["maximize"])}


def _init(param, hyper, **_) -> SparseAdamState:
    zeros = jnp.zeros_like(param)
    return SparseAdamState(step=jnp.zeros((), jnp.float32), exp_avg=zeros, exp_avg_sq=zeros)


def lazy_adam(
    param: Array, grad: Array, present: Array, state: SparseAdamState, h: dict, *, maximize: bool
) -> tuple[Array, SparseAdamState]:
    """torch's SparseAdam arithmetic, elementwise, applied where ``present``.

    Order of operations as ``torch.optim._functional.sparse_adam``:
    ``exp_avg += (g - exp_avg) * (1 - beta1)``, the same for ``exp_avg_sq`` with
    ``g*g``, then ``param += -step_size * (exp_avg / (sqrt(exp_avg_sq) + eps))``.
    ``state.step`` is the counter before this update; it is incremented here.
    """
    step = state.step + 1
    t = step.astype(param.dtype)
    g = -grad if maximize else grad
    exp_avg = state.exp_avg + (g - state.exp_avg) * h["one_minus_beta1"]
    exp_avg_sq = state.exp_avg_sq + (g * g - state.exp_avg_sq) * h["one_minus_beta2"]
    denom = jnp.sqrt(exp_avg_sq) + guard(h["eps"])
    bias_correction1 = one_minus_pow(h["one_minus_beta1"], t)
    bias_correction2 = one_minus_pow(h["one_minus_beta2"], t)
    step_size = h["lr"] * jnp.sqrt(bias_correction2) / bias_correction1
    new_param = param + (-step_size) * (exp_avg / denom)
    return jnp.where(present, new_param, param), SparseAdamState(
        step=step,
        exp_avg=jnp.where(present, exp_avg, state.exp_avg),
        exp_avg_sq=jnp.where(present, exp_avg_sq, state.exp_avg_sq),
    )


def _update(param, grad, state, h, *, maximize):
    """Dense gradient: its nonzero entries are the present ones."""
    return lazy_adam(param, grad, grad != 0, state, h, maximize=maximize)


def _update_sparse(param, grad, state, h, *, maximize):
    """BCOO gradient: the rule at its stored indices only (gather, update, scatter).

    Compiled as one function even when called eagerly: op by op, the sorting and
    de-duplication of the indices would dispatch (and compile) dozens of small ops.
    """
    from jax.experimental import sparse  # only reached with a sparse gradient: already imported

    if not isinstance(grad, sparse.BCOO):
        raise TypeError(
            f"lucid.functional.sparse_adam takes dense or BCOO gradients, got {type(grad).__name__}"
        )
    return _update_bcoo(param, grad, state, h, maximize=maximize)


@functools.partial(jax.jit, static_argnames=("maximize",))
def _update_bcoo(param, grad, state, h, *, maximize):
    grad = unbatched(grad)
    if grad.nse == 0:  # torch skips an empty gradient but still counts the step
        return param, state._replace(step=state.step + 1)
    if grad.n_sparse == 0:  # every entry stored: the summed values are a dense gradient
        dense = grad.data.astype(param.dtype).sum(0)
        return lazy_adam(param, dense, jnp.ones(param.shape, bool), state, h, maximize=maximize)

    return _lazy_adam_at_entries(param, grad.indices, grad.data, state, h, maximize=maximize)


def _lazy_adam_at_entries(param, indices, data, state, h, *, maximize):
    """The rule at a BCOO gradient's entries, duplicates summed (`_sparse.coalesced`):
    param, ``exp_avg`` and ``exp_avg_sq`` gathered there, updated, and scattered back
    (every entry of a run of equal indices computes the same new value, so the
    scatter's duplicate writes agree)."""
    at, summed, any_valid = coalesced(indices, data, param.shape, param.dtype)
    present = jnp.broadcast_to(any_valid, summed.shape)
    new_values, new_state = lazy_adam(
        param[at],
        summed,
        present,
        SparseAdamState(state.step, state.exp_avg[at], state.exp_avg_sq[at]),
        h,
        maximize=maximize,
    )

    def scatter(dense: Array, new: Array) -> Array:
        return dense.at[at].set(new, mode="promise_in_bounds")

    return scatter(param, new_values), SparseAdamState(
        step=new_state.step,
        exp_avg=scatter(state.exp_avg, new_state.exp_avg),
        exp_avg_sq=scatter(state.exp_avg_sq, new_state.exp_avg_sq),
    )


SPARSE_ADAM = Rule(
    name="SparseAdam",
    state=SparseAdamState,
    options=OptionSpec(
        validate=_validate_sparse_adam,
        split=_split,
        complements=("beta1", "beta2"),
        guarded=("eps",),
    ),
    init=_init,
    update=_update,
    sparse=SparseSpec(
        update=_update_sparse,
        masked_update=lazy_adam,
    ),
    supports_complex=False,
)


SPARSE_ADAM_SIGNATURE = Signature(
    (
        lr(1e-3),
        betas(
            (0.9, 0.999),
            "(β₁, β₂): decay rates of the averages of the gradient (m) and "
            "of its square (v), updated only where the gradient is present.",
        ),
        eps(1e-8, "to √v after its bias correction"),
        MAXIMIZE,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, 0.0]", "Array([ 0.9, -2. ], dtype=float32)"),
)

sparse_adam = transform_of(
    SPARSE_ADAM,
    SPARSE_ADAM_SIGNATURE,
    "sparse_adam",
    """`torch.optim.SparseAdam` as an optax transformation.

    Gradients may be dense arrays (present entries: the nonzeros) or
    `jax.experimental.sparse.BCOO` arrays (present entries: the stored indices), mixed
    freely within one gradient tree.""",
    raises="IndexError: a sparse gradient's index outside its parameter (torch's error).",
)
