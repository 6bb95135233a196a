"""Schedule-Free's compiled step against lucid's AdamW and SGD, and the package's own step.

    PYTHONPATH=. python benchmarks/bench_schedulefree.py --sets gpt2_small,many_small

For each parameter set (float32) it measures, in one run, synchronised and pipelined
ms per step (as ``bench_compiled.py``) of ``opt.step()`` after
``compile_optimizer(opt)`` for lucid's ``AdamW`` and ``SGD`` (momentum) and for
``AdamWScheduleFree``, ``RAdamScheduleFree`` and ``SGDScheduleFree`` (in train mode),
the ``schedulefree`` package's own step (foreach) where it is installed, and the
time of one ``opt.eval()`` + ``opt.train()`` pair on the compiled optimizer. The floor
is the minimum traffic (AdamW and the Adam forms: 28 bytes per parameter; SGD with
momentum and ``SGDScheduleFree``: 20) at the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

import lucid
from benchmarks import shapes as shape_sets
from benchmarks._timing import (
    jax_sync,
    measure,
    measure_pipelined,
    parameter_buffers,
    torch_sync,
)
from benchmarks.bench_compiled import copy_bandwidth, hardware

# name -> (lucid class, options, bytes per parameter at least)
RUNS = {
    "AdamW": (lambda: lucid.optim.AdamW, {"lr": 1e-3, "weight_decay": 1e-2}, 28),
    "AdamWScheduleFree": (
        lambda: lucid.optim.schedulefree.AdamWScheduleFree,
        {"lr": 1e-3, "weight_decay": 1e-2},
        28,
    ),
    "RAdamScheduleFree": (lambda: lucid.optim.schedulefree.RAdamScheduleFree, {"lr": 1e-3}, 28),
    "SGD": (lambda: lucid.optim.SGD, {"lr": 1e-2, "momentum": 0.9}, 20),
    "SGDScheduleFree": (lambda: lucid.optim.schedulefree.SGDScheduleFree, {"lr": 1e-2}, 20),
}


def _arrays(shapes, seed):
    key = jax.random.PRNGKey(seed)
    return [
        jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32) * 0.01
        for i, s in enumerate(shapes)
    ]


def bench_lucid(name, shapes, args):
    cls, options, _ = RUNS[name]
    params = [lucid.Parameter(a) for a in _arrays(shapes, 0)]
    opt = cls()(params, **options)
    lucid.compile_optimizer(opt)
    for p, g in zip(params, _arrays(shapes, 1)):
        p.grad = g
    if hasattr(opt, "train"):
        opt.train()

    def run():
        opt.step()
        return parameter_buffers(params)

    timing = measure(run, jax_sync, warmup=args.warmup, repeats=args.repeats)
    pipelined = measure_pipelined(run, jax_sync, repeats=args.repeats)
    switch = None
    if hasattr(opt, "train"):
        opt.eval()
        opt.train()  # the first switch compiles the lerp
        times = []
        for _ in range(5):
            start = time.perf_counter()
            opt.eval()
            opt.train()
            jax_sync(parameter_buffers(params))
            times.append(1e3 * (time.perf_counter() - start))
        switch = sorted(times)[len(times) // 2]
    return timing, pipelined, switch


def bench_package(name, shapes, args):
    try:
        import schedulefree
        import torch
    except ImportError:
        return None
    device = args.torch_device
    _, options, _ = RUNS[name]
    params = [torch.tensor(jax.device_get(a), device=device) for a in _arrays(shapes, 0)]
    grads = [torch.tensor(jax.device_get(a), device=device) for a in _arrays(shapes, 1)]
    opt = getattr(schedulefree, name)(params, **options, foreach=True)
    opt.train()

    def run():
        for p, g in zip(params, grads):
            p.grad = g.clone()  # the package divides the gradient in place
        opt.step()

    sync = torch_sync(device)
    timing = measure(run, sync, warmup=args.warmup, repeats=args.repeats)
    return timing, measure_pipelined(run, sync, repeats=args.repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shape_sets.add_sets_argument(parser, default="gpt2_small,many_small")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--package", action="store_true", help="also time the package's step")
    parser.add_argument("--torch-device", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.torch_device is None:
        try:
            import torch

            args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.torch_device = "cpu"
    print(hardware())
    bandwidth = copy_bandwidth(args)
    print(f"device copy bandwidth (jax, read+write): {bandwidth / 1e9:.1f} GB/s\n")
    print(f"{'set':11s} {'run':26s} {'ms/step':>8s} {'pipelined':>9s} {'floor':>7s} {'switch':>7s}")
    results = []
    for set_name in args.sets:
        shapes = shape_sets.SETS[set_name]()
        n = shape_sets.numel(shapes)
        for name in args.runs.split(","):
            floor = RUNS[name][2] * n / bandwidth * 1e3
            timing, pipelined, switch = bench_lucid(name, shapes, args)
            gc.collect()
            shown = f"{switch:7.2f}" if switch is not None else ""
            print(
                f"{set_name:11s} {'lucid ' + name:26s} {timing.median_ms:8.3f} "
                f"{pipelined:9.3f} {floor:7.3f} {shown}"
            )
            results.append(
                {
                    "set": set_name,
                    "impl": f"lucid {name}",
                    "ms": timing.median_ms,
                    "pipelined_ms": pipelined,
                    "floor_ms": floor,
                    "switch_ms": switch,
                    "first_ms": timing.first_ms,
                }
            )
            if args.package and name.endswith("ScheduleFree"):
                out = bench_package(name, shapes, args)
                gc.collect()
                if out is not None:
                    timing, pipelined = out
                    print(
                        f"{set_name:11s} {'schedulefree ' + name:26s} {timing.median_ms:8.3f} "
                        f"{pipelined:9.3f}"
                    )
                    results.append(
                        {
                            "set": set_name,
                            "impl": f"schedulefree {name} ({args.torch_device}, foreach)",
                            "ms": timing.median_ms,
                            "pipelined_ms": pipelined,
                        }
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hardware": hardware(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
