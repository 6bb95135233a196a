"""Shampoo (``pytorch_optimizer.Shampoo``, pytorch-optimizer 4.1): Kronecker-factored
preconditioning by inverse matrix roots.

Gupta, Koren and Singer, *Shampoo: Preconditioned Stochastic Tensor Optimization* (2018).
For a parameter of order ``k`` (its number of axes) each axis ``i`` of size ``d_i`` keeps a
statistic ``H_i`` (``pre_cond_i``) and its inverse root ``R_i`` (``inv_pre_cond_i``). With
``g`` the gradient (negated when ``maximize``), ``b`` the momentum buffer, ``t`` the step
(from 1) and ``G ×_i M`` the product of axis ``i`` with ``M``'s rows (``M``'s columns on the
last axis, as the reference multiplies ``g^T R``):

$$
\\begin{aligned}
H_i^{(0)} &= ε I, \\qquad R_i^{(0)} = 0, \\qquad b^{(0)} = g^{(1)} \\text{ (with momentum)} \\\\
g &\\leftarrow \\mathrm{lerp}(g, b, μ) \\text{ (if } μ > 0), \\qquad
g \\leftarrow g + λ p \\text{ (coupled) or } p \\leftarrow p\\,(1 - λγ)
    \\text{ (}(1 - λ) \\text{ with fixed\\_decay)} \\\\
H_i &\\leftarrow H_i + g_{(i)} g_{(i)}^T, \\qquad
R_i \\leftarrow H_i^{-1/(2k)} \\text{ every } f \\text{ steps } (t \\bmod f = 0) \\\\
u &= g ×_1 R_1 ×_2 \\dots ×_k R_k, \\qquad b \\leftarrow u, \\qquad p \\leftarrow p - γ u
\\end{aligned}
$$

``g_(i)`` is ``g`` unfolded along axis ``i``, ``f`` is ``preconditioning_compute_steps`` and
``ε`` is ``matrix_eps``. The inverse root is the reference's ``compute_power_svd``: an SVD
``H = U S V^T`` and ``U S^{-1/(2k)} V^T``, in the parameter's compute dtype. The buffer
``b`` holds the last preconditioned update whatever ``μ`` (the reference's), and until the
first inverse root (``t < f``) ``R_i = 0``: the parameter moves only by its weight decay.

The reference counts steps per group (``group['step']``); lucid per parameter (a hidden
``step``), the same count while every parameter has a gradient at every step. Each axis's
matrices are their own state fields (``pre_cond_0``, ``inv_pre_cond_0``, ...; up to 8
axes), named as the reference names its state entries. The inverse roots are computed
under a ``lax.cond`` inside the step: a compiled step is one program for every step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from . import _pytorch_optimizer as _check
from ._apply import is_number, is_zero
from ._math import lerp
from ._signature import Arg, Example, Signature, lr, transform_of
from .rule import Execution, FieldSpec, OptionSpec, Rule

__all__ = [
    "MAX_ORDER",
    "ShampooState",
    "shampoo",
]

MAX_ORDER = 8
"""The most axes a parameter may have (one statistic and one root per axis)."""


class ShampooState(NamedTuple):
    """The state of pytorch_optimizer's Shampoo, one entry per parameter (its names).

    Attributes:
      step: steps taken with a gradient (float32; the reference keeps it per group).
      momentum_buffer: the last preconditioned update (the first gradient, before the
        first step, with momentum), shaped as the parameter.
      pre_cond_0: axis 0's statistic ``H_0`` (``d_0 x d_0``); `None` past the
        parameter's order.
      pre_cond_1: axis 1's statistic ``H_1`` (``d_1 x d_1``); `None` past the
        parameter's order.
      pre_cond_2: axis 2's statistic ``H_2`` (``d_2 x d_2``); `None` past the
        parameter's order.
      pre_cond_3: axis 3's statistic ``H_3`` (``d_3 x d_3``); `None` past the
        parameter's order.
      pre_cond_4: axis 4's statistic ``H_4`` (``d_4 x d_4``); `None` past the
        parameter's order.
      pre_cond_5: axis 5's statistic ``H_5`` (``d_5 x d_5``); `None` past the
        parameter's order.
      pre_cond_6: axis 6's statistic ``H_6`` (``d_6 x d_6``); `None` past the
        parameter's order.
      pre_cond_7: axis 7's statistic ``H_7`` (``d_7 x d_7``); `None` past the
        parameter's order.
      inv_pre_cond_0: axis 0's inverse root ``R_0``; `None` past the parameter's order.
      inv_pre_cond_1: axis 1's inverse root ``R_1``; `None` past the parameter's order.
      inv_pre_cond_2: axis 2's inverse root ``R_2``; `None` past the parameter's order.
      inv_pre_cond_3: axis 3's inverse root ``R_3``; `None` past the parameter's order.
      inv_pre_cond_4: axis 4's inverse root ``R_4``; `None` past the parameter's order.
      inv_pre_cond_5: axis 5's inverse root ``R_5``; `None` past the parameter's order.
      inv_pre_cond_6: axis 6's inverse root ``R_6``; `None` past the parameter's order.
      inv_pre_cond_7: axis 7's inverse root ``R_7``; `None` past the parameter's order.
    """

    step: Any
    momentum_buffer: Any
    pre_cond_0: Any = None
    pre_cond_1: Any = None
    pre_cond_2: Any = None
    pre_cond_3: Any = None
    pre_cond_4: Any = None
    pre_cond_5: Any = None
    pre_cond_6: Any = None
    pre_cond_7: Any = None
    inv_pre_cond_0: Any = None
    inv_pre_cond_1: Any = None
    inv_pre_cond_2: Any = None
    inv_pre_cond_3: Any = None
    inv_pre_cond_4: Any = None
    inv_pre_cond_5: Any = None
    inv_pre_cond_6: Any = None
    inv_pre_cond_7: Any = None


def _validate(o: dict) -> None:
    """The reference's constructor checks, in its order and words."""
    _check.learning_rate(o["lr"])
    _check.in_range(o["momentum"], "momentum", 0.0, 1.0)
    _check.non_negative(o["weight_decay"], "weight_decay")
    _check.step_count(o["preconditioning_compute_steps"], "preconditioning_compute_steps")
    _check.non_negative(o["matrix_eps"], "matrix_eps")
    _check.integer(o["preconditioning_compute_steps"], "preconditioning_compute_steps")


def _split(o: dict) -> tuple[dict, dict]:
    hyper = {
        "lr": o["lr"],
        "momentum": o["momentum"],
        "weight_decay": o["weight_decay"],
        "matrix_eps": o["matrix_eps"],
        "preconditioning_compute_steps": o["preconditioning_compute_steps"],
    }
    momentum, decay = o["momentum"], o["weight_decay"]
    flags = {
        "use_momentum": not is_number(momentum) or momentum > 0.0,
        "use_weight_decay": not is_zero(decay),
        "weight_decouple": bool(o["weight_decouple"]),
        "fixed_decay": bool(o["fixed_decay"]),
        "maximize": bool(o["maximize"]),
    }
    return hyper, flags


def _order(shape: tuple) -> int:
    if len(shape) > MAX_ORDER:
        raise ValueError(
            f"Shampoo keeps one preconditioner per axis for parameters of at most {MAX_ORDER} "
            f"axes; this one has shape {shape} ({len(shape)} axes): reshape it, or give it "
            "to another optimizer"
        )
    return len(shape)


def _init(param: Any, hyper: dict, **_: Any) -> ShampooState:
    shape = tuple(jnp.shape(param))
    fields: dict[str, Any] = {}
    for i in range(_order(shape)):
        d = shape[i]
        fields[f"pre_cond_{i}"] = jnp.eye(d, dtype=param.dtype) * hyper["matrix_eps"].astype(
            param.dtype
        )
        fields[f"inv_pre_cond_{i}"] = jnp.zeros((d, d), param.dtype)
    return ShampooState(
        step=jnp.zeros((), jnp.float32), momentum_buffer=jnp.zeros_like(param), **fields
    )


def inverse_root(matrix: Any, power: float) -> Any:
    """The reference's ``compute_power_svd``: ``U S^{-1/power} V^T`` from an SVD.

    Args:
      matrix: a symmetric positive semidefinite matrix.
      power: the root's order.

    Returns:
      ``matrix ** (-1 / power)``, in ``matrix``'s dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> inverse_root(jnp.diag(jnp.array([16.0, 1.0])), 4).round(4).tolist()
      [[0.5, 0.0], [0.0, 1.0]]
    """
    u, s, vh = jnp.linalg.svd(matrix, full_matrices=False)
    return (u * (s ** (-1.0 / power))[None, :]) @ vh


def _outer(g: Any, axis: int) -> Any:
    others = [a for a in range(g.ndim) if a != axis]
    return jnp.tensordot(g, g, axes=(others, others))


def _update(param, grad, state, h, **flags):
    shape = tuple(param.shape)
    order = _order(shape)
    g = -grad if flags["maximize"] else grad
    lr = h["lr"]
    if flags["use_momentum"]:
        # the reference clones the (un-negated) gradient as the buffer at the first step
        buffer = jnp.where(state.step == 0, grad, state.momentum_buffer)
        g = lerp(g, buffer, h["momentum"])
    if flags["use_weight_decay"]:
        if flags["weight_decouple"]:
            rate = h["weight_decay"] if flags["fixed_decay"] else h["weight_decay"] * lr
            param = param * (1 - rate)
        else:
            g = g + h["weight_decay"] * param
    step = state.step + 1
    stats = [
        getattr(state, f"pre_cond_{i}") + _outer(g, i).astype(param.dtype) for i in range(order)
    ]
    roots = [getattr(state, f"inv_pre_cond_{i}") for i in range(order)]
    if order:
        due = jnp.mod(step, h["preconditioning_compute_steps"].astype(step.dtype)) == 0
        roots = jax.lax.cond(
            due,
            lambda _: [inverse_root(m, 2 * order).astype(m.dtype) for m in stats],
            lambda old: list(old),
            roots,
        )
    u = g
    for i, root in enumerate(roots):
        if i == order - 1:
            u = jnp.tensordot(u, root, axes=([i], [0]))
        else:
            u = jnp.moveaxis(jnp.tensordot(root, u, axes=([1], [i])), 0, i)
    fields = {f"pre_cond_{i}": m for i, m in enumerate(stats)}
    fields.update({f"inv_pre_cond_{i}": r for i, r in enumerate(roots)})
    new_param = param + (-lr) * u
    return new_param, state._replace(step=step, momentum_buffer=u, **fields)


SHAMPOO = Rule(
    name="Shampoo",
    state=ShampooState,
    options=OptionSpec(
        validate=_validate,
        split=_split,
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        hidden={"step": 0.0},
    ),
    supports_complex=False,
    execution=Execution(
        elementwise=False,
        whole_per_device=True,
    ),
)


SHAMPOO_SIGNATURE = Signature(
    (
        lr(1e-3),
        Arg(
            "momentum",
            0.0,
            Any,
            "μ: the gradient is first `lerp(g, b, μ)` with the last update `b` (if μ > 0).",
        ),
        Arg(
            "weight_decay",
            0.0,
            Any,
            "λ: L2 penalty `g ← g + λ p`, or with `weight_decouple` `p ← p (1 - γ λ)`.",
        ),
        Arg(
            "weight_decouple",
            False,
            bool,
            "decoupled weight decay (`p ← p (1 - γ λ)` before the update).",
        ),
        Arg("fixed_decay", False, bool, "with `weight_decouple`: `p ← p (1 - λ)` (no γ)."),
        Arg(
            "preconditioning_compute_steps",
            1,
            Any,
            "f: the inverse roots are recomputed at every f-th step (the first at step f).",
        ),
        Arg("matrix_eps", 1e-6, Any, "ε: each statistic starts as `ε I`."),
        Arg("maximize", False, bool, "maximize the objective: the gradient is negated."),
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9553, -1.9106], dtype=float32)"),
)

shampoo = transform_of(
    SHAMPOO,
    SHAMPOO_SIGNATURE,
    "shampoo",
    """`pytorch_optimizer.Shampoo` (pytorch-optimizer 4.1) as an optax transformation.

    Each state field holds one entry per leaf; `pre_cond_i` and `inv_pre_cond_i` hold
    `None` at leaves of fewer than `i + 1` axes.

    Examples:
      >>> import jax.numpy as jnp, optax, lucid.functional as LF
      >>> params = {"w": jnp.ones((2, 3))}
      >>> tx = LF.shampoo(lr=0.1)
      >>> state = tx.init(params)
      >>> updates, state = tx.update({"w": jnp.ones((2, 3))}, state, params)
      >>> state.pre_cond_0["w"].shape, state.inv_pre_cond_1["w"].shape
      ((2, 2), (3, 3))""",
)
