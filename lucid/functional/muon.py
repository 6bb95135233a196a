"""Muon (``torch.optim.Muon``): momentum orthogonalized by a Newton-Schulz iteration.

For a 2-D parameter ``p`` of shape ``(A, B)`` with gradient ``g``:

$$
\\begin{aligned}
b_t &= \\mathrm{lerp}(b_{t-1}, g, 1-\\mu) = \\mu b_{t-1} + (1-\\mu) g \\\\
u_t &= \\mathrm{lerp}(g, b_t, \\mu) \\text{ (nesterov) or } b_t \\\\
O_t &= \\mathrm{NS}^{(a,b,c)}_k(u_t; \\epsilon) \\\\
p &\\leftarrow p\\,(1 - \\gamma\\lambda) - \\gamma' O_t, \\qquad
\\gamma' = \\gamma\\sqrt{\\max(1, A/B)} \\text{ ('original', the default), }
    0.2\\,\\gamma\\sqrt{\\max(A, B)} \\text{ ('match\\_rms\\_adamw') or }
    \\gamma\\sqrt{A/B} \\text{ ('spectral\\_unclamped')}
\\end{aligned}
$$

$\\mathrm{NS}$ is torch's quintic Newton-Schulz iteration, run in **bfloat16**
as torch runs it: ``X = u / max(||u||_F, eps)`` (on ``u^T`` when ``A > B``),
then ``k`` times ``G = X X^T``, ``X = a X + (b G + c G G) X``. Each matrix
product accumulates in float32 and is rounded to bfloat16 once, as torch's
``addmm`` is. The momentum, the weight decay and the learning-rate adjustment
run in the parameter's compute dtype.

The momentum is torch's ``lerp`` (its docstring writes ``B = mu B + g``; its
code, which this follows, averages). torch keeps only ``momentum_buffer``;
lucid also keeps a ``step`` (hidden from the state_dict) that counts updates
for schedules.

torch 2.15 changed two things, and this rule follows 2.15: ``'spectral_unclamped'``
(Bernstein's ``sqrt(A/B)``, unclamped below 1 for a wide matrix) is new, and the
iteration works on a copy of its input. In torch 2.13 the iteration's first step,
``X = u.bfloat16()``, is no copy when ``u`` is already bfloat16, and its in-place
division by the norm then rescales the momentum buffer itself: with bfloat16
parameters and ``nesterov=False`` torch 2.13 keeps ``b_t / max(||b_t||_F, eps)`` as
the buffer, where 2.15 (and lucid) keep ``b_t``. Every other case is the same in both.

**Batched matrices** (``batched_matrices=True``, lucid's option; off by default, as torch
has none): a parameter of shape ``(..., A, B)`` (at least 2-D) is a stack of independent
``(A, B)`` matrices, per-head or per-expert weights. The momentum and the weight decay are
elementwise as above; the iteration and the learning-rate adjustment run on each slice
``p[i, ..., :, :]`` as if it were its own 2-D parameter (``A, B`` are the last two
dimensions), so each slice's numbers are torch's Muon run on that slice alone. Off,
any parameter that is not 2-D is torch's ``ValueError``.

This rule treats each parameter as a matrix, so it is not
elementwise: the compiled step updates each parameter as itself. It is
``batched``: in every form, same-shaped matrices (of one dtype, placement and
set of static options) are stacked and updated in one ``jax.vmap``ped call, so
each Newton-Schulz product is one batched matrix product per shape, with the
numbers of one matrix at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._apply import is_number
from ._math import guard, lerp
from ._signature import (
    KEYWORD_ONLY,
    Arg,
    Example,
    Signature,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from .rule import Execution, FieldSpec, OptionSpec, Rule

__all__ = [
    "MuonState",
    "muon",
    "orthogonalize",
    "orthogonalize_slices",
]

ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped")


class MuonState(NamedTuple):
    """The state of torch.optim.Muon, one entry per parameter (torch's names).

    Attributes:
      step: updates done, for schedules (lucid only: not in the state_dict).
      momentum_buffer: b, the momentum buffer.
    """

    step: Any
    momentum_buffer: Any


def orthogonalize(
    update: jax.Array,
    coefficients: Sequence[Any],
    steps: int,
    eps: Any,
    dtype: Any = jnp.bfloat16,
) -> jax.Array:
    """torch's ``_zeropower_via_newtonschulz``: ``steps`` quintic Newton-Schulz iterations.

    ``X = u / max(||u||_F, eps)`` (transposed first when ``u`` has more rows than
    columns), then ``steps`` times ``G = X X^T``, ``X = a X + (b G + c G^2) X``.

    Args:
      update: the 2-D matrix to orthogonalize.
      coefficients: ``(a, b, c)``.
      steps: the number of iterations.
      eps: the floor of the Frobenius norm.
      dtype: the dtype the iterate is stored in (torch: bfloat16); products
        accumulate in ``promote_types(dtype, float32)`` and are rounded once.

    Returns:
      The orthogonalized matrix, in ``dtype``, shaped as ``update``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.muon import orthogonalize
      >>> o = orthogonalize(jnp.eye(2) * 3.0, (3.4445, -4.7750, 2.0315), 5, 1e-7)
      >>> o.dtype, o.shape
      (dtype(bfloat16), (2, 2))
    """
    acc = jnp.promote_types(dtype, jnp.float32)
    a, b, c = (jnp.asarray(k, acc) for k in coefficients)
    x = update.astype(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(acc)))).astype(dtype)
    x = x / jnp.maximum(norm, guard(jnp.asarray(eps, acc)).astype(dtype))
    for _ in range(steps):
        gram = jnp.matmul(x, x.T, preferred_element_type=acc).astype(dtype)
        square = jnp.matmul(gram, gram, preferred_element_type=acc)
        gram_update = (b * gram.astype(acc) + c * square).astype(dtype)
        x = (a * x.astype(acc) + jnp.matmul(gram_update, x, preferred_element_type=acc)).astype(
            dtype
        )
    return x.T if tall else x


def orthogonalize_slices(
    update: jax.Array,
    coefficients: Sequence[Any],
    steps: int,
    eps: Any,
    dtype: Any = jnp.bfloat16,
) -> jax.Array:
    """`orthogonalize` on each ``(A, B)`` matrix of an ``(..., A, B)`` array, independently
    (one batched call under ``jax.vmap``; a 2-D array is `orthogonalize` itself).

    Args:
      update: an array of at least 2 dimensions, the last two each matrix's.
      coefficients: ``(a, b, c)``.
      steps: the number of iterations.
      eps: the floor of each matrix's Frobenius norm.
      dtype: the dtype the iterate is stored in.

    Returns:
      The orthogonalized matrices, in ``dtype``, shaped as ``update``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.muon import orthogonalize, orthogonalize_slices
      >>> u = jnp.arange(24.0).reshape(2, 3, 4)
      >>> o = orthogonalize_slices(u, (3.4445, -4.7750, 2.0315), 5, 1e-7)
      >>> o.shape, bool((o[1] == orthogonalize(u[1], (3.4445, -4.7750, 2.0315), 5, 1e-7)).all())
      ((2, 3, 4), True)
    """
    if update.ndim == 2:
        return orthogonalize(update, coefficients, steps, eps, dtype)
    rows, cols = update.shape[-2:]
    matrices = update.reshape(-1, rows, cols)

    def one(matrix: jax.Array) -> jax.Array:
        return orthogonalize(matrix, coefficients, steps, eps, dtype)

    ortho = jax.vmap(one)(matrices)
    return ortho.reshape(update.shape)


def lr_ratio(adjust_lr_fn: str | None, shape: Sequence[int]) -> float:
    """The factor torch's ``_adjust_lr`` multiplies ``lr`` by for a parameter of ``shape``
    (torch 2.15's, ``'spectral_unclamped'`` included).

    Args:
      adjust_lr_fn: ``None`` or ``'original'`` (``sqrt(max(1, A/B))``),
        ``'match_rms_adamw'`` (``0.2 sqrt(max(A, B))``) or ``'spectral_unclamped'``
        (``sqrt(A/B)``).
      shape: the matrix's shape; ``A, B = shape[:2]`` (torch's reading of a 2-D
        parameter's shape; for a slice of batched matrices, pass the slice's ``(A, B)``).

    Returns:
      The factor, a Python float (1.0 for any other name, as torch's).

    Examples:
      >>> from lucid.functional.muon import lr_ratio
      >>> lr_ratio("original", (4, 16)), lr_ratio("spectral_unclamped", (4, 16))
      (1.0, 0.5)
    """
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn == "spectral_unclamped":
        return math.sqrt(rows / cols)
    return 1.0


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _validate_muon(o: dict) -> None:
    """torch's constructor checks, in torch's order and words (concrete numbers only)."""
    if is_number(o["lr"]):
        _check(o["lr"] >= 0.0, f"Learning rate should be >= 0 but is: {o['lr']}")
    if is_number(o["momentum"]):
        _check(o["momentum"] >= 0.0, f"momentum should be >= 0 but is: {o['momentum']}")
    if is_number(o["weight_decay"]):
        _check(o["weight_decay"] >= 0.0, f"weight decay should be >= 0 but is: {o['weight_decay']}")
    if o["adjust_lr_fn"] not in ADJUST_LR_FNS:
        raise ValueError(f"Adjust learning rate function {o['adjust_lr_fn']} is not supported")
    if not isinstance(o["batched_matrices"], bool):
        raise TypeError(f"batched_matrices must be True or False, not {o['batched_matrices']!r}")


def _check_at_step(o: dict) -> None:
    """The checks torch makes at its first step, not at construction."""
    if o["ns_steps"] >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(o["ns_coefficients"]) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")


def _split(o: dict) -> tuple[dict, dict]:
    """Hyper-parameters and flags (before a step, ``_check_at_step`` has run; until
    then a wrong number of coefficients reads as zeros)."""
    a, b, c = (*tuple(o["ns_coefficients"])[:3], 0.0, 0.0, 0.0)[:3]
    hyper = {
        "lr": o["lr"],
        "weight_decay": o["weight_decay"],
        "momentum": o["momentum"],
        "eps": o["eps"],
        "ns_a": a,
        "ns_b": b,
        "ns_c": c,
    }
    flags = {
        "nesterov": bool(o["nesterov"]),
        "ns_steps": int(o["ns_steps"]),
        "adjust_lr_fn": o["adjust_lr_fn"],
        "batched_matrices": o["batched_matrices"],
    }
    return hyper, flags


def not_a_matrix(shape: Sequence[int], batched_matrices: bool) -> str | None:
    """torch's error for a parameter of ``shape`` Muon does not take, or ``None``.

    Off (torch's rule), anything but 2-D is refused in torch's words; with
    ``batched_matrices``, anything below 2-D, in words that say so."""
    if batched_matrices:
        if len(shape) >= 2:
            return None
        return (
            "Muon with batched_matrices=True takes parameters of at least 2 dimensions "
            f"(..., M, N), but found a parameter with size: {tuple(shape)}; give it to "
            "another optimizer (AdamW)"
        )
    if len(shape) == 2:
        return None
    return (
        f"Muon only supports 2D parameters whereas we found a parameter with size: {tuple(shape)}"
    )


def _init(param, hyper, *, batched_matrices=False, **_) -> MuonState:
    error = not_a_matrix(jnp.shape(param), batched_matrices)
    if error is not None:
        raise ValueError(error)
    return MuonState(step=jnp.zeros((), jnp.float32), momentum_buffer=jnp.zeros_like(param))


def _update(
    param,
    grad,
    state,
    h,
    *,
    nesterov,
    ns_steps,
    adjust_lr_fn,
    batched_matrices=False,
    ns_dtype=jnp.bfloat16,
):
    if not_a_matrix(jnp.shape(grad), batched_matrices) is not None:
        raise ValueError(
            not_a_matrix(jnp.shape(grad), True)
            if batched_matrices
            else "Param gradient must be a 2D matrix"
        )
    buf = lerp(state.momentum_buffer, grad, h["one_minus_momentum"])
    update = lerp(grad, buf, h["momentum"]) if nesterov else buf
    coefficients = (h["ns_a"], h["ns_b"], h["ns_c"])
    ortho = orthogonalize_slices(update, coefficients, ns_steps, h["eps"], ns_dtype)
    adjusted_lr = h["lr"] * lr_ratio(adjust_lr_fn, param.shape[-2:])
    param = param * (1 - h["lr"] * h["weight_decay"])
    new_param = param + (-adjusted_lr) * ortho.astype(param.dtype)
    return new_param, MuonState(state.step + 1, buf)


MUON = Rule(
    name="Muon",
    state=MuonState,
    options=OptionSpec(
        validate=_validate_muon,
        split=_split,
        complements=("momentum",),
        guarded=("eps",),
        check_at_step=_check_at_step,
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        hidden={"step": 0.0},
    ),
    supports_complex=False,
    execution=Execution(
        elementwise=False,
        batched=True,
        whole_per_device=True,
    ),
)


def _with_ns_dtype(dtype: Any) -> Rule:
    """Muon with the Newton-Schulz iterate kept in ``dtype`` instead of bfloat16 (a
    separate rule, so nothing compiled for one is reused for the other). The tests
    use float64 to compare everything around the iteration with torch exactly."""
    return dataclasses.replace(MUON, update=functools.partial(_update, ns_dtype=dtype))


MUON_SIGNATURE = Signature(
    (
        lr(1e-3, "γ, scaled per parameter by `adjust_lr_fn`"),
        weight_decay(0.1, decoupled=True),
        Arg("momentum", 0.95, Any, "μ: the buffer is `b ← lerp(b, g, 1 - μ)`."),
        Arg("nesterov", True, bool, "orthogonalize `lerp(g, b, μ)` instead of the buffer `b`."),
        Arg(
            "ns_coefficients",
            (3.4445, -4.775, 2.0315),
            tuple[Any, Any, Any],
            "(a, b, c) of the quintic Newton-Schulz polynomial `X ← a X + (b G + c G²) X`.",
        ),
        eps(1e-7, "as the floor of the Frobenius norm the iteration first divides by"),
        Arg("ns_steps", 5, int, "k: Newton-Schulz iterations (fewer than 100)."),
        Arg(
            "adjust_lr_fn",
            None,
            str | None,
            "`None` or `'original'`: "
            "`γ' = γ √max(1, A/B)`; `'match_rms_adamw'`: `γ' = 0.2 γ √max(A, B)`; "
            "`'spectral_unclamped'` (torch 2.15; torch 2.13 refuses it): `γ' = γ √(A/B)`, "
            "for a parameter of shape (A, B).",
        ),
        KEYWORD_ONLY,
        Arg(
            "batched_matrices",
            False,
            bool,
            "lucid's, not torch's: `True` takes a parameter of shape (..., A, B) as a stack "
            "of independent (A, B) matrices (per-head or per-expert weights), each updated as "
            "torch's Muon updates a 2-D parameter (its own Newton-Schulz iteration and `lr` "
            "adjustment; momentum and weight decay elementwise). `False` (the default) takes "
            "2-D parameters only, as torch, and is left out of a state_dict's groups.",
            extension=True,
        ),
    ),
    Example(
        "lr=0.1",
        "[[1.0, -2.0], [0.5, 3.0]]",
        "[[1.0, 0.0], [0.0, 1.0]]",
        "Array([[ 0.8775    , -1.9799999 ],\n       [ 0.49499997,  2.8574998 ]], dtype=float32)",
    ),
)

muon = transform_of(
    MUON,
    MUON_SIGNATURE,
    "muon",
    "`torch.optim.Muon` as an optax transformation, for a pytree of 2-D parameters (or, "
    "with `batched_matrices=True`, of stacks of matrices).",
    raises="ValueError: also `ns_steps >= 100` or coefficients that are not three; `init` "
    "raises torch's error for a parameter that is not 2-D (below 2-D with "
    "`batched_matrices=True`).",
)
