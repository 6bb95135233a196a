"""Compiled Muon and Adafactor against torch.optim.Muon and torch.optim.Adafactor.

    PYTHONPATH=. python benchmarks/bench_muon_adafactor.py --json muon_adafactor.json
    PYTHONPATH=. python benchmarks/bench_muon_adafactor.py --small   # a CPU check in seconds

On GPT-2 small (``benchmarks/shapes.py``; ``--small`` shrinks it to d_model 64,
2 blocks, a 512-token vocabulary) with float32 parameters it measures the median
ms per step, synchronised (one device sync per step) and pipelined (steps back to
back, one sync at the end), of:

* **Muon** on the 2-D weights (the four per block, plus the token and position
  embeddings: 50 matrices, 123.5M floats): ``torch`` (``torch.optim.Muon``),
  ``lucid eager`` (``opt.step()``) and ``lucid compiled`` (after
  ``compile_optimizer``); and ``lucid NS only``: the bfloat16 Newton-Schulz
  iteration alone over the same matrices, one jitted function.
* **Adafactor** on every parameter (148 tensors): ``torch`` (its default
  single-tensor path) and ``torch foreach``, ``lucid eager``, ``lucid compiled``.

For Muon it also reports the Newton-Schulz matmul FLOP rate: with ``m <= n``
the sides of a matrix (it is transposed when taller than wide), each of the
``ns_steps`` iterations costs ``X X^T`` (``2 m^2 n``), ``G G`` (``2 m^3``)
and ``(bG + cG^2) X`` (``2 m^2 n``) FLOPs, divided by the step time and by the
bfloat16 peak (``--peak-tflops``, default 989, an H200's dense bf16 peak; or
``--measure-peak``: an 8192^3 bfloat16 matmul timed with jax).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

import lucid
from benchmarks import shapes as shape_sets
from benchmarks._timing import jax_sync, measure, measure_pipelined, torch_sync
from lucid.functional.muon import orthogonalize

MUON = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95}
ADAFACTOR = {"lr": 1e-2, "weight_decay": 0.01}
COEFFICIENTS = (3.4445, -4.775, 2.0315)
NS_STEPS = 5


def model_shapes(small: bool) -> list[tuple[int, ...]]:
    """GPT-2 small, or a miniature of it for a quick CPU run."""
    if small:
        return shape_sets.gpt2(d_model=64, n_layer=2, vocab=512, n_ctx=64)
    return shape_sets.gpt2_small()


def ns_flops(shapes: list[tuple[int, ...]], steps: int = NS_STEPS) -> float:
    """Matmul FLOPs of ``steps`` Newton-Schulz iterations over every matrix."""
    total = 0.0
    for rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        total += steps * (4 * m * m * n + 2 * m**3)
    return total


def _arrays(shapes, seed):
    key = jax.random.PRNGKey(seed)
    return [
        jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32) * 0.01
        for i, s in enumerate(shapes)
    ]


def _timed(run, sync, args):
    timing = measure(run, sync, warmup=args.warmup, repeats=args.repeats)
    return timing, measure_pipelined(run, sync, repeats=args.repeats)


def bench_lucid(cls_name, options, shapes, args, compiled):
    params = [lucid.Parameter(a) for a in _arrays(shapes, 0)]
    opt = getattr(lucid.optim, cls_name)(params, **options)
    if compiled:
        lucid.compile_optimizer(opt)
    for p, g in zip(params, _arrays(shapes, 1)):
        p.grad = g

    def run():
        opt.step()
        return params[-1].location[0].buffer  # one executable: its last output suffices

    return _timed(run, jax_sync, args)


def bench_ns_only(shapes, args):
    """The bfloat16 Newton-Schulz iteration alone over every matrix, one jitted call."""
    updates = _arrays(shapes, 1)

    @jax.jit
    def all_ns(updates):
        return [orthogonalize(u, COEFFICIENTS, NS_STEPS, 1e-7) for u in updates]

    return _timed(lambda: all_ns(updates), jax_sync, args)


def bench_torch(cls_name, options, shapes, args, **impl):
    import torch

    device = args.torch_device
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = []
    for s in shapes:
        p = torch.nn.Parameter((torch.randn(s, generator=gen) * 0.01).to(device))
        p.grad = (torch.randn(s, generator=gen) * 0.01).to(device)
        params.append(p)
    opt = getattr(torch.optim, cls_name)(params, **options, **impl)
    result = _timed(opt.step, torch_sync(device), args)
    del opt, params
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def bf16_peak_flops(n: int, repeats: int) -> float:
    """FLOP/s of one n^3 bfloat16 matmul in jax."""
    a = jnp.ones((n, n), jnp.bfloat16)
    matmul = jax.jit(lambda a: a @ a)
    timing = measure(lambda: matmul(a), jax_sync, warmup=3, repeats=max(repeats, 5))
    return 2 * n**3 / (timing.median_ms * 1e-3)


def measured_peak_flops(args) -> float:
    """FLOP/s of one 8192^3 bfloat16 matmul in jax (2048^3 with ``--small``)."""
    return bf16_peak_flops(2048 if args.small else 8192, args.repeats)


def hardware() -> str:
    lines = [f"jax {jax.__version__}, devices: {jax.devices()}"]
    try:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
        lines.append(f"torch {torch.__version__} ({gpu})")
    except ImportError:
        lines.append("torch: not installed")
    lines.append(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU cores")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a miniature GPT-2 (CPU check)")
    parser.add_argument("--optimizers", default="muon,adafactor")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--torch-device", default=None)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--measure-peak", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.torch_device is None:
        import torch

        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.small:
        args.repeats = min(args.repeats, 5)
    print(hardware())
    peak = measured_peak_flops(args) if args.measure_peak else args.peak_tflops * 1e12
    print(f"bf16 peak: {peak / 1e12:.1f} TFLOP/s ({'measured' if args.measure_peak else 'given'})")
    shapes = model_shapes(args.small)
    matrices = [s for s in shapes if len(s) == 2]
    flops = ns_flops(matrices)
    print(
        f"{'gpt2 miniature' if args.small else 'gpt2_small'}: {len(shapes)} tensors, "
        f"{shape_sets.numel(shapes):,} floats; {len(matrices)} matrices, "
        f"{shape_sets.numel(matrices):,} floats; NS {flops / 1e9:.1f} GFLOP per step\n"
    )
    header = (
        f"{'optimizer':10s} {'impl':15s} {'ms/step':>9s} {'pipelined':>9s} "
        f"{'first ms':>9s} {'NS TFLOP/s':>10s} {'% peak':>7s}"
    )
    print(header)
    print("-" * len(header))
    results = []
    for name in args.optimizers.split(","):
        if name == "muon":
            runs = {
                "torch": lambda: bench_torch("Muon", MUON, matrices, args),
                "lucid eager": lambda: bench_lucid("Muon", MUON, matrices, args, False),
                "lucid compiled": lambda: bench_lucid("Muon", MUON, matrices, args, True),
                "lucid NS only": lambda: bench_ns_only(matrices, args),
            }
        elif name == "adafactor":
            runs = {
                "torch": lambda: bench_torch("Adafactor", ADAFACTOR, shapes, args),
                "torch foreach": lambda: bench_torch(
                    "Adafactor", ADAFACTOR, shapes, args, foreach=True
                ),
                "lucid eager": lambda: bench_lucid("Adafactor", ADAFACTOR, shapes, args, False),
                "lucid compiled": lambda: bench_lucid("Adafactor", ADAFACTOR, shapes, args, True),
            }
        else:
            parser.error(f"unknown optimizer {name!r} (muon, adafactor)")
        for impl, run in runs.items():
            timing, pipelined = run()
            gc.collect()  # the run's buffers go before the next one allocates
            row = {
                "optimizer": name,
                "impl": impl,
                "ms": timing.median_ms,
                "pipelined_ms": pipelined,
                "first_ms": timing.first_ms,
                "n_tensors": len(matrices if name == "muon" else shapes),
            }
            line = (
                f"{name:10s} {impl:15s} {timing.median_ms:9.3f} {pipelined:9.3f} "
                f"{timing.first_ms:9.0f}"
            )
            if name == "muon":
                rate = flops / (pipelined * 1e-3)
                row.update(ns_tflops=rate / 1e12, peak_fraction=rate / peak)
                line += f" {rate / 1e12:10.2f} {100 * rate / peak:6.1f}%"
            results.append(row)
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            summary = {
                "hardware": hardware(),
                "small": args.small,
                "peak_flops": peak,
                "peak_measured": args.measure_peak,
                "ns_flops_per_step": flops,
                "results": results,
            }
            json.dump(summary, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
