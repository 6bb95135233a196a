"""bitsandbytes' 8-bit AdamW step on one large tensor: lucid's fused GPU kernel
(`lucid.functional.bnb._pallas`, one Pallas/Triton kernel per tensor) against XLA's graph
of the same step (two kernels) and float32 AdamW, and the kernel's tile sizes.

Each variant is its own jitted function (the optimizer's program cache is not involved,
so each figure is the program it names). On one 16384 x 16384 float32 tensor it prints the
median ms of: an XLA float32 AdamW-like update (28 B/param), XLA's 8-bit step
(`_family.xla_step8`), the fused kernel (`_pallas.fused_step8`) at several tiles (blocks of
256 per kernel instance x warps), and a trivial Pallas kernel that only moves the fused
step's 16 B/param (its floor). It needs a CUDA GPU::

    PYTHONPATH=. python benchmarks/probe_bnb_pallas.py
"""

from __future__ import annotations

import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from lucid.functional.bnb import _family, _pallas

ADAM = importlib.import_module("lucid.functional.bnb.adam").ADAM_KERNEL
FLAGS = {"use_weight_decay": True, "use_unorm": False}
HYPER = {"lr": 1e-3, "eps": 1e-8, "weight_decay": 1e-2, "beta1": 0.9, "beta2": 0.999}
HYPER |= {"one_minus_beta1": 0.1, "one_minus_beta2": 0.001, "decay": 1 - 1e-5}


def _scalars() -> dict:
    h = {k: jnp.float32(v) for k, v in HYPER.items()}
    return _family.step8_scalars(ADAM, h, jnp.float32(4.0))


def fused(p, g, state):
    return _pallas.fused_step8(ADAM, p, g, state, _scalars(), FLAGS)


def xla(p, g, state):
    return _family.xla_step8(ADAM, p, g, state, _scalars(), FLAGS)


def moves_only(p, g, state):
    """A kernel that reads p, g and both codes and writes p and both codes (16 B/param)."""

    def body(p_ref, g_ref, c1, c2, po, c1o, c2o):
        po[...] = p_ref[...] - g_ref[...]
        c1o[...] = c1[...] + c2[...]
        c2o[...] = c2[...]

    blocks = p.size // 256
    tile = pl.BlockSpec((8, 256), lambda i: (i, 0))
    shape = lambda d: jax.ShapeDtypeStruct((blocks, 256), d)  # noqa: E731
    args = [x.reshape(blocks, 256) for x in (p, g, state.state1, state.state2)]
    return pl.pallas_call(
        body,
        grid=(blocks // 8,),
        in_specs=[tile] * 4,
        out_specs=[tile] * 3,
        out_shape=[shape(jnp.float32), shape(jnp.uint8), shape(jnp.uint8)],
        compiler_params=plt.CompilerParams(num_warps=4, num_stages=1),
    )(*args)


def median_ms(f, *args, repeats=20) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    shape = (16384, 16384)
    blocks = shape[0] * shape[1] // 256
    p = jnp.full(shape, 0.02, jnp.float32)
    g = jnp.full(shape, 1e-3, jnp.float32)
    codes = jax.random.randint(jax.random.PRNGKey(0), shape, 0, 256).astype(jnp.uint8)
    absmax = jnp.full((blocks,), 0.01, jnp.float32)
    state = _family.BnbState(jnp.int32(3), codes, codes, absmax, absmax * 0.1, None)

    def adamw(p, g, m, v):
        return p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), 0.9 * m + 0.1 * g, v

    print(f"{jax.devices()[0]}, jax {jax.__version__}, one {shape} float32 tensor, median ms")
    print(f"  float32 AdamW-like, XLA (28 B/param)    {median_ms(jax.jit(adamw), p, g, p, p):7.3f}")
    print(f"  AdamW8bit, XLA's two kernels            {median_ms(jax.jit(xla), p, g, state):7.3f}")
    default = _pallas.ROWS, _pallas.WARPS
    for rows, warps in [(1, 1), (1, 2), (2, 2), (4, 4), (16, 4), (16, 8)]:
        _pallas.ROWS, _pallas.WARPS = rows, warps
        run = jax.jit(lambda p, g, s: fused(p, g, s))  # a new function: traced anew
        ms = median_ms(run, p, g, state)
        print(f"  AdamW8bit, fused, {rows:2d} blocks x {warps} warps    {ms:7.3f}")
    _pallas.ROWS, _pallas.WARPS = default
    moving = median_ms(jax.jit(moves_only), p, g, state)
    print(f"  a Pallas kernel moving 16 B/param only  {moving:7.3f}")


if __name__ == "__main__":
    main()
