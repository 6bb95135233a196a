"""The compiled Adam step with parameters replicated over a data-parallel mesh of
every local device: state replicated (``compile_optimizer(opt)``) beside state
sharded over the mesh (``compile_optimizer(opt, shard_state_over="data")``,
ZeRO-1), with the optimizer state each device holds.

    PYTHONPATH=. python benchmarks/bench_zero.py --sets gpt2_small          # any devices
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        PYTHONPATH=. python benchmarks/bench_zero.py --sets gpt2_tiny --cpu

On one device (a mesh of size 1) both rows run the same program: the
no-regression line. Gradients are fixed arrays placed as the parameters. With
``--cpu`` asynchronous dispatch is off (see main()), so "pipelined" there is
not overlapped.
``gpt2_tiny`` (here only: d_model 256, 4 layers, vocabulary 8192, 52 tensors, 5.3M floats)
keeps 8 replicated copies of a model and its state within a small machine's
memory.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import lucid
from benchmarks import shapes as shape_sets
from benchmarks._timing import jax_sync, measure, measure_pipelined, parameter_buffers


def gpt2_tiny() -> list[tuple[int, ...]]:
    return shape_sets.gpt2(d_model=256, n_layer=4, vocab=8192, n_ctx=256)


SETS = {**shape_sets.SETS, "gpt2_tiny": gpt2_tiny}


def run(shapes, devices, shard: bool, args) -> tuple[float, float, float, float]:
    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    key = jax.random.PRNGKey(0)
    params = []
    for i, shape in enumerate(shapes):
        value = jax.random.normal(jax.random.fold_in(key, i), shape) * 0.01
        params.append(lucid.Parameter(jax.device_put(value, replicated)))
    opt = lucid.optim.Adam(params, lr=1e-3)
    compiled = lucid.compile_optimizer(opt, shard_state_over="data" if shard else None)
    for i, p in enumerate(params):
        grad = jax.random.normal(jax.random.fold_in(key, 10_000 + i), p.shape) * 0.01
        p.grad = jax.device_put(grad, replicated)

    def step():
        opt.step()
        return parameter_buffers(params)

    timing = measure(step, jax_sync, warmup=args.warmup, repeats=args.repeats)
    pipelined = measure_pipelined(step, jax_sync, repeats=args.repeats)
    held = compiled.state_bytes_per_device()
    return timing.median_ms, pipelined, timing.first_ms, max(held.values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sets", default="gpt2_small", help=f"comma-separated, from: {', '.join(SETS)}"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="use the host CPU devices")
    args = parser.parse_args()
    if args.cpu:
        # one program at a time: with asynchronous dispatch, queued steps' collectives can
        # hold every thread of the CPU client waiting for each other (seen on 2 cores)
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    devices = jax.devices("cpu") if args.cpu else jax.devices()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}; jax {jax.__version__}; {platform.processor() or platform.machine()}")
    print(f"devices ({len(devices)}): {devices}")
    header = f"{'set':11s} {'mesh':>4s} {'state':>11s} {'ms/step':>8s} {'pipelined':>9s}"
    print(f"{header} {'first ms':>9s} {'state MiB/device':>16s}")
    for name in args.sets.split(","):
        shapes = SETS[name]()
        for shard in (False, True):
            ms, pipelined, first, mib = run(shapes, devices, shard, args)
            state = "sharded" if shard else "replicated"
            print(
                f"{name:11s} {len(devices):4d} {state:>11s} {ms:8.3f} {pipelined:9.3f} "
                f"{first:9.0f} {mib:16.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
