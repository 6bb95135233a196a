"""torchao's low-bit Adam step (8-bit, 4-bit, fp8) as one GPU kernel per buffer (Pallas).

XLA runs a block-quantized step as two kernels: one reduces each block's new scale, the
next recomputes the moments to write the parameter and the codes (the gradient and the
codes read twice, about 22 bytes per float32 parameter against float32 Adam's 28). This
kernel does the whole step for one block in one pass: it reads the parameter, the
gradient, the codes and the scales of both moments, and writes them back in place
(about 16 bytes per parameter at 8 bits, 14 at 4 bits).

The arithmetic is the rule's own (`adam.decayed`, `adam.moments`, `adam.adam_update`),
and the quantization `lucid.functional._lowbit.torchao`'s (`scale_of`, `scaled_values`)
and `nearest`'s (the same bucket table and threshold counts), traced inside the kernel;
its float32 division, square root, max and min are the correctly rounded, NaN-keeping
ones on the GPU (the fp8 scale's divisor 448 is an operand: a kernel holds no constant
arrays) (`lucid.functional._lowbit.pallas.exact`). The two programs differ only
in where their compilers contract a multiply and an add (a last-bit difference now and
then, which may move a value on a rounding boundary to the neighbouring code). The bias
corrections are computed outside the kernel and enter it as scalars.

In the kernel every code map and bucket table is an operand read by a gather; fp8 codes
travel as their ``uint8`` bits (`floats.fp8_bits`, `floats.from_fp8_bits`); a 4-bit
block's even and odd elements are read and written as two strided halves, so that each
byte's two codes are at hand (the even one in the high nibble, torchao's layout).

`fused_step` is what `adam._update` runs on a GPU (through `jax.lax.platform_dependent`)
where `lucid._platform.has_kernels` allows it; with ``interpret=True`` the same
kernel runs through Pallas' interpreter on any backend, which is how the CPU tests check
it against the XLA step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from .._lowbit import blockwise, floats, nearest
from .._lowbit import pallas as kernel_ops
from .._lowbit import torchao as codec

Array = jax.Array

WARPS = 1
"""Warps per kernel instance (one block each), as bitsandbytes' kernel measured best."""


def supported(param: Array, grad: Array, state: Any, block_size: int, form: str) -> bool:
    """Whether the fused kernel takes this step: float32 parameter and gradient, quantized
    moments without AMSGrad's third, blocks of a power of two (Triton's tiles) of at
    least 32 elements, a whole number of them, fewer than 2**31 elements."""
    size = int(np.prod(jnp.shape(param)))
    power = block_size >= 32 and block_size & (block_size - 1) == 0
    return (
        jnp.result_type(param) == jnp.float32
        and jnp.result_type(grad) == jnp.float32
        and state.exp_avg_scale is not None
        and state.max_exp_avg_sq is None
        and power
        and size % block_size == 0
        and 0 < size < 2**31
    )


def _padded(table: np.ndarray, fill: float) -> np.ndarray:
    """``table`` padded to a power-of-two length (Triton's blocks) with ``fill``."""
    size = 1 << max(1, (table.shape[0] - 1).bit_length())
    out = np.full((size, *table.shape[1:]), fill, np.float32)
    out[: table.shape[0]] = table
    return out


def _tables(form: str, signed: bool) -> list[np.ndarray]:
    """The operands a moment's codes need: the code map (8 and 4 bits), and for 8 bits
    the three columns of `nearest.bucket_table` (4 bits count its 15 thresholds)."""
    if form == "fp8":
        return []
    table = codec.code_table(form, signed)
    if form == "4bit":
        return [table]
    _, _, rows = nearest.bucket_table(table)
    return [table] + [_padded(np.ascontiguousarray(rows[:, k]), np.inf) for k in range(3)]


def _codes(scaled: Array, form: str, signed: bool, refs: list) -> Array:
    """int32 codes (fp8: the bits) of scaled values, inside the kernel."""
    if form == "fp8":
        return floats.fp8_bits(scaled, floats.rint_small).astype(jnp.int32)
    table = codec.code_table(form, signed)
    if form == "4bit":
        return nearest.count_thresholds(scaled, table)
    shift, first, rows = nearest.bucket_table(table)
    index = jnp.clip(nearest.bucket_index(scaled, shift, first), 0, rows.shape[0] - 1)
    below, low, high = (ref[index] for ref in refs[1:4])
    return nearest.count_in_bucket(scaled, below, low, high)


def _values(codes: Array, scale: Array, form: str, refs: list) -> Array:
    """float32 values of a tile's codes (int32; fp8: the bits) and its scales."""
    if form == "fp8":
        return floats.from_fp8_bits(codes) * scale[:, None]
    return refs[0][codes] * scale[:, None]


def fused_step(
    param: Array,
    grad: Array,
    m_codes: Array,
    m_scale: Array,
    v_codes: Array,
    v_scale: Array,
    u_codes: Any = None,
    u_scale: Any = None,
    *,
    h: Mapping[str, Array],
    step: Array,
    form: str,
    adamw: bool,
    block_size: int,
    rule: Mapping[str, Callable],
    interpret: bool = False,
) -> tuple:
    """One torchao step of one buffer, in one kernel.

    Args:
      param, grad: the float32 parameter and gradient (any shape, whole blocks).
      m_codes, m_scale, v_codes, v_scale: the stored moments (codes as `LowBitAdamState`
        holds them, float32 scales).
      u_codes, u_scale: AMSGrad's, `None` (`supported`).
      h: the float32 hyper-parameters.
      step: the float32 step count after this step.
      form: ``"8bit"``, ``"4bit"`` or ``"fp8"``.
      adamw: decoupled weight decay.
      block_size: elements per scale.
      rule: the rule's arithmetic (``decayed``, ``moments``, ``update``,
        ``corrections``), as `adam` defines it.
      interpret: run through Pallas' interpreter (any backend) instead of Triton.

    Returns:
      ``(p, m_codes, m_scale, v_codes, v_scale, None, None)``, as the XLA step does.
    """
    del u_codes, u_scale
    shape = param.shape
    blocks = param.size // block_size
    fp8_codes = form == "fp8"
    bc1, bc2 = rule["corrections"](h, step)
    names, scalars = kernel_ops.scalar_vector(
        {**h, "bias_correction1": bc1, "bias_correction2": bc2, "fp8_max": floats.FP8_MAX}
    )
    # (opaque to XLA: Pallas' interpreter would fold ``scale / 448`` into a product)
    scalars = jax.lax.optimization_barrier(scalars)
    m_tables, v_tables = _tables(form, True), _tables(form, False)
    halves = form == "4bit"
    width = block_size // 2 if halves else block_size

    def arithmetic(p, g, m_old, v_old, hyper):
        """The step on the tile's pieces (two halves at 4 bits): new pieces of p, and of
        each moment its scales and scaled values."""
        corrections = (hyper["bias_correction1"], hyper["bias_correction2"])
        new_p, ms, vs = [], [], []
        for p_i, g_i, m_i, v_i in zip(p, g, m_old, v_old):
            p_i, g_i = rule["decayed"](p_i, g_i, hyper, adamw)
            m_i, v_i = rule["moments"](m_i, v_i, g_i, hyper, True)
            new_p.append(rule["update"](p_i, m_i, v_i, hyper, corrections))
            ms.append(m_i)
            vs.append(v_i)

        def quantized(pieces):
            absmax = functools.reduce(jnp.maximum, [blockwise.absmax(x) for x in pieces])
            scale = codec.scale_of(absmax, form, hyper["fp8_max"])
            return scale, [codec.scaled_values(x, scale) for x in pieces]

        return new_p, quantized(ms), quantized(vs)

    arithmetic = kernel_ops.exact(arithmetic, gpu=not interpret)
    n_m, n_v = len(m_tables), len(v_tables)

    def body(scalars_ref, *refs):
        m_refs, v_refs = list(refs[:n_m]), list(refs[n_m : n_m + n_v])
        p_ref, g_ref, mc_ref, ms_ref, vc_ref, vs_ref = refs[n_m + n_v : n_m + n_v + 6]
        p_out, mc_out, ms_out, vc_out, vs_out = refs[n_m + n_v + 6 :]
        hyper = {k: scalars_ref[i] for i, k in enumerate(names)}
        if halves:
            parts = [pl.ds(0, width, stride=2), pl.ds(1, width, stride=2)]
            p = [p_ref[:, part] for part in parts]
            g = [g_ref[:, part] for part in parts]
            m_byte, v_byte = mc_ref[...].astype(jnp.int32), vc_ref[...].astype(jnp.int32)
            m_c = [(m_byte >> 4) & 15, m_byte & 15]
            v_c = [(v_byte >> 4) & 15, v_byte & 15]
        else:
            p, g = [p_ref[...]], [g_ref[...]]
            m_c, v_c = [mc_ref[...].astype(jnp.int32)], [vc_ref[...].astype(jnp.int32)]
        m_scale_old, v_scale_old = ms_ref[...], vs_ref[...]
        m_old = [_values(c, m_scale_old, form, m_refs) for c in m_c]
        v_old = [_values(c, v_scale_old, form, v_refs) for c in v_c]
        new_p, (m_scale_new, m_scaled), (v_scale_new, v_scaled) = arithmetic(
            p, g, m_old, v_old, hyper
        )
        m_new = [_codes(x, form, True, m_refs) for x in m_scaled]
        v_new = [_codes(x, form, False, v_refs) for x in v_scaled]
        if halves:
            for part, value in zip(parts, new_p):
                p_out[:, part] = value
            mc_out[...] = ((m_new[0] << 4) | m_new[1]).astype(jnp.uint8)
            vc_out[...] = ((v_new[0] << 4) | v_new[1]).astype(jnp.uint8)
        else:
            p_out[...] = new_p[0]
            mc_out[...] = m_new[0].astype(jnp.uint8)
            vc_out[...] = v_new[0].astype(jnp.uint8)
        ms_out[...] = m_scale_new
        vs_out[...] = v_scale_new

    def code_bits(codes: Array) -> Array:
        if fp8_codes:
            codes = jax.lax.bitcast_convert_type(codes, jnp.uint8)
        return codes.reshape(blocks, -1)

    def whole(n: int) -> pl.BlockSpec:
        return pl.BlockSpec((n,), lambda i: (0,))

    tile = pl.BlockSpec((1, block_size), lambda i: (i, 0))
    code_tile = pl.BlockSpec((1, width if halves else block_size), lambda i: (i, 0))
    scales = pl.BlockSpec((1,), lambda i: (i,))
    tables = [jnp.asarray(t) for t in m_tables + v_tables]
    operands = [
        *tables,
        param.reshape(blocks, block_size),
        grad.reshape(blocks, block_size),
        code_bits(m_codes),
        m_scale,
        code_bits(v_codes),
        v_scale,
    ]
    in_specs = [whole(scalars.size), *(whole(t.shape[0]) for t in tables)]
    in_specs += [tile, tile, code_tile, scales, code_tile, scales]
    code_shape = (blocks, width if halves else block_size)
    out_shape = [
        jax.ShapeDtypeStruct((blocks, block_size), jnp.float32),
        jax.ShapeDtypeStruct(code_shape, jnp.uint8),
        jax.ShapeDtypeStruct((blocks,), jnp.float32),
        jax.ShapeDtypeStruct(code_shape, jnp.uint8),
        jax.ShapeDtypeStruct((blocks,), jnp.float32),
    ]
    # each instance reads and writes only its own block: the buffers are updated in place
    first = 1 + len(tables)  # (+1: the scalars)
    aliases = {first: 0, first + 2: 1, first + 3: 2, first + 4: 3, first + 5: 4}
    params = {} if interpret else kernel_ops.compiler_params(WARPS)
    p, mc, ms, vc, vs = pl.pallas_call(
        body,
        grid=(blocks,),
        input_output_aliases=aliases,
        in_specs=in_specs,
        out_specs=[tile, code_tile, scales, code_tile, scales],
        out_shape=out_shape,
        interpret=interpret,
        **params,
    )(scalars, *operands)

    def stored(codes: Array, like: Array) -> Array:
        if fp8_codes:
            return jax.lax.bitcast_convert_type(codes, floats.FP8).reshape(like.shape)
        return codes.reshape(like.shape)

    return p.reshape(shape), stored(mc, m_codes), ms, stored(vc, v_codes), vs, None, None


__all__ = ["fused_step", "supported"]
