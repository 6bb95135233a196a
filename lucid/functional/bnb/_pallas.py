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

jax 0.11 deprecates Pallas' Triton backend in favour of Mosaic GPU, which lowers no
gather: the kernel runs where `lucid._platform.triton_backend` says (a jax
that has the Triton backend and does not deprecate it, or the opt-in), else the XLA graph.

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
from jax.experimental import pallas as pl

from .._lowbit import blockwise, nearest
from .._lowbit import bnb as codec
from .._lowbit import pallas as kernel_ops

Array = jax.Array

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


def _rule_in_kernel(kernel: Any, flags: Mapping[str, Any], exact: bool) -> Callable:
    """``(p, g, s1, s2, h) -> (p, s1, s2)``: the kernel's `step8` on tiles, with the
    GPU's correctly rounded division and square root when ``exact``."""

    def rule(p, g, s1, s2, h):
        return kernel.step8(p, g, s1, s2, h, h["step"], flags)

    return kernel_ops.exact(rule, gpu=exact)


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
    names, scalars = kernel_ops.scalar_vector(h)
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
    in_specs = [whole(scalars.size), *table_specs, tile, tile, tile, scales]
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
    params = {} if interpret else kernel_ops.compiler_params(WARPS)
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


_eval_with = kernel_ops.eval_with  # (the tests call it by this module's name)
