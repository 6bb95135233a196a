"""SOAP (``pytorch_optimizer.SOAP``, pytorch-optimizer 4.1): Adam in Shampoo's eigenbasis.

Vyas et al., *SOAP: Improving and Stabilizing Shampoo using Adam* (2024). For a
parameter whose (merged) axes are ``1..k``, each preconditioned axis ``i`` keeps a
statistic ``L_i`` (``GG[i]``, ``d_i x d_i``) and an orthogonal basis ``Q_i`` (``Q[i]``);
``G ×_i M`` is the product over axis ``i`` (``tensordot``), ``P(G) = G ×_1 Q_1 ... ×_k
Q_k`` the projection into the eigenbasis and ``P^{-1}(G) = G ×_1 Q_1^T ... ×_k Q_k^T``
its inverse (an axis without a preconditioner is left as it is). With ``g`` the gradient
(negated when ``maximize``), ``s`` the number of earlier steps and ``β_s`` the
``shampoo_beta`` (``β₂`` when ``None``):

$$
\\begin{aligned}
\\text{first step } (s = 0):&\\quad L_i = (1-β_s)\\,g_{(i)} g_{(i)}^T, \\quad
    Q_i = \\mathrm{eigh}(L_i + 10^{-30} I) \\text{ (eigenvalues descending)},
    \\quad p \\text{ unchanged} \\\\
\\text{then:}&\\quad m \\leftarrow \\mathrm{lerp}(m, g, 1-β_1), \\quad
    v \\leftarrow \\mathrm{lerp}(v, P(g)^2, 1-β_2) \\\\
&\\quad u = P^{-1}\\big(P(m) / (\\sqrt v + ε)\\big), \\quad
    u \\leftarrow u / (\\sqrt{\\mathrm{mean}(u^2)} + ε) \\text{ (normalize\\_gradient)} \\\\
&\\quad p \\leftarrow p - γ\\,\\frac{\\sqrt{1-β_2^s}}{1-β_1^s}\\,u
    \\text{ (the factor only with correct\\_bias)}, \\quad
    p \\leftarrow p\\,(1 - γλ) \\\\
&\\quad L_i \\leftarrow \\mathrm{lerp}(L_i, g_{(i)} g_{(i)}^T, 1-β_s) \\\\
\\text{every } f \\text{ steps } (s \\bmod f = 0):&\\quad
    M_i = L_i Q_i, \\ \\hat λ = \\mathrm{diag}(Q_i^T M_i), \\ π = \\mathrm{argsort}(-\\hat λ),
    \\ v \\leftarrow v_{[π \\text{ on axis } i]}, \\ Q_i = \\mathrm{qr}(M_{i,[:, π]})_Q
\\end{aligned}
$$

``g_(i)`` is ``g`` unfolded along axis ``i``, ``f`` is ``precondition_frequency``. An axis
longer than ``max_precondition_dim`` has no preconditioner, and neither has a vector
unless ``precondition_1d``. ``merge_dims`` first reshapes the parameter as the reference's
``merge_small_dims`` does (neighbouring axes multiplied together while the product stays
at most ``max_precondition_dim``), after moving the channels of a 4-D parameter first when
``data_format='channels_last'``. The QR step runs in float32 for every parameter dtype, as
the reference casts it; everything else runs in the parameter's compute dtype.

The reference's choices this rule follows: the first step only builds the preconditioner;
the weight decay comes after the update (``p·(1-γλ)`` of the new ``p``); ``shampoo_beta``
and ``precondition_frequency`` are read once, when the state is made, and kept in it; the
refresh reorders ``v`` along with the eigenvectors. The reference counts steps per
parameter group (``group['step']``); lucid counts them per parameter (a hidden ``step``),
which is the same count whenever every parameter of a group has a gradient at every step.

The statistics and bases of one parameter are kept end to end in one flat array each
(``GG`` and ``Q``), with ``dims`` (hidden from the state_dict) giving each axis's size, 0
for an axis without one; `preconditioners` cuts them back into matrices, and
`lucid.optim.SOAP`'s state_dict shows the reference's lists. The refresh schedule is a
``lax.cond`` inside the step: a compiled step is one program for every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _pytorch_optimizer as _check
from ._apply import is_zero
from ._math import lerp, one_minus_pow
from ._signature import Arg, Example, Signature, betas, lr, transform_of
from .rule import Execution, FieldSpec, OptionSpec, Rule

__all__ = [
    "SOAPState",
    "merge_small_dims",
    "preconditioners",
    "soap",
]


class SOAPState(NamedTuple):
    """The state of pytorch_optimizer's SOAP, one entry per parameter.

    Attributes:
      step: steps taken with a gradient (float32; the reference keeps it per group, as
        ``group['step']``, not in the state).
      exp_avg: the first moment m, shaped as the parameter.
      exp_avg_sq: the second moment v in the eigenbasis, shaped as the parameter.
      GG: the statistics ``L_i`` of the preconditioned axes, flattened end to end.
      Q: their eigenbases ``Q_i``, laid out as ``GG``.
      precondition_frequency: the refresh period read when the state was made.
      shampoo_beta: β_s read when the state was made (β₂ for ``shampoo_beta=None``).
      dims: (int32) each axis's preconditioner size, 0 for none: the layout of ``GG`` and
        ``Q`` (hidden from the state_dict, which shows them as lists).
    """

    step: Any
    exp_avg: Any
    exp_avg_sq: Any
    GG: Any
    Q: Any
    precondition_frequency: Any
    shampoo_beta: Any
    dims: Any


def merge_small_dims(shape: Sequence[int], max_dim: int) -> list[int]:
    """The reference's ``merge_small_dims``: neighbouring axes multiplied together while
    the product stays at most ``max_dim``; ``[1]`` when everything merges into one.

    Args:
      shape: the shape to merge.
      max_dim: the largest merged size.

    Returns:
      The merged shape.

    Examples:
      >>> merge_small_dims([1, 2, 512, 1, 2048, 1, 3, 4], 1024)
      [1024, 2048, 12]
      >>> merge_small_dims([4, 6], 100)
      [1]
    """
    merged: list[int] = []
    product = 1
    for dim in shape:
        product *= dim
        if product > max_dim:
            merged.append(product // dim)
            product = dim
    merged.append(product)
    return merged if len(merged) > 1 else [1]


def _channels_first(shape: Sequence[int], channels_last: bool) -> tuple[int, ...]:
    if channels_last and len(shape) == 4:
        return (shape[0], shape[3], shape[1], shape[2])
    return tuple(shape)


def _work_shape(shape: Sequence[int], flags: dict) -> tuple[int, ...]:
    """The shape the preconditioners act on (merged, channels first, with
    ``merge_dims``), or refuse a merge the reference's reshape fails on."""
    if not flags["merge_dims"]:
        return tuple(shape)
    base = _channels_first(shape, flags["channels_last"])
    work = tuple(merge_small_dims(base, flags["max_precondition_dim"]))
    size = int(np.prod(shape, dtype=np.int64))
    if int(np.prod(work, dtype=np.int64)) != size:
        raise RuntimeError(
            f"shape '{list(work)}' is invalid for input of size {size}: SOAP's merge_dims "
            f"merges every axis of a parameter of shape {tuple(shape)} into one, which the "
            "reference's merge_small_dims gives as [1] and its reshape then refuses (torch "
            "raises this RuntimeError); use merge_dims=False for this parameter's group, "
            "or a max_precondition_dim below its size"
        )
    return work


def entries(shape: Sequence[int], flags: dict) -> tuple[int, ...]:
    """The reference's ``GG`` list for a parameter: one entry per (merged) axis, its
    preconditioner's size, or 0 where it has none."""
    top = flags["max_precondition_dim"]
    if len(shape) == 1:
        return (shape[0] if flags["precondition_1d"] and shape[0] <= top else 0,)
    return tuple(d if d <= top else 0 for d in _work_shape(shape, flags))


def preconditioners(flat: Any, dims: Sequence[int]) -> list[Any]:
    """The matrices laid end to end in a `SOAPState`'s ``GG`` or ``Q``: one ``d x d``
    array per axis with a preconditioner, ``None`` for an axis without.

    Args:
      flat: the flat ``GG`` or ``Q`` of one parameter.
      dims: its ``dims`` (each axis's size, 0 for none).

    Returns:
      A list with one entry per axis.

    Examples:
      >>> import jax.numpy as jnp
      >>> [None if m is None else m.shape for m in preconditioners(jnp.zeros(13), [2, 0, 3])]
      [(2, 2), None, (3, 3)]
    """
    out: list[Any] = []
    start = 0
    for d in (int(d) for d in dims):
        if d == 0:
            out.append(None)
            continue
        out.append(jnp.reshape(flat[start : start + d * d], (d, d)))
        start += d * d
    return out


def _flatten(matrices: Sequence[Any], dtype: Any) -> Any:
    parts = [jnp.ravel(m) for m in matrices if m is not None]
    return jnp.concatenate(parts) if parts else jnp.zeros((0,), dtype)


def _to_work(x: Any, shape: tuple, flags: dict) -> Any:
    if flags["merge_dims"] and flags["channels_last"] and len(shape) == 4:
        x = jnp.transpose(x, (0, 3, 1, 2))
    return jnp.reshape(x, _work_shape(shape, flags))


def _from_work(x: Any, shape: tuple, flags: dict) -> Any:
    if flags["merge_dims"] and flags["channels_last"] and len(shape) == 4:
        permuted = _channels_first(shape, True)
        return jnp.transpose(jnp.reshape(x, permuted), (0, 2, 3, 1))
    return jnp.reshape(x, shape)


def _project(x: Any, bases: list, shape: tuple, flags: dict, back: bool = False) -> Any:
    """``P(x)`` (or ``P^{-1}(x)``): over each entry in turn, the product with its basis
    on the first axis (which moves last), or the axis moved last unchanged."""
    x = _to_work(x, shape, flags)
    for q in bases:
        if q is None:
            x = jnp.moveaxis(x, 0, -1)
        else:
            x = jnp.tensordot(x, q, axes=([0], [1 if back else 0]))
    return _from_work(x, shape, flags)


def _outer(g: Any, axis: int) -> Any:
    """``g_(i) g_(i)^T``: ``g`` contracted with itself over every axis but ``axis``."""
    others = [a for a in range(g.ndim) if a != axis]
    return jnp.tensordot(g, g, axes=(others, others))


def _accumulate(stats: list, g: Any, weight: Any, shape: tuple, flags: dict) -> list:
    work = g if len(shape) == 1 else _to_work(g, shape, flags)
    return [
        None if m is None else lerp(m, _outer(work, i).astype(m.dtype), weight)
        for i, m in enumerate(stats)
    ]


def _eigenbases(stats: list) -> list:
    """The reference's first bases: ``eigh(L + 1e-30 I)``'s eigenvectors, the largest
    eigenvalue's first (LAPACK's lower triangle, as torch reads it)."""
    out = []
    for m in stats:
        if m is None:
            out.append(None)
            continue
        eye = jnp.eye(m.shape[0], dtype=m.dtype)
        vectors, _ = jax.lax.linalg.eigh(m + 1e-30 * eye, lower=True, symmetrize_input=False)
        out.append(jnp.flip(vectors, axis=1))
    return out


def _refresh(stats: list, bases: list, v: Any, shape: tuple, flags: dict) -> tuple[list, Any]:
    """One power iteration and a QR per axis, the eigenvalue estimates sorted
    descending and ``v`` reordered with them (the QR in float32, as the reference)."""
    v = _to_work(v, shape, flags)
    out = []
    for axis, (m, q) in enumerate(zip(stats, bases)):
        if m is None:
            out.append(None)
            continue
        product = m @ q
        estimate = jnp.sum(q * product, axis=0)
        order = jnp.argsort(-estimate)
        v = jnp.take(v, order, axis=axis)
        new, _ = jnp.linalg.qr(jnp.take(product, order, axis=1).astype(jnp.float32))
        out.append(new.astype(q.dtype))
    return out, _from_work(v, shape, flags)


def _split(o: dict) -> tuple[dict, dict]:
    beta1, beta2 = o["betas"]
    hyper = {
        "lr": o["lr"],
        "beta1": beta1,
        "beta2": beta2,
        "eps": o["eps"],
        "weight_decay": o["weight_decay"],
        "precondition_frequency": o["precondition_frequency"],
    }
    if o["shampoo_beta"] is not None:
        hyper["shampoo_beta"] = o["shampoo_beta"]
    flags = {
        "max_precondition_dim": int(o["max_precondition_dim"]),
        "merge_dims": bool(o["merge_dims"]),
        "precondition_1d": bool(o["precondition_1d"]),
        "correct_bias": bool(o["correct_bias"]),
        "normalize_gradient": bool(o["normalize_gradient"]),
        "channels_last": o["data_format"] == "channels_last",
        "maximize": bool(o["maximize"]),
        "use_weight_decay": not is_zero(o["weight_decay"]),
    }
    return hyper, flags


def _validate(o: dict) -> None:
    """The reference's constructor checks, in its order and words."""
    _check.learning_rate(o["lr"])
    pair = o["betas"]
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2), got {pair!r}")
    _check.in_range(pair[0], "beta1", 0.0, 1.0)
    _check.in_range(pair[1], "beta2", 0.0, 1.0)
    _check.non_negative(o["shampoo_beta"], "shampoo_beta")
    _check.non_negative(o["weight_decay"], "weight_decay")
    _check.positive(o["precondition_frequency"], "precondition_frequency")
    _check.positive(o["max_precondition_dim"], "max_precondition_dim")
    _check.non_negative(o["eps"], "eps")
    _check.integer(o["precondition_frequency"], "precondition_frequency")
    _check.integer(o["max_precondition_dim"], "max_precondition_dim")


def _init(param: Any, hyper: dict, **flags: Any) -> SOAPState:
    shape = tuple(jnp.shape(param))
    dims = entries(shape, flags)
    _work_shape(shape, flags)  # the reference's refusal, before any state exists
    size = sum(d * d for d in dims)
    return SOAPState(
        step=jnp.zeros((), jnp.float32),
        exp_avg=jnp.zeros_like(param),
        exp_avg_sq=jnp.zeros_like(param),
        GG=jnp.zeros((size,), param.dtype),
        Q=jnp.zeros((size,), param.dtype),
        precondition_frequency=jnp.asarray(hyper["precondition_frequency"]),
        shampoo_beta=jnp.asarray(hyper.get("shampoo_beta", hyper["beta2"])),
        dims=jnp.asarray(dims, jnp.int32),
    )


def _update(param, grad, state, h, **flags):
    shape = tuple(param.shape)
    dims = entries(shape, flags)
    g = -grad if flags["maximize"] else grad
    weight = 1 - state.shampoo_beta

    def first(operand):
        param, state = operand
        stats = _accumulate(preconditioners(state.GG, dims), g, weight, shape, flags)
        bases = _eigenbases(stats)
        new = state._replace(GG=_flatten(stats, param.dtype), Q=_flatten(bases, param.dtype))
        return param, new

    def later(operand):
        param, state = operand
        s = state.step.astype(param.dtype)
        bases = preconditioners(state.Q, dims)
        exp_avg = lerp(state.exp_avg, g, h["one_minus_beta1"])
        projected = _project(g, bases, shape, flags)
        exp_avg_sq = lerp(state.exp_avg_sq, projected * projected, h["one_minus_beta2"])
        denom = jnp.sqrt(exp_avg_sq) + h["eps"]
        direction = _project(
            _project(exp_avg, bases, shape, flags) / denom, bases, shape, flags, back=True
        )
        if flags["normalize_gradient"]:
            direction = direction / (jnp.sqrt(jnp.mean(direction * direction)) + h["eps"])
        step_size = h["lr"]
        if flags["correct_bias"]:
            correction1 = one_minus_pow(h["one_minus_beta1"], s)
            correction2 = jnp.sqrt(one_minus_pow(h["one_minus_beta2"], s))
            step_size = step_size * correction2 / correction1
        param = param + (-step_size) * direction
        if flags["use_weight_decay"]:
            param = param * (1 - h["weight_decay"] * h["lr"])
        stats = _accumulate(preconditioners(state.GG, dims), g, weight, shape, flags)
        refresh = jnp.mod(s, state.precondition_frequency.astype(s.dtype)) == 0

        def refreshed(operand):
            bases, v = operand
            return _refresh(stats, bases, v, shape, flags)

        bases, exp_avg_sq = jax.lax.cond(
            refresh, refreshed, lambda operand: operand, (bases, exp_avg_sq)
        )
        new = state._replace(
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            GG=_flatten(stats, param.dtype),
            Q=_flatten(bases, param.dtype),
        )
        return param, new

    param, state = jax.lax.cond(state.step == 0, first, later, (param, state))
    return param, state._replace(step=state.step + 1)


SOAP = Rule(
    name="SOAP",
    state=SOAPState,
    options=OptionSpec(
        validate=_validate,
        split=_split,
        complements=("beta1", "beta2"),
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        scalar=("step", "precondition_frequency", "shampoo_beta"),
        hidden={"step": 0.0, "dims": 0.0},
    ),
    supports_complex=False,
    execution=Execution(
        elementwise=False,
        whole_per_device=True,
    ),
)


SOAP_SIGNATURE = Signature(
    (
        lr(3e-3, "γ, scaled by the bias corrections (with `correct_bias`)"),
        betas(
            (0.95, 0.95),
            "(β₁, β₂): decay rates of the average of the gradient (m) and of the second "
            "moment in the eigenbasis (v).",
        ),
        Arg(
            "shampoo_beta",
            None,
            Any,
            "β_s, the decay rate of the statistics `L_i` (`None`: β₂); read when a "
            "parameter's state is made.",
        ),
        Arg(
            "weight_decay",
            1e-2,
            Any,
            "λ: decoupled weight decay, `p ← p (1 - γ λ)` after the update.",
        ),
        Arg(
            "precondition_frequency",
            10,
            Any,
            "f: the eigenbases are refreshed (one power iteration and a QR) every f steps; "
            "read when a parameter's state is made.",
        ),
        Arg(
            "max_precondition_dim",
            10000,
            int,
            "an axis longer than this has no preconditioner (and `merge_dims` merges axes "
            "up to this size).",
        ),
        Arg(
            "merge_dims",
            False,
            bool,
            "precondition the parameter reshaped by "
            "`merge_small_dims` (neighbouring small axes merged).",
        ),
        Arg("precondition_1d", False, bool, "precondition vectors too (else Adam on them)."),
        Arg("correct_bias", True, bool, "scale γ by `√(1-β₂^s) / (1-β₁^s)`."),
        Arg(
            "normalize_gradient",
            False,
            bool,
            "divide the update by its RMS (plus ε) before the step.",
        ),
        Arg(
            "data_format",
            "channels_first",
            str,
            "`'channels_last'`: with `merge_dims`, a 4-D parameter's last axis is moved "
            "second before merging (NHWC taken as NCHW); any other value: as given.",
        ),
        Arg("eps", 1e-8, Any, "ε, added to `√v` (and to the RMS of `normalize_gradient`)."),
        Arg("maximize", False, bool, "maximize the objective: the gradient is negated."),
    ),
    Example(
        "lr=0.1",
        "[[1.0, -2.0], [0.5, 3.0]]",
        "[[1.0, 0.0], [0.0, 1.0]]",
        "Array([[ 1. , -2. ],\n       [ 0.5,  3. ]], dtype=float32)",
    ),
)

soap = transform_of(
    SOAP,
    SOAP_SIGNATURE,
    "soap",
    """`pytorch_optimizer.SOAP` (pytorch-optimizer 4.1) as an optax transformation.

    The first update is zero (the reference's first step only builds the
    preconditioners); each state field holds one entry per leaf, `GG` and `Q` flat
    (`preconditioners` cuts them into matrices).

    Examples:
      >>> import jax.numpy as jnp, optax, lucid.functional as LF
      >>> params = {"w": jnp.ones((2, 2))}
      >>> tx = LF.soap(lr=0.1, weight_decay=0.0)
      >>> state = tx.init(params)
      >>> for g in (jnp.eye(2), jnp.array([[1.0, 2.0], [0.0, 1.0]])):
      ...     updates, state = tx.update({"w": g}, state, params)
      ...     params = optax.apply_updates(params, updates)
      >>> int(state.step["w"]), state.GG["w"].shape
      (2, (8,))""",
)
