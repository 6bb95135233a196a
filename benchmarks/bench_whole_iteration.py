"""A whole training iteration (forward, backward, update) over many small tensors.

    PYTHONPATH=. python benchmarks/bench_whole_iteration.py [--sets many_small,gpt2_small]

The loss is trivial, ``sum(p * c)`` over every parameter (its gradient is ``c``), so
what is measured is lucid's machinery around a model: ``lucid.backward`` + the
compiled step, and ``fused_step``. ms per iteration, synchronised (median) and
pipelined (mean), as the other benchmarks, and the host's part: the median time the
call itself takes with the device idle (Python and dispatch; the device's work runs
after it, asynchronously). ``--n`` sets many_small's count (2000); ``--modes`` can
add ``backward-only`` (``lucid.backward`` with no compiled optimizer, each parameter
in its own arrays). Where the kernels come from: `analyze_whole_iteration.py`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes as shape_sets
from _timing import jax_sync, measure, measure_pipelined

import lucid


def loss_fn(params, consts):
    return sum(jnp.vdot(p, c) for p, c in zip(params, consts))


def host_ms(step, repeats: int) -> float:
    """Median ms of ``step()`` itself, started with the device idle."""
    times = []
    for _ in range(repeats):
        jax_sync(step())
        start = time.perf_counter()
        out = step()
        times.append(1e3 * (time.perf_counter() - start))
        jax_sync(out)
    return statistics.median(times)


def run(set_name: str, mode: str, repeats: int, n: int) -> tuple[float, float, float]:
    shapes = shape_sets.many_small(n) if set_name == "many_small" else shape_sets.SETS[set_name]()
    key = jax.random.PRNGKey(0)
    params = [
        lucid.Parameter(jax.random.normal(jax.random.fold_in(key, i), s) * 0.01)
        for i, s in enumerate(shapes)
    ]
    consts = [jnp.full(s, 1e-3, jnp.float32) for s in shapes]
    opt = lucid.optim.Adam(params, lr=1e-3)
    buffer = lambda: params[-1].location[0].buffer  # noqa: E731
    if mode == "fused":
        fused = lucid.optim.fused_step(loss_fn, opt)

        def step():
            fused(params, consts)
            return buffer()
    elif mode == "backward-only":  # no compiled optimizer: every parameter its own arrays

        def step():
            opt.zero_grad()
            lucid.backward(loss_fn, params, consts)
            return params[-1].grad

    else:
        lucid.compile_optimizer(opt)

        def step():
            opt.zero_grad()
            lucid.backward(loss_fn, params, consts)
            opt.step()
            return buffer()

    timing = measure(step, jax_sync, warmup=3, repeats=repeats)
    pipelined = measure_pipelined(step, jax_sync, repeats=repeats)
    return timing.median_ms, pipelined, host_ms(step, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="many_small,gpt2_small")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--n", type=int, default=2000, help="many_small's count")
    parser.add_argument(
        "--modes",
        default="backward+compiled,fused",
        help="also backward-only: lucid.backward alone, parameters in their own arrays",
    )
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0]}")
    print(f"{'set':11s} {'loop':22s} {'ms/iter':>8s} {'pipelined':>9s} {'host':>8s}")
    for set_name in args.sets.split(","):
        for mode in args.modes.split(","):
            ms, pipelined, host = run(set_name, mode, args.repeats, args.n)
            print(f"{set_name:11s} {mode:22s} {ms:8.3f} {pipelined:9.3f} {host:8.3f}", flush=True)


if __name__ == "__main__":
    main()
