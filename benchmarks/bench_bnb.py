"""Compiled step time and state size: bitsandbytes' 8-bit AdamW (`lucid.optim.bnb`) against
lucid's float32 AdamW, on a parameter set of `benchmarks/shapes.py`.

Bytes model (float32 parameters): float32 AdamW reads p, g, m, v and writes p, m, v,
28 bytes per parameter; 8-bit AdamW reads p, g and two codes and writes p and two
codes, 4 * 3 + 2 * 2 = 16 bytes per parameter (plus 8 bytes per block of 256 for the
scales, read and written: ~0.06 per parameter).

    python benchmarks/bench_bnb.py --set gpt2_small --repeats 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp

import lucid
import lucid.optim.bnb
from benchmarks import shapes
from benchmarks._timing import gb_per_s, jax_sync, measure, parameter_buffers


def run(cls, shape_list, args):
    key = jax.random.PRNGKey(0)
    params = [lucid.Parameter(0.02 * jax.random.normal(key, s, jnp.float32)) for s in shape_list]
    compiled = lucid.compile_optimizer(cls(params, lr=1e-4, weight_decay=0.01))
    for p in params:
        p.grad = jnp.full(p.shape, 1e-3, jnp.float32)

    def step():
        compiled.step()
        return parameter_buffers(params)

    timing = measure(step, jax_sync, warmup=args.warmup, repeats=args.repeats)
    n = sum(p.data.size for p in params)
    state = sum(compiled.state_bytes_per_device().values())
    return timing, n, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--set", default="gpt2_small", choices=sorted(shapes.SETS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    shape_list = shapes.SETS[args.set]()
    rows = {}
    for name, cls, floor in (
        ("AdamW (float32)", lucid.optim.AdamW, 28),
        ("bnb AdamW8bit", lucid.optim.bnb.AdamW8bit, 16),
    ):
        timing, n, state = run(cls, shape_list, args)
        ms = timing.median_ms
        rows[name] = {
            "median_ms": round(ms, 3),
            "first_ms": round(timing.first_ms, 1),
            "state_bytes_per_param": round(state / n, 4),
            "floor_GB_per_s": round(gb_per_s(floor * n, ms), 1),
        }
    base, eight = rows["AdamW (float32)"], rows["bnb AdamW8bit"]
    print(
        json.dumps(
            {
                "set": args.set,
                "device": str(jax.devices()[0]),
                "jax": jax.__version__,
                "rows": rows,
                "speedup_8bit_over_float32": round(base["median_ms"] / eight["median_ms"], 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
