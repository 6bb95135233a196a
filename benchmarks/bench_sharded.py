"""The compiled Adam step with parameters sharded over every local device,
beside the same step on one device.

    PYTHONPATH=. python benchmarks/bench_sharded.py --sets gpt2_small

Each parameter is sharded along its first dimension that the device count
divides (replicated otherwise). Sharded parameters keep their own shape and
sharding in the compiled step (they are never concatenated), so the step
takes one array per tensor; on one device the same parameters share a flat
buffer.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import lucid
from benchmarks import shapes as shape_sets
from benchmarks._timing import jax_sync, measure, measure_pipelined, parameter_buffers


def spec_for(shape: tuple[int, ...], n: int) -> PartitionSpec:
    for axis, size in enumerate(shape):
        if size % n == 0:
            return PartitionSpec(*([None] * axis), "devices")
    return PartitionSpec()


def run(shapes, devices, args) -> tuple[float, float, float]:
    mesh = Mesh(np.array(devices), ("devices",))
    key = jax.random.PRNGKey(0)
    params, grads = [], []
    for i, shape in enumerate(shapes):
        sharding = NamedSharding(mesh, spec_for(shape, len(devices)))
        value = jax.random.normal(jax.random.fold_in(key, i), shape) * 0.01
        grad = jax.random.normal(jax.random.fold_in(key, 10_000 + i), shape) * 0.01
        params.append(lucid.Parameter(jax.device_put(value, sharding)))
        grads.append(jax.device_put(grad, sharding))
    opt = lucid.optim.Adam(params, lr=1e-3)
    lucid.compile_optimizer(opt)
    for p, g in zip(params, grads):
        p.grad = g

    def step():
        opt.step()
        return parameter_buffers(params)

    timing = measure(step, jax_sync, warmup=args.warmup, repeats=args.repeats)
    pipelined = measure_pipelined(step, jax_sync, repeats=args.repeats)
    return timing.median_ms, pipelined, timing.first_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    shape_sets.add_sets_argument(parser, default="gpt2_small")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    devices = jax.devices()
    print(f"jax {jax.__version__}, devices: {devices}")
    print(f"{'set':11s} {'devices':>7s} {'ms/step':>8s} {'pipelined':>9s} {'first ms':>9s}")
    for name in args.sets:
        shapes = shape_sets.SETS[name]()
        for group in ([devices[0]], devices) if len(devices) > 1 else ([devices[0]],):
            ms, pipelined, first = run(shapes, group, args)
            print(f"{name:11s} {len(group):7d} {ms:8.3f} {pipelined:9.3f} {first:9.0f}", flush=True)


if __name__ == "__main__":
    main()
