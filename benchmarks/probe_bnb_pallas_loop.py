"""Probe: bitsandbytes' fused 8-bit AdamW kernel with several blocks per kernel instance
walked in a loop (one block of 256 per iteration), against one block per instance (the
shipped kernel) and against kernels that only move the bytes. Needs a CUDA GPU::

    PYTHONPATH=. python benchmarks/probe_bnb_pallas_loop.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt
from probe_bnb_pallas import ADAM, FLAGS, _scalars

from lucid.functional._lowbit import blockwise, nearest
from lucid.functional._lowbit import bnb as codec
from lucid.functional.bnb import _family, _pallas

B = codec.BLOCK_SIZE


def looped(p, g, state, *, per_program, warps, stages, sub=1):
    h = _scalars()
    blocks = p.size // B
    names = sorted(h)
    width = max(2, 1 << (len(names) - 1).bit_length())
    scalars = (
        jnp.zeros((width,), jnp.float32)
        .at[: len(names)]
        .set(jnp.stack([jnp.asarray(h[k], jnp.float32) for k in names]))
    )
    rule = _pallas._rule_in_kernel(ADAM, FLAGS, exact=True)
    map1, lut1 = (jnp.asarray(t) for t in codec.code_tables(True))
    map2, lut2 = (jnp.asarray(t) for t in codec.code_tables(False))

    def body(
        s_ref, m1, l1, m2, l2, p_ref, g_ref, c1_ref, a1_ref, c2_ref, a2_ref, po, c1o, a1o, c2o, a2o
    ):
        hyper = {k: s_ref[i] for i, k in enumerate(names)}

        def one(j, carry):
            rows = pl.ds(j * sub, sub)
            s1 = m1[c1_ref[rows, :].astype(jnp.int32)] * a1_ref[rows][:, None]
            s2 = m2[c2_ref[rows, :].astype(jnp.int32)] * a2_ref[rows][:, None]
            new_p, s1, s2 = rule(p_ref[rows, :], g_ref[rows, :], s1, s2, hyper)
            po[rows, :] = new_p
            am1 = blockwise.absmax_ignoring_nan(s1)
            c1o[rows, :] = l1[nearest.table_index(s1, am1)]
            a1o[rows] = am1
            am2 = blockwise.absmax_ignoring_nan(s2)
            c2o[rows, :] = l2[nearest.table_index(s2, am2)]
            a2o[rows] = am2
            return carry

        lax.fori_loop(0, per_program // sub, one, 0)

    whole = lambda n: pl.BlockSpec((n,), lambda i: (0,))  # noqa: E731
    tile = pl.BlockSpec((per_program, B), lambda i: (i, 0))
    scales = pl.BlockSpec((per_program,), lambda i: (i,))
    rows = lambda x: x.reshape(blocks, B)  # noqa: E731
    out_shape = [
        jax.ShapeDtypeStruct((blocks, B), jnp.float32),
        jax.ShapeDtypeStruct((blocks, B), jnp.uint8),
        jax.ShapeDtypeStruct((blocks,), jnp.float32),
        jax.ShapeDtypeStruct((blocks, B), jnp.uint8),
        jax.ShapeDtypeStruct((blocks,), jnp.float32),
    ]
    return pl.pallas_call(
        body,
        grid=(blocks // per_program,),
        input_output_aliases={5: 0, 7: 1, 8: 2, 9: 3, 10: 4},
        in_specs=[
            whole(width),
            whole(256),
            whole(65536),
            whole(256),
            whole(65536),
            tile,
            tile,
            tile,
            scales,
            tile,
            scales,
        ],
        out_specs=[tile, tile, scales, tile, scales],
        out_shape=out_shape,
        compiler_params=plt.CompilerParams(num_warps=warps, num_stages=stages),
    )(
        scalars,
        map1,
        lut1,
        map2,
        lut2,
        rows(p),
        rows(g),
        rows(state.state1),
        state.absmax1,
        rows(state.state2),
        state.absmax2,
    )


def moves(p, g, state, *, rows_per, warps, loop=1):
    blocks = p.size // B

    def body(p_ref, g_ref, c1, c2, po, c1o, c2o):
        def one(j, carry):
            r = pl.ds(j * (rows_per // loop), rows_per // loop)
            po[r, :] = p_ref[r, :] - g_ref[r, :]
            c1o[r, :] = c1[r, :] + c2[r, :]
            c2o[r, :] = c2[r, :] - c1[r, :]
            return carry

        lax.fori_loop(0, loop, one, 0)

    tile = pl.BlockSpec((rows_per, B), lambda i: (i, 0))
    shape = lambda d: jax.ShapeDtypeStruct((blocks, B), d)  # noqa: E731
    args = [x.reshape(blocks, B) for x in (p, g, state.state1, state.state2)]
    return pl.pallas_call(
        body,
        grid=(blocks // rows_per,),
        input_output_aliases={0: 0, 2: 1, 3: 2},
        in_specs=[tile] * 4,
        out_specs=[tile] * 3,
        out_shape=[shape(jnp.float32), shape(jnp.uint8), shape(jnp.uint8)],
        compiler_params=plt.CompilerParams(num_warps=warps, num_stages=1),
    )(*args)


def median_ms(step, carry, g, repeats=20) -> float:
    """Median ms of ``carry = step(carry, g)`` (the carry donated, as the compiled step's)."""
    run = jax.jit(step, donate_argnums=(0,))
    carry = run(carry, g)
    jax.block_until_ready(carry)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        carry = run(carry, g)
        jax.block_until_ready(carry)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    n = 1 << 28
    blocks = n // B
    key = jax.random.PRNGKey(0)
    g = jax.random.normal(key, (n,), jnp.float32) * 1e-3

    def fresh():
        codes = jax.random.randint(key, (n,), 0, 256).astype(jnp.uint8)
        absmax = jnp.full((blocks,), 0.01, jnp.float32)
        return (jnp.full((n,), 0.02, jnp.float32), codes, absmax, codes + 1, absmax * 0.1)

    gb = 16 * n / 1e9

    def adamw(c, g):
        p, m, v = c
        return p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), 0.9 * m + 0.1 * g, v * 0.999 + g * g

    ms = median_ms(adamw, (jnp.full((n,), 0.02), g + 0, g * g), g)
    print(f"{jax.devices()[0]}, jax {jax.__version__}, {n} float32 params, median ms, TB/s at 16 B")
    print(
        f"  float32 AdamW-like XLA: {ms:.3f} ms, {28 * n / 1e9 / ms:.2f} TB/s at 28 B", flush=True
    )

    def state_of(c):
        return _family.BnbState(jnp.int32(3), c[1], c[3], c[2], c[4], None)

    def show(name, f):
        try:
            ms = median_ms(f, fresh(), g)
            print(f"  {name:44s} {ms:7.3f}  {gb / ms:5.2f}", flush=True)
        except Exception as e:
            print(f"  {name:44s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)

    def shipped(c, g):
        out = _pallas.fused_step8(ADAM, c[0], g, state_of(c), _scalars(), FLAGS)
        return out

    show("shipped fused (1 block, 1 warp)", shipped)
    for rows_per, warps, loop in [
        (1, 1, 1),
        (2, 1, 1),
        (8, 1, 8),
        (8, 4, 1),
        (16, 4, 1),
        (32, 8, 1),
        (64, 1, 64),
        (64, 4, 16),
        (16, 2, 4),
    ]:

        def mv(c, g, r=rows_per, w=warps, lo=loop):
            p, c1, c2 = moves(c[0], g, state_of(c), rows_per=r, warps=w, loop=lo)
            return (p.reshape(-1), c1.reshape(-1), c[2], c2.reshape(-1), c[4])

        show(f"moves {rows_per} rows, {warps} warps, loop {loop}", mv)
    for per, warps, stages, sub in [
        (8, 1, 1, 1),
        (8, 1, 2, 1),
        (8, 1, 3, 1),
        (32, 1, 2, 1),
        (32, 1, 3, 1),
        (128, 1, 3, 1),
        (8, 2, 2, 2),
        (32, 2, 3, 2),
        (32, 4, 3, 4),
        (256, 1, 3, 1),
    ]:

        def lp(c, g, a=per, w=warps, st=stages, su=sub):
            out = looped(c[0], g, state_of(c), per_program=a, warps=w, stages=st, sub=su)
            return (out[0].reshape(-1), out[1].reshape(-1), out[2], out[3].reshape(-1), out[4])

        show(f"fused loop {per} blocks/{sub}, {warps} warps, {stages} stages", lp)
    a = jax.jit(shipped)(fresh(), g)
    b = jax.jit(lambda c, g: looped(c[0], g, state_of(c), per_program=32, warps=1, stages=3))(
        fresh(), g
    )
    same = [bool(jnp.array_equal(x.reshape(-1), y.reshape(-1))) for x, y in zip(a, b)]
    print("  looped (32, 1 warp, 3 stages) equals the shipped kernel:", same)


if __name__ == "__main__":
    main()
