"""Compiled Muon with same-shaped matrices batched, against the per-matrix rule and
torch.optim.Muon.

    PYTHONPATH=. python benchmarks/bench_muon_batched.py                 # CPU: a miniature
    PYTHONPATH=. python benchmarks/bench_muon_batched.py --measure-peak  # GPU: GPT-2 S, XL
    PYTHONPATH=. python benchmarks/bench_muon_batched.py --sets gpt2_small --json out.json

On the 2-D weights of each parameter set (``benchmarks/shapes.py``: per block
``c_attn``, ``attn.c_proj``, ``c_fc``, ``mlp.c_proj``, plus the token and
position embeddings), float32 parameters and gradients, it times one optimizer
step (median ms, synchronised, and pipelined: steps back to back, one sync at
the end) of:

* ``lucid batched``: ``lucid.optim.Muon`` after ``compile_optimizer``, the
  default rule (same-shaped matrices in one batched Newton-Schulz product);
* ``lucid per-matrix``: the same with ``dataclasses.replace(MUON, batched=False)``,
  each matrix's iteration on its own (as before batching);
* ``torch``: ``torch.optim.Muon`` (on CUDA when there is one).

It prints the ratios to ``lucid batched`` and the Newton-Schulz FLOP rate. FLOPs,
from `lucid.functional.muon.orthogonalize`: for an ``A x B`` matrix let
``m = min(A, B)``, ``n = max(A, B)`` (it is transposed when taller than wide);
each of the ``ns_steps`` iterations computes ``G = X X^T`` (``m*m*n``
multiply-adds), ``G G`` (``m*m*m``) and ``(bG + cG^2) X`` (``m*m*n``), i.e.
``2*(2 m^2 n + m^3)`` FLOPs counting a multiply-add as two. The rate is those
FLOPs over the pipelined step time (the whole step: momentum and update
included), as a fraction of the bfloat16 peak (``--peak-tflops``, default 989,
an H200's dense bf16 peak; or ``--measure-peak``: a bfloat16 matmul timed with
jax). Without a GPU it runs a miniature (d_model 128, 4 blocks, a 512-token
vocabulary), in well under two minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp

import lucid
from benchmarks import shapes as shape_sets
from benchmarks._timing import jax_sync, measure, measure_pipelined, torch_sync
from benchmarks.bench_muon_adafactor import bf16_peak_flops, hardware
from lucid.functional.muon import MUON

OPTIONS = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95}
NS_STEPS = 5
PER_MATRIX = dataclasses.replace(MUON, batched=False)


def miniature() -> list[tuple[int, ...]]:
    """A GPT-2 with d_model 128, 4 blocks, a 512-token vocabulary (a CPU run)."""
    return shape_sets.gpt2(d_model=128, n_layer=4, vocab=512, n_ctx=64)


SETS = {**shape_sets.SETS, "miniature": miniature}


def matrices_of(name: str) -> list[tuple[int, int]]:
    return [s for s in SETS[name]() if len(s) == 2]


def ns_flops(matrices: list[tuple[int, int]], steps: int = NS_STEPS) -> float:
    """FLOPs of ``steps`` Newton-Schulz iterations over every matrix (module docstring)."""
    total = 0.0
    for rows, cols in matrices:
        m, n = min(rows, cols), max(rows, cols)
        total += steps * 2 * (2 * m * m * n + m**3)
    return total


def _arrays(matrices, seed):
    key = jax.random.PRNGKey(seed)
    return [
        jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32) * 0.01
        for i, s in enumerate(matrices)
    ]


def _timed(run, sync, args):
    timing = measure(run, sync, warmup=args.warmup, repeats=args.repeats)
    return timing, measure_pipelined(run, sync, repeats=args.repeats)


def bench_lucid(matrices, args, rule):
    saved = lucid.optim.Muon.rule
    lucid.optim.Muon.rule = rule  # the rule a new optimizer (and its backend) takes
    try:
        params = [lucid.Parameter(a) for a in _arrays(matrices, 0)]
        opt = lucid.optim.Muon(params, **OPTIONS)
        lucid.compile_optimizer(opt)
    finally:
        lucid.optim.Muon.rule = saved
    for p, g in zip(params, _arrays(matrices, 1)):
        p.grad = g

    def run():
        opt.step()
        return params[-1].location[0].buffer  # one executable: its last output suffices

    return _timed(run, jax_sync, args)


def bench_torch(matrices, args):
    import torch

    device = args.torch_device
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = []
    for s in matrices:
        p = torch.nn.Parameter((torch.randn(s, generator=gen) * 0.01).to(device))
        p.grad = (torch.randn(s, generator=gen) * 0.01).to(device)
        params.append(p)
    opt = torch.optim.Muon(params, **OPTIONS)
    result = _timed(opt.step, torch_sync(device), args)
    del opt, params
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def measured_peak_flops(args) -> float:
    """FLOP/s of one n^3 bfloat16 matmul in jax (n = 8192 on a GPU, 1024 on a CPU)."""
    return bf16_peak_flops(8192 if jax.default_backend() == "gpu" else 1024, args.repeats or 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sets",
        default=None,
        help="comma-separated parameter sets (default: gpt2_small,gpt2_xl on a GPU, "
        "miniature on a CPU)",
    )
    parser.add_argument("--impls", default="lucid batched,lucid per-matrix,torch")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--torch-device", default=None)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--measure-peak", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    gpu = jax.default_backend() == "gpu"
    if args.sets is None:
        args.sets = "gpt2_small,gpt2_xl" if gpu else "miniature"
    if args.repeats is None:
        args.repeats = 20 if gpu else 5
    if args.torch_device is None:
        import torch

        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    print(hardware())
    peak = measured_peak_flops(args) if args.measure_peak else args.peak_tflops * 1e12
    print(f"bf16 peak: {peak / 1e12:.1f} TFLOP/s ({'measured' if args.measure_peak else 'given'})")
    runs = {
        "lucid batched": lambda m: bench_lucid(m, args, MUON),
        "lucid per-matrix": lambda m: bench_lucid(m, args, PER_MATRIX),
        "torch": lambda m: bench_torch(m, args),
    }
    impls = [name.strip() for name in args.impls.split(",")]
    results = []
    for set_name in args.sets.split(","):
        matrices = matrices_of(set_name)
        flops = ns_flops(matrices)
        classes = len(set(matrices))
        print(
            f"\n{set_name}: {len(matrices)} matrices in {classes} shape classes, "
            f"{shape_sets.numel(matrices):,} floats; NS {flops / 1e9:.1f} GFLOP per step"
        )
        header = (
            f"{'impl':17s} {'ms/step':>9s} {'pipelined':>9s} {'first ms':>9s} "
            f"{'x batched':>9s} {'NS TFLOP/s':>10s} {'% peak':>7s}"
        )
        print(header)
        print("-" * len(header))
        rows = {}
        for impl in impls:
            timing, pipelined = runs[impl](matrices)
            gc.collect()
            rows[impl] = (timing, pipelined)
        base = rows.get("lucid batched", next(iter(rows.values())))[1]
        for impl, (timing, pipelined) in rows.items():
            rate = flops / (pipelined * 1e-3)
            print(
                f"{impl:17s} {timing.median_ms:9.3f} {pipelined:9.3f} {timing.first_ms:9.0f} "
                f"{pipelined / base:9.2f} {rate / 1e12:10.2f} {100 * rate / peak:6.1f}%",
                flush=True,
            )
            results.append(
                {
                    "set": set_name,
                    "impl": impl,
                    "ms": timing.median_ms,
                    "pipelined_ms": pipelined,
                    "first_ms": timing.first_ms,
                    "ratio_to_batched": pipelined / base,
                    "ns_tflops": rate / 1e12,
                    "peak_fraction": rate / peak,
                }
            )
    if args.json:
        with open(args.json, "w") as f:
            summary = {"hardware": hardware(), "peak_flops": peak, "results": results}
            json.dump(summary, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
