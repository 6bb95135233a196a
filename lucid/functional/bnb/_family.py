"""What every bitsandbytes optimizer shares: the state, the 8-bit/32-bit switch, the
checks and the arguments.

bitsandbytes runs every optimizer through one of two kernels, chosen per parameter when
its state is made: the 32-bit one (float32 state) and the 8-bit block-wise one (codes and
per-block absmax, `lucid.functional._lowbit.bnb`). A parameter takes the 8-bit kernel when
the optimizer's `optim_bits` is 8 and it has at least `min_8bit_size` elements. The
8-bit kernel dequantizes the state to float32, applies the rule and quantizes the new
state again, every step. Both kernels compute in float32 whatever the parameter's dtype,
as bitsandbytes' CPU backend does; the parameter is written back in its own dtype.

A rule family (Adam, momentum, Lion, ...) is a `Kernel`: its update in the 32-bit and
in the 8-bit kernel (bitsandbytes' CPU backend writes them with different orders of
operations, and lucid follows each).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import _validate
from .._lowbit import blockwise, chunks
from .._lowbit import bnb as codec
from .._lowbit import pallas as kernel_ops
from .._math import one_minus_pow
from .._rule import Rule, as_hyper, is_number
from .._signature import Arg
from . import _pallas

Array = jax.Array
Options = Mapping[str, Any]
REQUIRED = inspect.Parameter.empty
"""The default of an argument bitsandbytes' signature requires (`SGD`'s and `LARS`'s `lr`)."""


class BnbState(NamedTuple):
    """The state of a bitsandbytes optimizer for one parameter (bitsandbytes' names).

    The 8-bit kernel keeps `state1`/`state2` as `uint8` codes with one float32 scale per
    block of 256 elements in `absmax1`/`absmax2`; the 32-bit kernel keeps them as float32
    and has no `absmax`. The code maps (`qmap1`, `qmap2` in a state_dict) are constants
    and are not stored per parameter.

    Attributes:
      step: steps done (int32, 0-d).
      state1: the first state (Adam's m, the momentum buffer, Lion's average, RMSprop's
        and Adagrad's squared-gradient average); AdEMAMix's two first moments stacked,
        shape `(2, *param.shape)`.
      state2: the second state (Adam's and AdEMAMix's v); `None` for one-state rules.
      absmax1: the per-block absmax of `state1` (8-bit only, else `None`).
      absmax2: the per-block absmax of `state2` (8-bit two-state rules only).
      unorm_vec: the norm of the last update, shape `(1,)` (LAMB and LARS, whose
        `max_unorm > 0`), else `None`.
    """

    step: Any
    state1: Any
    state2: Any
    absmax1: Any
    absmax2: Any
    unorm_vec: Any


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One bitsandbytes rule family.

    Attributes:
      name: bitsandbytes' `optimizer_name` (`"adam"`, `"momentum"`, ...).
      two_states: the rule keeps `state2`.
      double: `state1` holds two moments (AdEMAMix).
      step32: `(p, g, s1, s2, h, t, flags) -> (p, s1, s2, unorm)` in float32 (`unorm` the
        norm the trust ratio measured, or `None`).
      step8: `(p, g, s1, s2, h, t, flags) -> (p, s1, s2)` on the dequantized states.
      double: `state1` holds two moments (AdEMAMix).
      corrected: `step8` reads Adam's bias corrections (`corrections`).
    """

    name: str
    two_states: bool
    step32: Callable[..., tuple]
    step8: Callable[..., tuple]
    double: bool = False
    corrected: bool = False


def eight_bit(size: int, optim_bits: int, min_8bit_size: int) -> bool:
    """Whether a parameter of `size` elements takes the 8-bit kernel (bitsandbytes'
    `init_state`)."""
    return optim_bits == 8 and not size < min_8bit_size


def _blocks(kernel: Kernel) -> Callable[..., tuple[int, dict] | None]:
    """`Rule.blocks` of a family: an 8-bit parameter's state is blocks of
    `codec.BLOCK_SIZE` elements, each quantized on its own, so parameters of whole
    blocks can be laid end to end; one with a partial last block stays alone (its
    block's absmax is over its own elements only, and a zero-valued element does
    not keep a zero state: the dynamic map's nearest code to 0 is not 0). A 32-bit
    parameter is elementwise, and a flat buffer of them keeps 32-bit state whatever
    its length (``optim_bits`` 32). AdEMAMix's two stacked moments and a trust
    ratio (LAMB, LARS) keep a parameter alone."""

    def blocks(value: Any, flags: Options, state: Any) -> tuple[int, dict] | None:
        size = int(value.size)
        if kernel.double or flags["use_unorm"]:
            return None
        if state is None:
            eight = eight_bit(size, flags["optim_bits"], flags["min_8bit_size"])
        else:
            eight = state.absmax1 is not None
        if not eight:
            return 1, {"optim_bits": 32}
        return (codec.BLOCK_SIZE, {}) if size % codec.BLOCK_SIZE == 0 else None

    return blocks


def _init(kernel: Kernel) -> Callable[..., BnbState]:
    def init(param, hyper, *, optim_bits, min_8bit_size, use_unorm, **_) -> BnbState:
        shape = tuple(param.shape)
        first = (2, *shape) if kernel.double else shape
        blocks = blockwise.blocks_of(int(math.prod(shape)), codec.BLOCK_SIZE)
        unorm = jnp.zeros((1,), jnp.float32) if use_unorm else None
        step = jnp.zeros((), jnp.int32)
        if eight_bit(int(math.prod(shape)), optim_bits, min_8bit_size):
            absmax1 = jnp.zeros((2, blocks) if kernel.double else (blocks,), jnp.float32)
            two = kernel.two_states
            return BnbState(
                step,
                jnp.zeros(first, jnp.uint8),
                jnp.zeros(shape, jnp.uint8) if two else None,
                absmax1,
                jnp.zeros((blocks,), jnp.float32) if two else None,
                unorm,
            )
        state2 = jnp.zeros(shape, jnp.float32) if kernel.two_states else None
        return BnbState(step, jnp.zeros(first, jnp.float32), state2, None, None, unorm)

    return init


def _update(kernel: Kernel) -> Callable[..., tuple[Array, BnbState]]:
    def update(param, grad, state, h, **flags) -> tuple[Array, BnbState]:
        f32 = jnp.float32
        h = {k: jnp.asarray(v, f32) for k, v in h.items()}
        p, g = param.astype(f32), grad.astype(f32)
        step = state.step + 1
        t = step.astype(f32)
        if state.absmax1 is None:  # the 32-bit kernel
            s1 = state.state1.astype(f32)
            s2 = None if state.state2 is None else state.state2.astype(f32)
            p, s1, s2, unorm = kernel.step32(p, g, s1, s2, h, t, flags)
            unorm_vec = state.unorm_vec
            if unorm_vec is not None and unorm is not None:
                unorm_vec = jnp.reshape(unorm, (1,)).astype(f32)
            return p, BnbState(step, s1, s2, None, None, unorm_vec)
        # XLA's graph (`_step8`) is one graph for the whole step: XLA decides what to
        # store between its kernels (on a GPU, for a tensor the fused kernel does not
        # take, the float32 states once, from the absmax reduction; recomputing them
        # from the codes measured slower there)
        step8 = functools.partial(_step8, kernel, h=h, t=t, flags=flags)
        stored = (state.state1, state.absmax1, state.state2, state.absmax2)
        branches = {}
        if chunks.chunkable(p.size, codec.BLOCK_SIZE):
            # on the CPU, the same graph on chunks of blocks; AdEMAMix's two moments of
            # `state1` (and their absmax) are stacked on a leading axis
            lead = (int(kernel.double),) * 2 + (0, 0)
            branches["cpu"] = functools.partial(
                chunks.in_chunks, step8, block_size=codec.BLOCK_SIZE, lead=lead
            )
        if _pallas.supported(kernel, p) and kernel_ops.on_gpu():
            # on a GPU, one fused kernel per tensor (only offered there: jax 0.4 lowers
            # every branch, and Pallas' Triton kernel does not lower for another backend)
            branches["cuda"] = functools.partial(_fused, kernel, h, t, flags)
        if branches:
            new = jax.lax.platform_dependent(p, g, *stored, default=step8, **branches)
        else:
            new = step8(p, g, *stored)
        p, codes1, absmax1, codes2, absmax2 = new
        return p, BnbState(step, codes1, codes2, absmax1, absmax2, state.unorm_vec)

    return update


def _step8(kernel: Kernel, p, g, codes1, absmax1, codes2, absmax2, *, h, t, flags) -> tuple:
    """The 8-bit kernel on arrays of any shape (the CPU's chunks: ``(blocks, 256)``):
    dequantize, the rule, quantize."""
    state = BnbState(None, codes1, codes2, absmax1, absmax2, None)
    p, s1, s2 = kernel.step8(p, g, *_dequantized(kernel, state), h, t, flags)
    if kernel.double:
        pairs = [codec.quantize_blockwise(s1[i]) for i in (0, 1)]
        codes1 = jnp.stack([c for c, _ in pairs])
        absmax1 = jnp.stack([a for _, a in pairs])
    else:
        codes1, absmax1 = codec.quantize_blockwise(s1)
    codes2 = absmax2 = None
    if kernel.two_states:
        codes2, absmax2 = codec.quantize_blockwise(s2, signed=False)
    return p, codes1, absmax1, codes2, absmax2


def step8_scalars(kernel: Kernel, h: Mapping[str, Array], t: Array) -> dict[str, Array]:
    """The scalars of an 8-bit step: the hyper-parameters, the step count (``step``)
    and, for a rule that reads them, the bias corrections, computed once (by XLA)."""
    scalars = {**h, "step": t}
    if kernel.corrected:
        scalars["bias_correction1"], scalars["bias_correction2"] = corrections(h, t)
    return scalars


def _fused(kernel: Kernel, h, t, flags, p, g, codes1, absmax1, codes2, absmax2) -> tuple:
    """`_step8` as the GPU's one fused kernel (`_pallas.fused_step8`)."""
    state = BnbState(None, codes1, codes2, absmax1, absmax2, None)
    return _pallas.fused_step8(kernel, p, g, state, step8_scalars(kernel, h, t), flags)


def xla_step8(kernel: Kernel, p, g, state: BnbState, scalars, flags) -> tuple:
    """XLA's graph of the 8-bit step (`_step8`) from a state and `step8_scalars`:
    ``(p, codes1, absmax1, codes2, absmax2)``, as `_pallas.fused_step8` returns them."""
    stored = (state.state1, state.absmax1, state.state2, state.absmax2)
    return _step8(kernel, p, g, *stored, h=scalars, t=scalars["step"], flags=flags)


def _dequantized(kernel: Kernel, state: BnbState) -> tuple[Array, Array | None]:
    """The float32 states of the 8-bit kernel."""
    dequantize = codec.dequantize_blockwise
    if kernel.double:
        s1 = jnp.stack([dequantize(state.state1[i], state.absmax1[i]) for i in (0, 1)])
    else:
        s1 = dequantize(state.state1, state.absmax1)
    s2 = None
    if kernel.two_states:
        s2 = dequantize(state.state2, state.absmax2, signed=False)
    return s1, s2


def rule(
    name: str,
    kernel: Kernel,
    validate: Callable[[Options], None],
    split: Callable[[Options], tuple[dict, dict]],
    *,
    bits: int | None = None,
    complements: tuple[str, ...] = ("beta1", "beta2"),
) -> Rule:
    """The `Rule` of one bitsandbytes class: `kernel`'s update with `name`'s checks.

    ``split`` gives the hyper-parameters and the rule's own flags; this adds the flags
    every class shares (`optim_bits`, `min_8bit_size`, `use_unorm`). ``bits``: the
    class's fixed state width (`Adam8bit`: 8), else the `optim_bits` option's, which is
    checked at the first step as bitsandbytes checks it.
    """

    def full_split(o: Options) -> tuple[dict, dict]:
        hyper, flags = split(o)
        flags = {
            **flags,
            "optim_bits": int(o["optim_bits"]) if bits is None else bits,
            "min_8bit_size": int(o["min_8bit_size"]),
            "use_unorm": bool(o.get("max_unorm", 0.0) > 0.0),
        }
        return hyper, flags

    return Rule(
        name=name,
        state=BnbState,
        validate=validate,
        split=full_split,
        init=_init(kernel),
        update=_update(kernel),
        complements=complements,
        supports_complex=False,
        elementwise=False,
        batched=True,
        batched_unless=("gpu",),
        blocks=_blocks(kernel),
        check_at_step=check_bits if bits is None else None,
    )


# -- helpers of the kernels ----------------------------------------------------------------
def corrections(h: Mapping[str, Array], t: Array) -> tuple[Array, Array]:
    """bitsandbytes' `1 - beta1**t` and `sqrt(1 - beta2**t)` (float32, accurate near 1);
    inside the fused GPU kernel, the values computed before it (`bias_correction1`,
    `bias_correction2`)."""
    if "bias_correction1" in h:
        return h["bias_correction1"], h["bias_correction2"]
    return one_minus_pow(h["one_minus_beta1"], t), jnp.sqrt(one_minus_pow(h["one_minus_beta2"], t))


def decayed(p: Array, h: Mapping[str, Array], flags: Mapping[str, Any]) -> Array:
    """Decoupled weight decay, `p * (1 - lr * wd)`, where bitsandbytes applies it
    (`weight_decay > 0`)."""
    return rounded(p, h["decay"]) if flags["use_weight_decay"] else p


def rounded(x: Array, factor: Array) -> Array:
    """`x * factor` rounded to float32 on its own, as torch's separate `mul_` rounds it
    before the next `add_`: behind a select (a no-op: NaN stays NaN) XLA cannot contract
    it into a fused multiply-add with what is added to it next."""
    return jnp.where(x != x, x, x * factor)


def decay_factor(lr: Any, weight_decay: Any) -> Any:
    """`1 - lr * weight_decay` as a hyper-parameter: computed in double precision on the
    host for numbers (as bitsandbytes computes it in Python), else in the graph (a
    schedule's value is known only at the step)."""
    if is_number(lr) and is_number(weight_decay):
        return 1.0 - float(lr) * float(weight_decay)
    if callable(lr) or callable(weight_decay):
        return lambda count: 1 - _at(lr, count) * _at(weight_decay, count)
    return 1 - as_hyper(lr) * as_hyper(weight_decay)


def _at(value: Any, count: Array) -> Any:
    return value(count) if callable(value) else value


def trust_ratio(update: Array, p: Array, h: Mapping[str, Array], flags: Mapping[str, Any]):
    """LAMB's and LARS's scale of the update, `min(1, max_unorm |p| / |u|)`, and `|u|`
    (bitsandbytes' `max_unorm > 0`; `|p|` is the norm before the step), or `(1, None)`."""
    if not flags["use_unorm"]:
        return 1.0, None
    unorm = jnp.sqrt(jnp.sum(update * update))
    bound = h["max_unorm"] * jnp.sqrt(jnp.sum(p * p))
    one = jnp.ones((), jnp.float32)
    scale = jnp.where(unorm > bound, bound / jnp.where(unorm > bound, unorm, one), one)
    return scale, unorm


# -- checks, in bitsandbytes' words -----------------------------------------------------------
def check_base(o: Options, betas: tuple[Any, ...] | None = None, eps: Any = None) -> None:
    """`Optimizer1State`/`Optimizer2State`'s checks: lr, eps, each beta, weight_decay.

    Raises:
      ValueError: `Invalid learning rate: -1.0`, `Invalid epsilon value: ...`,
        `Invalid beta parameter at index i: ...`, `Invalid weight_decay value: ...`.
    """
    _validate.lr(o["lr"])
    _validate.non_negative(o["eps"] if eps is None else eps, "epsilon value")
    betas = o["betas"] if betas is None else betas
    if not isinstance(betas, tuple | list):
        raise TypeError(f"betas must be a tuple of numbers, but got {type(betas).__name__}")
    for index, beta in enumerate(betas):
        number = _validate.scalar(beta, f"betas[{index}]")
        if number is not None and not 0.0 <= number < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
    _validate.non_negative(o["weight_decay"], "weight_decay value")


def check_bits(o: Options) -> None:
    """bitsandbytes' refusal, at the first step, of an `optim_bits` other than 8 or 32.

    Raises:
      NotImplementedError: `Amount of optimizer bits not supported: 16`.
    """
    if o["optim_bits"] not in (8, 32):
        raise NotImplementedError(f"Amount of optimizer bits not supported: {o['optim_bits']}")


def check_args(o: Options, name: str) -> None:
    """`args` (bitsandbytes' object of extra options) is not taken: its fields are the
    keywords `optim_bits` and `min_8bit_size`.

    Raises:
      TypeError: `args` is not `None`.
    """
    if o.get("args") is not None:
        raise TypeError(
            f"{name}(args=...) is not supported by lucid: pass optim_bits and min_8bit_size "
            "as keywords instead"
        )


# -- arguments every class shares ------------------------------------------------------------
def optim_bits(default: int = 32, fixed: int | None = None) -> Arg:
    """`optim_bits`: 8 or 32 bits of state (or, for an `8bit` class, a value it checks)."""
    if fixed is None:
        doc = (
            "bits of optimizer state: 8 (codes and per-block absmax) or 32 (float32); "
            "another value raises bitsandbytes' `NotImplementedError` at the first step."
        )
    else:
        doc = f"bitsandbytes' compatibility argument: the state is always {fixed}-bit."
    return Arg("optim_bits", default, int, doc)


ARGS = Arg(
    "args",
    None,
    Any,
    "bitsandbytes' object of extra options: not taken (`TypeError` unless `None`); pass "
    "`optim_bits` and `min_8bit_size` as keywords.",
)
MIN_8BIT_SIZE = Arg(
    "min_8bit_size",
    4096,
    int,
    "parameters with fewer elements keep 32-bit state even in 8-bit mode (bitsandbytes' rule).",
)
IS_PAGED = Arg(
    "is_paged",
    False,
    bool,
    "bitsandbytes' paged (CUDA unified memory) state: accepted and ignored, JAX places "
    "arrays itself.",
)


def max_unorm(default: float) -> Arg:
    """`max_unorm`: the trust-ratio bound of LAMB and LARS (0 turns it off)."""
    return Arg(
        "max_unorm",
        default,
        Any,
        "the update's norm is capped at `max_unorm * |p|` in the 32-bit kernel (0: no cap); "
        "bitsandbytes' 8-bit kernel does not apply it.",
    )


def values_of(o: Options, *names: str) -> dict[str, Any]:
    """The named options as hyper-parameters."""
    return {name: o[name] for name in names}


def transform(specs: Mapping[str, tuple[Rule, Any]], name: str, prose: str) -> Callable:
    """The functional form of bitsandbytes' class `name` (snake_case: `paged_adamw8bit`)."""
    from .._signature import transform_of

    rule, signature = specs[name]
    factory = name.lower().replace("paged", "paged_")
    made = transform_of(
        rule, signature, factory, f"`bitsandbytes.optim.{name}` as an optax transformation: {prose}"
    )
    made.__doc__ = made.__doc__.replace(f"LF.{factory}(", f"LF.bnb.{factory}(")
    return made
