"""L-BFGS as a closure-less transform: one per-element Barzilai-Borwein step.

torch's ``LBFGS.step(closure)`` re-evaluates the loss up to ``max_iter`` times
per call; an optax transform sees one gradient per update and cannot. The
transform is therefore the closure-less single step of DESIGN.md: with ``P``
and ``G`` the parameters and gradient of the previous update (zeros at first),

$$
\\begin{aligned}
s &= p - P, \\qquad y = g - G, \\qquad
\\alpha = \\operatorname{clip}\\!\\left(\\frac{|s|}{|y| + 10^{-10}},\\, 0,\\, 10\\right) \\\\
d &= -g \\text{ on the first update,} \\quad d = -\\alpha\\, g \\text{ afterwards} \\\\
p &\\leftarrow p + \\gamma\\, d, \\qquad P, G \\leftarrow p, g \\text{ (before the update)}
\\end{aligned}
$$

``alpha`` is the elementwise secant estimate of the inverse curvature; with
``maximize`` (torch 2.15) ``g`` is the negated gradient throughout.
The full algorithm (closure, ``max_iter`` inner iterations, two-loop
recursion over ``history_size`` pairs, optional strong-Wolfe line search)
is ``lucid.optim.LBFGS``, which matches torch's iterates. This transform
accepts ``max_iter``, ``max_eval``, ``tolerance_grad``, ``tolerance_change``
and ``history_size`` for a drop-in signature and ignores them.

State: ``step`` (updates done), ``prev_param`` (``P``) and ``prev_grad``
(``G``). torch's LBFGS state has no per-element counterpart of ``P`` (its
``prev_flat_grad`` is the flattened ``G`` of the full algorithm), so the names
say what the fields hold.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from . import _validate
from ._signature import KEYWORD_ONLY, Arg, Example, Signature, lr, transform_of
from .rule import OptionSpec, Rule, SparseSpec

__all__ = [
    "LBFGSState",
    "lbfgs",
]

# DESIGN.md's constants: the denominator's guard and the largest step multiplier.
CURVATURE_EPS = 1e-10
MAX_ALPHA = 10.0

LINE_SEARCH_FNS = (None, "strong_wolfe")


class LBFGSState(NamedTuple):
    """The state of the closure-less L-BFGS step, one entry per parameter (torch's names).

    Attributes:
      step: updates done.
      prev_param: the parameter before the last update.
      prev_grad: the gradient of the last update.
    """

    step: Any
    prev_param: Any
    prev_grad: Any


def validate_lbfgs(o: dict) -> None:
    """torch's checks: ``Invalid learning rate: -1`` (``0 <= lr``), and
    ``line_search_fn`` None or ``'strong_wolfe'``.

    torch's constructor stores any ``line_search_fn`` and raises
    ``RuntimeError("only 'strong_wolfe' is supported")`` at the first
    ``step``; a transform never runs a line search, so the same condition is
    checked here, at construction, as a ``ValueError``.
    """
    _validate.lr(o["lr"])
    if o["line_search_fn"] not in LINE_SEARCH_FNS:
        raise ValueError(
            f"Invalid line_search_fn: {o['line_search_fn']!r}: only 'strong_wolfe' is supported"
        )


def _split(o: dict) -> tuple[dict, dict]:
    return {"lr": o["lr"]}, {"maximize": bool(o["maximize"])}


def _init(param, hyper, **_) -> LBFGSState:
    zeros = jnp.zeros_like(param)
    return LBFGSState(step=jnp.zeros((), jnp.float32), prev_param=zeros, prev_grad=zeros)


def _update(param, grad, state, h, *, maximize):
    grad = -grad if maximize else grad
    s = param - state.prev_param
    y = grad - state.prev_grad
    ratio = jnp.abs(s) / (jnp.abs(y) + CURVATURE_EPS)
    # bounds as arrays of the compute dtype: Python floats would enter jnp.clip's jit as
    # float64 scalars when x64 is on
    alpha = jnp.clip(ratio, jnp.zeros((), ratio.dtype), jnp.asarray(MAX_ALPHA, ratio.dtype))
    direction = jnp.where(state.step == 0, -grad, -alpha * grad)
    new_param = param + h["lr"] * direction
    return new_param, LBFGSState(step=state.step + 1, prev_param=param, prev_grad=grad)


def _update_sparse(param, grad, state, h, *, maximize):
    """torch's LBFGS reads a sparse gradient densified; so does this step."""
    return _update(param, grad.todense().astype(param.dtype), state, h, maximize=maximize)


LBFGS = Rule(
    name="LBFGS",
    state=LBFGSState,
    options=OptionSpec(
        validate=validate_lbfgs,
        split=_split,
    ),
    init=_init,
    update=_update,
    sparse=SparseSpec(
        update=_update_sparse,
    ),
)


def _default_max_eval(options: dict[str, Any]) -> dict[str, Any]:
    """torch's default ``max_eval``: ``max_iter * 5 // 4``."""
    if options["max_eval"] is None:
        return {**options, "max_eval": options["max_iter"] * 5 // 4}
    return options


LBFGS_SIGNATURE = Signature(
    (
        lr(1, "γ, the step length before any line search"),
        Arg(
            "max_iter",
            20,
            int,
            "iterations per `step(closure)` (the full algorithm, "
            "`lucid.optim.LBFGS`; ignored by the transform).",
        ),
        Arg(
            "max_eval",
            None,
            int | None,
            "closure evaluations per `step` (default "
            "`max_iter * 5 // 4`; ignored by the transform).",
        ),
        Arg(
            "tolerance_grad",
            1e-7,
            float,
            "stop when the gradient's largest absolute "
            "entry is at most this (ignored by the transform).",
        ),
        Arg(
            "tolerance_change",
            1e-9,
            float,
            "stop when the loss or the step changes by at most this (ignored by the transform).",
        ),
        Arg(
            "history_size",
            100,
            int,
            "curvature pairs kept for the inverse-Hessian estimate (ignored by the transform).",
        ),
        Arg(
            "line_search_fn",
            None,
            str | None,
            "`None` or `'strong_wolfe'` (validated, and ignored by the transform).",
        ),
        KEYWORD_ONLY,
        Arg(
            "maximize",
            False,
            bool,
            "ascend the objective instead of descending (torch 2.15; torch 2.13's LBFGS has "
            "no `maximize`): the gradient and the closure's loss are negated inside, `step` "
            "still returns the closure's own value, and the state's `prev_loss` holds the "
            "negated loss.",
        ),
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"),
    complete=_default_max_eval,
)

lbfgs = transform_of(
    LBFGS,
    LBFGS_SIGNATURE,
    "lbfgs",
    """`torch.optim.LBFGS`'s signature; the update is the per-element Barzilai-Borwein
    step above (the full algorithm, with a closure, is `lucid.optim.LBFGS`).""",
)
