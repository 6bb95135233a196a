"""Where a GPT training iteration's time goes, eager against compiled lucid.

    PYTHONPATH=. python benchmarks/probe_gpt_phases.py [--small]

The loop of ``bench_gpt_loop.py`` (zero_grad, ``lucid.backward``,
``clip_grad_norm_``, ``opt.step()``) with a device sync after every phase, so
each phase's time is its own (host and device); the medians over the iterations
after warm-up are printed per phase, for the eager and the compiled optimizer.
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
import gpt_model as G
from _timing import parameter_buffers

import lucid


def phases(mode: str, cfg: G.Config, iterations: int) -> dict[str, float]:
    weights = G.init_weights(cfg)
    loss_fn = G.make_jax_loss(cfg)
    batches = [jnp.asarray(b) for b in G.make_batches(cfg)]
    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in weights.items()}
    every = list(params.values())
    opt = lucid.optim.AdamW(
        [
            {"params": [p for p in every if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in every if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=3e-4,
    )
    if mode == "compiled":
        lucid.compile_optimizer(opt)

    def sync(*extra):
        jax.block_until_ready([*parameter_buffers(every), *extra])

    times: dict[str, list[float]] = {"zero_grad": [], "backward": [], "clip": [], "step": []}
    for i in range(iterations):
        t0 = time.perf_counter()
        opt.zero_grad()
        sync()
        t1 = time.perf_counter()
        loss = lucid.backward(loss_fn, params, batches[i % len(batches)])
        sync(loss)
        t2 = time.perf_counter()
        norm = lucid.nn.utils.clip_grad_norm_(every, 1.0)
        sync(norm)
        t3 = time.perf_counter()
        opt.step()
        sync()
        t4 = time.perf_counter()
        if i >= 3:
            for name, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[name].append(1e3 * dt)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--iterations", type=int, default=23)
    args = parser.parse_args()
    if not args.small:
        jax.config.update("jax_default_matmul_precision", "highest")
    cfg = G.SMALL if args.small else G.Config()
    print(f"{jax.devices()[0]}; model {cfg}")
    print(
        f"{'mode':9s} " + " ".join(f"{n:>10s}" for n in ("zero_grad", "backward", "clip", "step"))
    )
    for mode in ("eager", "compiled"):
        result = phases(mode, cfg, args.iterations)
        print(f"{mode:9s} " + " ".join(f"{v:10.2f}" for v in result.values()), flush=True)


if __name__ == "__main__":
    main()
