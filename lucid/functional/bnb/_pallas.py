"""bitsandbytes' 8-bit step as one GPU kernel per parameter (Pallas, Triton backend).

XLA splits a block-quantized update into two kernels: one reduces each block's new
absmax, the next writes the parameter and the codes, and the float32 moments travel
between them through memory (32 bytes per float32 parameter for Adam, more than float32
Adam's 28). This kernel does the whole step for a tile of blocks in one pass, as
bitsandbytes' CUDA kernel does: it reads the parameter, the gradient, the codes and the
absmax, and writes the parameter, the codes and the absmax (16 bytes per parameter).

The arithmetic is the rule's own (`Kernel.step8`, traced inside the kernel) and the
quantization `lucid.functional._lowbit`'s (`absmax_ignoring_nan`, `table_index`, the same
code tables), so the two paths differ only in how the compiler schedules the same
operations (where it contracts a multiply and an add into one fused multiply-add: a
last-bit difference now and then).
Triton may lower a float32 division or square root to an approximate instruction; on the
GPU every `div` and `sqrt` of the traced rule is replaced by the correctly rounded PTX
instruction (`div.rn.f32`, `sqrt.rn.f32`), as XLA's are rounded. The bias corrections
are computed outside the kernel (they need `expm1`/`log1p`, whose implementations differ
between XLA and libdevice) and enter it as scalars.

The parameter, codes and absmax are written over their inputs (each tile reads and writes
only itself), so the compiled step's donated buffers are updated in place: without that,
XLA copied each result into its donated buffer, which cost as much as the step.

jax 0.11 warns that Pallas' Triton backend is deprecated in favour of Mosaic GPU; the
kernel uses only `pallas_call`, block specs, ref indexing and Triton's inline assembly.

`fused_step8` is what `_family` calls on a GPU (through `jax.lax.platform_dependent`);
with ``interpret=True`` the same kernel runs on any backend through Pallas' interpreter,
which is how the CPU tests check it against the XLA path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .._lowbit import blockwise, nearest
from .._lowbit import bnb as codec

Array = jax.Array

try:  # jax >= 0.5 keeps the jaxpr types in jax.extend.core
    from jax.extend.core import Literal as _LITERAL
except ImportError:  # pragma: no cover - jax 0.4
    from jax.core import Literal as _LITERAL

ROWS = 1
"""Blocks of 256 elements one kernel instance updates (a tile of ``ROWS x 256``). One
block and one warp per instance measured fastest on an H200 (1.5 ms for 2**28 float32
parameters, against 3.0-4.5 ms for every larger tile tried: `benchmarks/probe_bnb_pallas.py`)."""

WARPS = 1
"""Warps per kernel instance."""


def supported(kernel: Any, param: Array) -> bool:
    """Whether the fused kernel takes this parameter: a one-moment-per-state rule (not
    AdEMAMix's stacked pair) over a whole number of blocks, of fewer than 2**31
    elements (Triton's offsets are 32-bit)."""
    size = int(math.prod(param.shape))
    whole = size > 0 and size % codec.BLOCK_SIZE == 0
    return not kernel.double and whole and size < 2**31


def _rows_per_tile(blocks: int) -> int:
    """The largest power of two up to `ROWS` that divides the number of blocks."""
    rows = ROWS
    while blocks % rows:
        rows //= 2
    return rows


def _exact_ops_gpu() -> dict[Any, Callable[..., Array]]:
    from jax.experimental.pallas import triton as plt

    def asm(instruction: str, arity: int) -> Callable[..., Array]:
        operands = ", ".join(f"${i}" for i in range(arity + 1))

        def op(*xs: Array) -> Array:
            if all(jnp.ndim(x) == 0 for x in xs):
                # Triton's inline assembly takes tensors: a scalar goes through a pair
                return jnp.max(op(*(jnp.full((2,), x, jnp.float32) for x in xs)))
            xs = jnp.broadcast_arrays(*xs)
            return plt.elementwise_inline_asm(
                f"{instruction} {operands};",
                args=list(xs),
                constraints="=r," + ",".join(["r"] * arity),
                pack=1,
                result_shape_dtypes=[jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype)],
            )[0]

        return op

    return {lax.div_p: asm("div.rn.f32", 2), lax.sqrt_p: asm("sqrt.rn.f32", 1)}


def _eval_with(jaxpr: Any, consts: list, args: list, ops: Mapping[Any, Callable]) -> list:
    """Evaluate ``jaxpr`` with the float32 primitives in ``ops`` replaced (a jaxpr
    interpreter, as jax's documentation writes one; nested ``jit`` calls are entered)."""
    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if isinstance(var, _LITERAL) else env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if eqn.primitive in ops and all(jnp.result_type(v) == jnp.float32 for v in values):
            outs = [ops[eqn.primitive](*values)]
        elif inner is not None and hasattr(inner, "jaxpr"):
            outs = _eval_with(inner.jaxpr, list(inner.consts), values, ops)
        elif any(isinstance(v, jax.core.Tracer) for v in values):
            outs = eqn.primitive.bind(*values, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        else:  # constants only (a literal's negation): folded here, as tracing folds them
            with jax.ensure_compile_time_eval():
                outs = eqn.primitive.bind(*values, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _rule_in_kernel(kernel: Any, flags: Mapping[str, Any], exact: bool) -> Callable:
    """``(p, g, s1, s2, h) -> (p, s1, s2)``: the kernel's `step8` on tiles, with the
    GPU's correctly rounded division and square root when ``exact``."""

    def rule(p, g, s1, s2, h):
        return kernel.step8(p, g, s1, s2, h, h["step"], flags)

    if not exact:
        return rule

    def exact_rule(p, g, s1, s2, h):
        closed = jax.make_jaxpr(rule)(p, g, s1, s2, h)
        flat = jax.tree_util.tree_leaves((p, g, s1, s2, h))
        outs = _eval_with(closed.jaxpr, list(closed.consts), flat, _exact_ops_gpu())
        return outs[0], outs[1], (outs[2] if s2 is not None else None)

    return exact_rule


def fused_step8(
    kernel: Any,
    p: Array,
    g: Array,
    state: Any,
    h: Mapping[str, Array],
    flags: Mapping[str, Any],
    *,
    interpret: bool = False,
) -> tuple[Array, Array, Array, Array | None, Array | None]:
    """One 8-bit step of ``kernel`` for one parameter, in one kernel.

    Args:
      kernel: the rule family (`_family.Kernel`, not AdEMAMix's).
      p, g: the float32 parameter and gradient, of a size that is a multiple of 256.
      state: its `BnbState` (8-bit).
      h: the float32 hyper-parameters, with the step count as ``step`` and, for a rule
        that reads them, the bias corrections (``bias_correction1``,
        ``bias_correction2``).
      flags: the rule's static flags.
      interpret: run through Pallas' interpreter (any backend) instead of Triton.

    Returns:
      ``(p, codes1, absmax1, codes2, absmax2)``, the new parameter (float32) and state
      (``codes2``, ``absmax2``: ``None`` for a one-state rule).
    """
    two = kernel.two_states
    shape = p.shape
    blocks = p.size // codec.BLOCK_SIZE
    rows = _rows_per_tile(blocks)
    names = sorted(h)
    width = max(2, 1 << (len(names) - 1).bit_length())  # Triton blocks are powers of two
    scalars = (
        jnp.zeros((width,), jnp.float32)
        .at[: len(names)]
        .set(jnp.stack([jnp.asarray(h[k], jnp.float32) for k in names]))
    )
    rule = _rule_in_kernel(kernel, flags, exact=not interpret)

    def tables(signed: bool) -> list[Array]:
        return [jnp.asarray(t) for t in codec.code_tables(signed)]

    def as_rows(x: Array) -> Array:
        return x.reshape(blocks, codec.BLOCK_SIZE)

    def body(scalars_ref, *refs):
        n_in = 10 if two else 6
        ins, outs = refs[:n_in], refs[n_in:]
        hyper = {k: scalars_ref[i] for i, k in enumerate(names)}
        map1, lut1 = ins[0], ins[1]
        p_ref, g_ref, c1_ref, a1_ref = ins[-6:-2] if two else ins[-4:]
        s1 = map1[c1_ref[...].astype(jnp.int32)] * a1_ref[...][:, None]
        s2 = None
        if two:
            map2, lut2, c2_ref, a2_ref = ins[2], ins[3], ins[-2], ins[-1]
            s2 = map2[c2_ref[...].astype(jnp.int32)] * a2_ref[...][:, None]
        new_p, s1, s2 = rule(p_ref[...], g_ref[...], s1, s2, hyper)
        outs[0][...] = new_p
        absmax1 = blockwise.absmax_ignoring_nan(s1)
        outs[1][...] = lut1[nearest.table_index(s1, absmax1)]
        outs[2][...] = absmax1
        if two:
            absmax2 = blockwise.absmax_ignoring_nan(s2)
            outs[3][...] = lut2[nearest.table_index(s2, absmax2)]
            outs[4][...] = absmax2

    def whole(n: int) -> pl.BlockSpec:
        return pl.BlockSpec((n,), lambda i: (0,))

    tile = pl.BlockSpec((rows, codec.BLOCK_SIZE), lambda i: (i, 0))
    scales = pl.BlockSpec((rows,), lambda i: (i,))
    table_specs = [whole(256), whole(65536)] * (2 if two else 1)
    operands = tables(True) + (tables(False) if two else [])
    operands += [as_rows(p), as_rows(g), as_rows(state.state1), state.absmax1]
    in_specs = [whole(width), *table_specs, tile, tile, tile, scales]
    out_specs = [tile, tile, scales]
    out_shape = [
        jax.ShapeDtypeStruct((blocks, codec.BLOCK_SIZE), jnp.float32),
        jax.ShapeDtypeStruct((blocks, codec.BLOCK_SIZE), jnp.uint8),
        jax.ShapeDtypeStruct((blocks,), jnp.float32),
    ]
    if two:
        operands += [as_rows(state.state2), state.absmax2]
        in_specs += [tile, scales]
        out_specs += [tile, scales]
        out_shape += out_shape[1:]
    params = {}
    if not interpret:
        from jax.experimental.pallas import triton as plt

        # jax 0.4 names the class TritonCompilerParams
        make = getattr(plt, "CompilerParams", None) or plt.TritonCompilerParams
        params["compiler_params"] = make(num_warps=WARPS, num_stages=1)
    # the parameter, codes and absmax are written where they were read (each tile reads
    # and writes only itself): a donated buffer is updated in place, with no copy
    first = len(operands) - (6 if two else 4)
    aliases = {first: 0, first + 2: 1, first + 3: 2}
    if two:
        aliases |= {first + 4: 3, first + 5: 4}
    outs = pl.pallas_call(
        body,
        grid=(blocks // rows,),
        input_output_aliases={i + 1: o for i, o in aliases.items()},  # (+1: the scalars)
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret,
        **params,
    )(scalars, *operands)
    new_p = outs[0].reshape(shape)
    codes1 = outs[1].reshape(shape)
    if two:
        return new_p, codes1, outs[2], outs[3].reshape(shape), outs[4]
    return new_p, codes1, outs[2], None, None


__all__ = ["fused_step8", "supported"]
