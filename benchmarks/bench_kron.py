"""Compiled PSGD Kron against lucid's AdamW and against kron-torch's own step, on the CPU.

    PYTHONPATH=. python benchmarks/bench_kron.py                # a GPT-2 miniature, CPU
    PYTHONPATH=. python benchmarks/bench_kron.py --json kron.json

On a GPT-2 miniature (``benchmarks/shapes.py``'s ``gpt2`` with d_model 64, 2 blocks, a
512-token vocabulary and 64 positions: 28 tensors, float32) it measures, in one run, the
median ms per step (one sync per step) of:

* ``lucid AdamW compiled``: `compile_optimizer` over `lucid.optim.AdamW`;
* ``lucid Kron compiled, update``: `lucid.optim.Kron` compiled, the preconditioner updated
  at every step (probability 1, kron-torch's first 500 steps);
* ``lucid Kron compiled, no update``: the same with the update skipped (probability 1e-9:
  the steady state kron-torch's schedule tends to, 97% of steps at 0.03);
* ``kron-torch, torch.compile`` and ``kron-torch, eager``: ``kron_torch.Kron.step`` with its
  functions compiled as it ships them (``@torch.compile``) and with
  ``TORCHDYNAMO_DISABLE=1`` (in a subprocess), in the same two settings;

and the state bytes per parameter of each (lucid: every state array, lucid's counters and
key included; kron-torch: its momentum and factors). Ratios are to lucid's AdamW and to
kron-torch's step in the same setting.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import shapes as shape_sets
from benchmarks._timing import jax_sync, measure, parameter_buffers

SETTINGS = {"update": 1.0, "no update": 1e-9}


def model_shapes() -> list[tuple[int, ...]]:
    return shape_sets.gpt2(d_model=64, n_layer=2, vocab=512, n_ctx=64)


def _arrays(shapes: list[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=s) * 0.01).astype(np.float32) for s in shapes]


def bench_lucid(name: str, options: dict, args: argparse.Namespace) -> dict:
    import lucid

    shapes = model_shapes()
    params = [lucid.Parameter(jnp.asarray(a)) for a in _arrays(shapes, 0)]
    opt = getattr(lucid.optim, name)(params, **options)
    compiled = lucid.compile_optimizer(opt)
    for p, g in zip(params, _arrays(shapes, 1)):
        p.grad = jnp.asarray(g)

    def run():
        opt.step()
        return parameter_buffers(params)

    timing = measure(run, jax_sync, warmup=args.warmup, repeats=args.repeats)
    n = sum(int(np.prod(s)) for s in shapes)
    state = sum(compiled.state_bytes_per_device().values())
    return {"ms": timing.median_ms, "first_ms": timing.first_ms, "state_bytes_per_param": state / n}


def bench_kron_torch(probability: float, args: argparse.Namespace) -> dict:
    import torch
    from kron_torch import Kron

    torch.set_num_threads(args.threads)
    params = []
    for value, grad in zip(_arrays(model_shapes(), 0), _arrays(model_shapes(), 1)):
        p = torch.nn.Parameter(torch.from_numpy(value))
        p.grad = torch.from_numpy(grad)
        params.append(p)
    opt = Kron(params, preconditioner_update_probability=probability)

    def run():
        with contextlib.redirect_stdout(io.StringIO()):  # its memory report
            opt.step()

    timing = measure(run, lambda _: None, warmup=args.warmup, repeats=args.repeats)
    n = sum(p.numel() for p in params)
    state = 0
    for p in params:
        entry = opt.state[p]
        state += entry["momentum_buffer"].numel() * entry["momentum_buffer"].element_size()
        state += sum(q.numel() * q.element_size() for q in entry["Q"])
    return {"ms": timing.median_ms, "first_ms": timing.first_ms, "state_bytes_per_param": state / n}


def _torch_in_subprocess(eager: bool, args: argparse.Namespace) -> dict:
    """kron-torch's timings in a fresh interpreter (``TORCHDYNAMO_DISABLE`` is read when
    torch is imported)."""
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1" if eager else "0"}
    command = [
        sys.executable,
        __file__,
        "--torch-only",
        f"--warmup={args.warmup}",
        f"--repeats={args.repeats}",
        f"--threads={args.threads}",
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def hardware() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return (
        f"{cpu}, {os.cpu_count()} cores; jax {jax.__version__} ({jax.default_backend()}), "
        f"torch {torch.__version__}, python {sys.version.split()[0]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2, help="torch's intra-op threads")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_only:
        print(json.dumps({k: bench_kron_torch(p, args) for k, p in SETTINGS.items()}))
        return
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "hardware": hardware(),
        "model": "GPT-2 miniature (d_model 64, 2 blocks, vocab 512, 64 positions), float32",
    }
    adamw = bench_lucid("AdamW", {"lr": 1e-3}, args)
    results["lucid AdamW compiled"] = adamw
    torch_runs = {
        "torch.compile": _torch_in_subprocess(False, args),
        "eager": _torch_in_subprocess(True, args),
    }
    for setting, probability in SETTINGS.items():
        ours = bench_lucid("Kron", {"preconditioner_update_probability": probability}, args)
        ours["vs AdamW"] = ours["ms"] / adamw["ms"]
        for how, runs in torch_runs.items():
            ours[f"vs kron-torch {how}"] = ours["ms"] / runs[setting]["ms"]
            results[f"kron-torch {how}, {setting}"] = runs[setting]
        results[f"lucid Kron compiled, {setting}"] = ours
    width = max(len(k) for k in results)
    for key, value in results.items():
        if isinstance(value, dict):
            text = ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items()
            )
            print(f"{key:<{width}}  {text}")
        else:
            print(f"{key:<{width}}  {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
