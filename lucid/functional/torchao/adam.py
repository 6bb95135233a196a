"""torchao's low-bit Adam and AdamW (``torchao.optim.Adam8bit`` ... ``AdamWFp8``).

torchao's ``single_param_adam``, in float32 whatever the parameter's dtype. With
``g`` the gradient, ``t`` the step, ``Q``/``D`` the block-wise quantization and
dequantization of `lucid.functional.torchao.quantize` (the identity for a small
tensor), and ``m̂, v̂`` the stored (quantized) moments:

$$
\\begin{aligned}
g &\\leftarrow g + \\lambda p
    \\quad\\text{or, AdamW,}\\quad p \\leftarrow p - (\\gamma\\lambda)\\, p \\\\
m &= \\mathrm{lerp}(D(\\hat m), g, 1-\\beta_1), \\qquad
v = \\mathrm{lerp}(D(\\hat v), g^2, 1-\\beta_2), \\qquad
\\hat m \\leftarrow Q(m),\\ \\hat v \\leftarrow Q(v) \\\\
u &= \\max(D(\\hat u), v),\\ \\hat u \\leftarrow Q(u)
    \\text{ (amsgrad; the update then uses } u \\text{ for } v) \\\\
p &\\leftarrow p - \\gamma\\,\\frac{m}{1-\\beta_1^t}
    \\Big/ \\Big(\\frac{\\sqrt{v}}{\\sqrt{1-\\beta_2^t}} + \\epsilon\\Big)
\\end{aligned}
$$

The update uses the float32 moments of this step (``m``, ``v``), not their
quantized copies, as torchao does; the bias corrections are float32
(``1 - beta**t`` with a float32 ``t``), and ``lerp`` is torch's. A tensor is
quantized when it has at least 4096 elements and its size is a multiple of
``block_size``; any other keeps full-precision moments in the parameter's dtype
(torchao's exception, after bitsandbytes). The new parameter is rounded to its
dtype to nearest, or, for bfloat16 parameters with ``bf16_stochastic_round``,
stochastically (`bf16_stochastic_round`).

Two points where torchao's code decides differently from torch.optim's Adam, and
lucid follows torchao: whether AMSGrad applies is read from the state (a
``max_exp_avg_sq`` made when the state was created), not from the current
``amsgrad`` option; and ``weight_decay`` is applied even when it is zero (so an
infinite parameter becomes NaN, as in torchao).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._platform import has_kernels
from .. import _validate
from .._lowbit import chunks
from .._lowbit.floats import FP8
from .._lowbit.floats import bf16_stochastic_round as round_bf16_stochastically
from .._lowbit.torchao import block_scale, dequantize, encode
from .._signature import (
    KEYWORD_ONLY,
    Arg,
    Example,
    Signature,
    betas,
    eps,
    lr,
    transform_of,
    weight_decay,
)
from ..rule import Execution, FieldSpec, OptionSpec, Rule
from . import _pallas

__all__ = [
    "LowBitAdamState",
    "adam4bit",
    "adam8bit",
    "adam_fp8",
    "adamw4bit",
    "adamw8bit",
    "adamw_fp8",
    "is_quantized",
]

QUANTIZE_MIN_SIZE = 4096
"""torchao quantizes a tensor's state only from this many elements on."""


class LowBitAdamState(NamedTuple):
    """The state of torchao's low-bit Adam for one parameter (torchao's names).

    A quantized moment is two fields: ``<name>`` holds the codes and
    ``<name>_scale`` the per-block float32 scales (torchao's
    ``OptimState8bit/4bit/Fp8`` ``codes`` and ``scale``). A small tensor's moment
    is ``<name>`` in full precision (the parameter's dtype), its scale `None`.

    Attributes:
      step: updates done (float32).
      exp_avg: m: ``uint8`` codes shaped as the parameter (8 bits), ``uint8`` of
        half the parameter's size (4 bits, two codes a byte), ``float8_e4m3fn``
        shaped as the parameter (fp8), or the full-precision moment.
      exp_avg_scale: m's scales (``size // block_size`` float32), or `None`.
      exp_avg_sq: v, stored as ``exp_avg`` is (with the unsigned code map).
      exp_avg_sq_scale: v's scales, or `None`.
      max_exp_avg_sq: the running maximum of v (AMSGrad, when the state was made
        with ``amsgrad``), else `None`.
      max_exp_avg_sq_scale: its scales, or `None`.
      rng: for bfloat16 parameters, the ``uint32[2]`` PRNG key of the stochastic
        rounding (lucid's; torchao uses torch's global generator); else `None`.
    """

    step: Any
    exp_avg: Any
    exp_avg_scale: Any
    exp_avg_sq: Any
    exp_avg_sq_scale: Any
    max_exp_avg_sq: Any
    max_exp_avg_sq_scale: Any
    rng: Any


MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
SIGNED = {"exp_avg": True, "exp_avg_sq": False, "max_exp_avg_sq": False}


def is_quantized(size: int, block_size: int) -> bool:
    """torchao's rule: a tensor's state is quantized iff it has at least 4096 elements
    and its size is a multiple of ``block_size``.

    Args:
      size: the parameter's number of elements.
      block_size: elements per scale.

    Returns:
      Whether its moments are stored quantized.

    Examples:
      >>> from lucid.functional.torchao import is_quantized
      >>> is_quantized(4096, 256), is_quantized(4100, 256), is_quantized(2048, 128)
      (True, False, False)
    """
    return size >= QUANTIZE_MIN_SIZE and size % block_size == 0


def zero_codes(form: str, shape: tuple[int, ...]) -> Any:
    """The codes of a fresh quantized moment (torchao's ``zeros``: all codes 0)."""
    size = int(np.prod(shape))
    if form == "4bit":
        return jnp.zeros((size // 2,), jnp.uint8)
    return jnp.zeros(shape, FP8 if form == "fp8" else jnp.uint8)


def first_key(param: Any, step: Any = 0) -> Any:
    """A PRNG key for the stochastic rounding of ``param``, derived from its bits
    (so two parameters of different values draw different streams) and ``step``."""
    bits = jax.lax.bitcast_convert_type(jnp.asarray(param, jnp.bfloat16), jnp.uint16)
    seed = jnp.sum(bits.astype(jnp.uint32) * jnp.uint32(2654435761)).astype(jnp.uint32)
    key = jax.random.fold_in(jax.random.PRNGKey(0), seed)
    return jax.random.fold_in(key, jnp.asarray(step, jnp.float32).astype(jnp.uint32))


def _split(o: dict) -> tuple[dict, dict]:
    beta1, beta2 = o["betas"]
    hyper = {
        "lr": o["lr"],
        "beta1": beta1,
        "beta2": beta2,
        "eps": o["eps"],
        "weight_decay": o["weight_decay"],
    }
    flags = {
        "amsgrad": bool(o["amsgrad"]),
        "block_size": int(o["block_size"]),
        "bf16_stochastic_round": bool(o["bf16_stochastic_round"]),
    }
    return hyper, flags


def _validate_options(o: dict) -> None:
    """torchao's checks (``_AdamBase.__init__``), then lucid's on ``block_size``."""
    _validate.lr(o["lr"])
    _validate.non_negative(o["eps"], "epsilon value")
    _validate.betas(o["betas"])
    _validate.scalar(o["weight_decay"], "weight_decay", schedules=False)
    block = o["block_size"]
    if isinstance(block, bool) or not isinstance(block, int | np.integer) or block < 1:
        raise ValueError(f"Invalid block_size: {block!r} (a positive integer)")


def _init(
    param: Any,
    hyper: Any,
    *,
    form: str,
    amsgrad: bool,
    block_size: int,
    quantized: bool | None = None,
    **_: Any,
) -> LowBitAdamState:
    shape = tuple(jnp.shape(param))
    size = int(np.prod(shape))
    if quantized is None:  # (a flat buffer of several parameters is told, `_blocks`)
        quantized = is_quantized(size, block_size)
    if quantized and form == "4bit" and size % 2:
        raise ValueError(
            f"4-bit state packs two codes a byte: a parameter of shape {shape} (odd size) "
            f"cannot be quantized in blocks of {block_size}"
        )

    def moment() -> tuple[Any, Any]:
        if not quantized:
            return jnp.zeros_like(param), None
        return zero_codes(form, shape), jnp.zeros((size // block_size,), jnp.float32)

    m, m_scale = moment()
    v, v_scale = moment()
    u, u_scale = moment() if amsgrad else (None, None)
    rng = first_key(param) if jnp.result_type(param) == jnp.bfloat16 else None
    return LowBitAdamState(jnp.zeros((), jnp.float32), m, m_scale, v, v_scale, u, u_scale, rng)


def _load(codes: Any, scale: Any, form: str, signed: bool, shape: tuple[int, ...]) -> Any:
    if scale is None:
        return codes.astype(jnp.float32)
    return dequantize(codes, scale, form, signed, shape)


def _store(
    value: Any, scale: Any, form: str, signed: bool, block_size: int, cpu: bool = False
) -> tuple[Any, Any]:
    if scale is None:
        return value, None
    scale = block_scale(value, form, block_size)
    return encode(value, scale, form, signed, block_size, cpu), scale


def lerp(start: Any, end: Any, weight: Any, select: bool = False) -> Any:
    """torch's ``lerp`` (``start + w (end - start)`` for ``w < 0.5``, else ``end - (end -
    start)(1 - w)``), the branch taken once for the scalar ``weight`` (a select per
    element would make XLA compute the dequantized ``start`` once per use), or, with
    ``select`` (inside a kernel, where both are computed in registers), by a select."""
    diff = end - start
    if select:
        return jnp.where(weight < 0.5, start + weight * diff, end - diff * (1 - weight))
    return jax.lax.cond(
        weight < 0.5, lambda: start + weight * diff, lambda: end - diff * (1 - weight)
    )


def bias_corrections(h: dict, step: Any) -> tuple[Any, Any]:
    """``1 - beta1**t`` and ``1 - beta2**t`` in float32 (torchao's)."""
    return 1 - h["beta1"] ** step, 1 - h["beta2"] ** step


def decayed(p: Any, g: Any, h: dict, adamw: bool) -> tuple[Any, Any]:
    """The weight decay: AdamW's on the parameter, Adam's added to the gradient."""
    if adamw:
        return p - (h["lr"] * h["weight_decay"]) * p, g
    return p, g + h["weight_decay"] * p


def moments(m_old: Any, v_old: Any, g: Any, h: dict, select: bool = False) -> tuple[Any, Any]:
    """The new float32 moments from the stored ones: ``lerp`` towards ``g`` and ``g^2``."""
    m = lerp(m_old, g, h["one_minus_beta1"], select)
    v = lerp(v_old, g * g, h["one_minus_beta2"], select)
    return m, v


def adam_update(p: Any, m: Any, second: Any, h: dict, corrections: tuple[Any, Any]) -> Any:
    """The parameter after the step: ``p - lr (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)``."""
    bias_correction1, bias_correction2 = corrections
    denom = jnp.sqrt(second) / jnp.sqrt(bias_correction2) + h["eps"]
    return p - h["lr"] * (m / bias_correction1) / denom


def _update(
    param: Any,
    grad: Any,
    state: LowBitAdamState,
    h: dict,
    *,
    form: str,
    adamw: bool,
    amsgrad: bool,
    block_size: int,
    bf16_stochastic_round: bool,
    storage_dtype: Any,
    quantized: bool | None = None,
) -> tuple[Any, LowBitAdamState]:
    del amsgrad  # torchao reads it from the state (a max_exp_avg_sq made at its creation)
    del quantized  # the state says it (a scale or none)
    f32 = jnp.float32
    h = {k: jnp.asarray(v, f32) for k, v in h.items()}
    step = state.step.astype(f32) + 1
    stored = (
        state.exp_avg,
        state.exp_avg_scale,
        state.exp_avg_sq,
        state.exp_avg_sq_scale,
        state.max_exp_avg_sq,
        state.max_exp_avg_sq_scale,
    )
    step_of = functools.partial(
        _step, h=h, step=step, form=form, adamw=adamw, block_size=block_size
    )
    size = int(np.prod(jnp.shape(param)))
    branches = {}
    if state.exp_avg_scale is not None and chunks.chunkable(size, block_size):
        # on the CPU, the same graph over chunks of blocks, encoded as the CPU runs fastest
        branches["cpu"] = functools.partial(
            chunks.in_chunks, functools.partial(step_of, cpu=True), block_size=block_size
        )
    if _pallas.supported(param, grad, state, block_size, form) and has_kernels():
        # on a GPU, one fused kernel per buffer (only offered there: jax 0.4 lowers every
        # branch, and Pallas' Triton kernel does not lower for another backend)
        branches["cuda"] = functools.partial(
            _pallas.fused_step,
            h=h,
            step=step,
            form=form,
            adamw=adamw,
            block_size=block_size,
            rule=RULE_MATH,
        )
    if branches:
        new = jax.lax.platform_dependent(param, grad, *stored, default=step_of, **branches)
    else:
        new = step_of(param, grad, *stored)
    p, m_stored, m_scale, v_stored, v_scale, u_stored, u_scale = new
    rng = state.rng
    if bf16_stochastic_round and np.dtype(storage_dtype) == jnp.bfloat16 and rng is not None:
        rng, draw = jax.random.split(rng)
        p = round_bf16_stochastically(p, draw).astype(f32)
    new = LowBitAdamState(step, m_stored, m_scale, v_stored, v_scale, u_stored, u_scale, rng)
    return p, new


RULE_MATH = {
    "decayed": decayed,
    "moments": moments,
    "update": adam_update,
    "corrections": bias_corrections,
}
"""The rule's arithmetic, which the fused GPU kernel (`_pallas`) traces as the XLA step
(`_step`) does."""


def _step(
    param: Any,
    grad: Any,
    m_codes: Any,
    m_scale: Any,
    v_codes: Any,
    v_scale: Any,
    u_codes: Any,
    u_scale: Any,
    *,
    h: dict,
    step: Any,
    form: str,
    adamw: bool,
    block_size: int,
    cpu: bool = False,
) -> tuple:
    """torchao's update of one tensor, or of a chunk of its blocks (``cpu``: each array
    viewed by blocks, encoded as the CPU runs it fastest): ``(p, m, m_scale, v, v_scale,
    u, u_scale)`` after the step, ``p`` in float32."""
    f32 = jnp.float32
    shape = tuple(jnp.shape(param))
    p, g = decayed(param.astype(f32), grad.astype(f32), h, adamw)
    corrections = bias_corrections(h, step)
    m_old = _load(m_codes, m_scale, form, True, shape)
    m, v = moments(m_old, _load(v_codes, v_scale, form, False, shape), g, h)
    m_stored, m_scale = _store(m, m_scale, form, True, block_size, cpu)
    v_stored, v_scale = _store(v, v_scale, form, False, block_size, cpu)
    u_stored, second = None, v
    if u_codes is not None:
        old = _load(u_codes, u_scale, form, False, shape)
        second = jnp.maximum(old, v)
        u_stored, u_scale = _store(second, u_scale, form, False, block_size, cpu)
    p = adam_update(p, m, second, h, corrections)
    return p, m_stored, m_scale, v_stored, v_scale, u_stored, u_scale


def _blocks(form: str) -> Any:
    """`Execution.blocks` of a form: a quantized moment is blocks of ``block_size`` elements,
    each scaled on its own, so quantized parameters can be laid end to end (and told
    so: a flat buffer's total size is not what decides, `QUANTIZE_MIN_SIZE`); a
    full-precision moment is elementwise. A bfloat16 parameter keeps its own random
    key (stochastic rounding), and a 4-bit parameter of odd size cannot be quantized
    (`_init` says why): each stays alone."""

    def blocks(value: Any, flags: Any, state: Any) -> tuple[int, dict] | None:
        size, block = int(value.size), int(flags["block_size"])
        own_key = jnp.dtype(value.dtype) == jnp.bfloat16
        if own_key or (state is not None and state.rng is not None):
            return None
        # a made state says it, as `_update` reads it (a scale or none)
        quantized = is_quantized(size, block) if state is None else state.exp_avg_scale is not None
        if not quantized:
            return 1, {"quantized": False}
        if form == "4bit" and size % 2:
            return None
        return block, {"quantized": True}

    return blocks


def _rule(name: str, form: str, adamw: bool) -> Rule:
    def init(param: Any, hyper: Any, **flags: Any) -> LowBitAdamState:
        return _init(param, hyper, form=form, **flags)

    def update(param: Any, grad: Any, state: Any, h: dict, **flags: Any) -> tuple[Any, Any]:
        return _update(param, grad, state, h, form=form, adamw=adamw, **flags)

    return Rule(
        name=name,
        state=LowBitAdamState,
        options=OptionSpec(
            validate=_validate_options,
            split=_split,
            complements=("beta1", "beta2"),
        ),
        init=init,
        update=update,
        fields=FieldSpec(
            hidden={"rng": 0.0},
        ),
        supports_complex=False,
        storage_dtype=True,
        execution=Execution(
            elementwise=False,
            batched=form != "fp8",  # fp8: XLA divides a batched scale by 448 an ulp otherwise
            blocks=_blocks(form),
            # with jax 0.4.35's XLA, a fused step (the gradient computed in the same
            # program) over a flat buffer computed a parameter 1e-4 away from the eager
            # step's after 3 steps, where each parameter alone gives its numbers
            fusion_sensitive=True,
        ),
    )


ADAM8BIT = _rule("Adam8bit", "8bit", adamw=False)
ADAMW8BIT = _rule("AdamW8bit", "8bit", adamw=True)
ADAM4BIT = _rule("Adam4bit", "4bit", adamw=False)
ADAMW4BIT = _rule("AdamW4bit", "4bit", adamw=True)
ADAMFP8 = _rule("AdamFp8", "fp8", adamw=False)
ADAMWFP8 = _rule("AdamWFp8", "fp8", adamw=True)

FORM_OF = {
    rule: form
    for rule, form in (
        (ADAM8BIT, "8bit"),
        (ADAMW8BIT, "8bit"),
        (ADAM4BIT, "4bit"),
        (ADAMW4BIT, "4bit"),
        (ADAMFP8, "fp8"),
        (ADAMWFP8, "fp8"),
    )
}


AMSGRAD = Arg(
    "amsgrad",
    False,
    bool,
    "AMSGrad: keep the running maximum of v (`max_exp_avg_sq`, quantized as v is) and "
    "divide by it. Read when a parameter's state is created; afterwards the state decides, "
    "as in torchao.",
)
STOCHASTIC = Arg(
    "bf16_stochastic_round",
    False,
    bool,
    "round bfloat16 parameters to bfloat16 stochastically (unbiased) instead of to nearest; "
    "no effect on other dtypes.",
)


def _block(default: int) -> Arg:
    return Arg(
        "block_size",
        default,
        int,
        "elements per float32 scale of the quantized state (consecutive elements of the "
        "flattened tensor); a tensor whose size is not a multiple of it keeps full-precision "
        "state.",
    )


@dataclasses.dataclass(frozen=True)
class _Example(Example):
    """The signature's example, written with the ``torchao`` namespaces."""

    def transform(self, factory: str) -> str:
        return super().transform(f"torchao.{factory}")

    def optimizer(self, cls: str) -> str:
        return super().optimizer(f"torchao.{cls}")


def _signature(block: int, adamw: bool) -> Signature:
    example = (
        _Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.899, -1.898], dtype=float32)")
        if adamw
        else _Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)")
    )
    return Signature(
        (
            lr(1e-3),
            betas(),
            eps(1e-8, "to √v after its bias correction"),
            weight_decay(1e-2, decoupled=True) if adamw else weight_decay(0),
            AMSGRAD,
            KEYWORD_ONLY,
            _block(block),
            STOCHASTIC,
        ),
        example,
    )


ADAM8BIT_SIGNATURE = _signature(256, adamw=False)
ADAMW8BIT_SIGNATURE = _signature(256, adamw=True)
ADAM4BIT_SIGNATURE = _signature(128, adamw=False)
ADAMW4BIT_SIGNATURE = _signature(128, adamw=True)
ADAMFP8_SIGNATURE = _signature(256, adamw=False)
ADAMWFP8_SIGNATURE = _signature(256, adamw=True)

_FORM_TEXT = {
    "8bit": "moments in 8-bit dynamic-tree codes (`uint8`), one float32 scale per block of 256",
    "4bit": "moments in 4-bit codes, two a byte, one float32 scale per block of 128",
    "fp8": "moments in `float8_e4m3fn`, one float32 scale per block of 256",
}


def _prose(torchao_name: str, form: str, adamw: bool) -> str:
    kind = "Adam with decoupled weight decay (default 1e-2)" if adamw else "Adam"
    return (
        f"`torchao.optim.{torchao_name}` as an optax transformation: {kind}, "
        f"{_FORM_TEXT[form]} (tensors of fewer than 4096 elements, or of a size that is no "
        "multiple of the block, keep full-precision moments)."
    )


adam8bit = transform_of(ADAM8BIT, ADAM8BIT_SIGNATURE, "adam8bit", _prose("Adam8bit", "8bit", False))
adamw8bit = transform_of(
    ADAMW8BIT, ADAMW8BIT_SIGNATURE, "adamw8bit", _prose("AdamW8bit", "8bit", True)
)
adam4bit = transform_of(ADAM4BIT, ADAM4BIT_SIGNATURE, "adam4bit", _prose("Adam4bit", "4bit", False))
adamw4bit = transform_of(
    ADAMW4BIT, ADAMW4BIT_SIGNATURE, "adamw4bit", _prose("AdamW4bit", "4bit", True)
)
adam_fp8 = transform_of(ADAMFP8, ADAMFP8_SIGNATURE, "adam_fp8", _prose("AdamFp8", "fp8", False))
adamw_fp8 = transform_of(ADAMWFP8, ADAMWFP8_SIGNATURE, "adamw_fp8", _prose("AdamWFp8", "fp8", True))

RULES = {rule.name: rule for rule in FORM_OF}
