"""Where does a compiled step's time go? Host work, dispatch, or kernels.

    PYTHONPATH=. python benchmarks/probe_compiled.py --sets one_tensor,gpt2_small

For Adam over each set: the compiled ``opt.step()`` synchronised every step
(as bench_compiled.py times it) and pipelined (20 steps, one sync); the
executable alone with prepared inputs; the host-side bookkeeping alone; and
the kernels XLA compiled for the step (fusions, copies).
"""

from __future__ import annotations

import argparse
import os
import re
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax

import lucid
from benchmarks import shapes as shape_sets
from lucid.optim._engine import programs


def timed(fn, repeats=20, sync=True):
    fn()
    jax.block_until_ready(fn())
    start = time.perf_counter()
    out = None
    for _ in range(repeats):
        out = fn()
        if sync:
            jax.block_until_ready(out)
    jax.block_until_ready(out)
    return 1e3 * (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    shape_sets.add_sets_argument(parser, default="one_tensor,gpt2_small")
    parser.add_argument("--hlo-dir", default=".", help="where to write each set's compiled HLO")
    args = parser.parse_args()
    for name in args.sets:
        probe(name, args.hlo_dir)


def probe(name: str, hlo_dir: str) -> None:
    """Print where one set's compiled Adam step spends its time; save its HLO."""
    shapes = shape_sets.SETS[name]()
    key = jax.random.PRNGKey(0)
    params = [
        lucid.Parameter(jax.random.normal(jax.random.fold_in(key, i), s) * 0.01)
        for i, s in enumerate(shapes)
    ]
    opt = lucid.optim.Adam(params, lr=1e-3)
    lucid.compile_optimizer(opt)
    compiled = opt.backend  # the probe looks inside the compiled backend on purpose
    for i, p in enumerate(params):
        p.grad = jax.random.normal(jax.random.fold_in(key, 10_000 + i), p.shape) * 0.01
    opt.step()
    bucket = compiled._buckets[0]
    step_sync = timed(lambda: (opt.step(), bucket.store.values)[1])
    step_pipe = timed(lambda: (opt.step(), bucket.store.values)[1], sync=False)
    start = time.perf_counter()
    for _ in range(200):
        groups = opt.engine_groups()
        plans, h32, h64 = compiled._hyper(compiled._buckets, bucket.domain, groups)
    host_us = 1e6 * (time.perf_counter() - start) / 200
    run = programs.step_program(opt.rule, plans)
    box = {}

    def direct():
        values, states = run(
            h32,
            h64,
            [b.store.values for b in compiled._buckets],
            [b.store.grads for b in compiled._buckets],
            [b.state for b in compiled._buckets],
        )
        for b, v, s in zip(compiled._buckets, values, states):
            b.store.values, b.state = v, s
        box["v"] = values
        return values

    exe_sync = timed(direct)
    h32_dev = jax.device_put(h32)

    def direct_dev():
        values, states = run(
            h32_dev,
            h64,
            [b.store.values for b in compiled._buckets],
            [b.store.grads for b in compiled._buckets],
            [b.state for b in compiled._buckets],
        )
        for b, v, s in zip(compiled._buckets, values, states):
            b.store.values, b.state = v, s
        return values

    exe_dev = timed(direct_dev)
    text = (
        run.lower(
            h32,
            h64,
            [b.store.values for b in compiled._buckets],
            [b.store.grads for b in compiled._buckets],
            [b.state for b in compiled._buckets],
        )
        .compile()
        .as_text()
    )
    kernels = len(re.findall(r"^\s*ROOT.*|^\s*\S+ = .*fusion\(", text, flags=re.M))
    fusions = sorted(set(re.findall(r"kind=k(\w+)", text)))
    copies = len(re.findall(r"= \S+ copy\(", text))
    print(
        f"{name}: buckets={len(compiled._buckets)} step(sync)={step_sync:.3f} ms "
        f"step(pipelined)={step_pipe:.3f} ms executable(numpy hyper)={exe_sync:.3f} ms "
        f"executable(device hyper)={exe_dev:.3f} ms host bookkeeping={host_us:.0f} us "
        f"fusion kinds={fusions} copies={copies} ~kernels={kernels}"
    )
    with open(os.path.join(hlo_dir, f"hlo_{name}.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
