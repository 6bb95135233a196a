"""The low-bit Adam steps on the CPU, lucid's and the references' own, side by side.

    TORCHDYNAMO_DISABLE=1 python benchmarks/bench_lowbit_cpu.py [--rows 4096] [--cols 1024]

One float32 parameter of ``rows x cols`` elements, a fixed gradient. Each variant
takes ``--warmup`` steps, then ``--rounds`` rounds in which every variant in turn
times ``--steps`` steps (interleaved, so that a change in the machine's load reaches
all of them alike). Printed per variant: the minimum and median step (ms) and the
ratio to its own float32 AdamW's median (above 1: faster than float32; "(min)": the
same of the minima): lucid's compiled steps (``lucid.compile_optimizer``) against
lucid's float32 AdamW, the references' eager steps (torch's ``AdamW(foreach=True)``, bitsandbytes'
``AdamW8bit`` on its CPU backend, torchao's ``AdamW8bit``/``AdamW4bit``/``AdamWFp8``
with TorchDynamo off, as lucid's tests run them) against torch's float32 AdamW.
References that are not installed are skipped. The load average is printed before and
after.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

import lucid
import lucid.optim.bnb
import lucid.optim.torchao

LUCID = {
    "AdamW float32": lucid.optim.AdamW,
    "bnb AdamW8bit": lucid.optim.bnb.AdamW8bit,
    "torchao AdamW8bit": lucid.optim.torchao.AdamW8bit,
    "torchao AdamW4bit": lucid.optim.torchao.AdamW4bit,
    "torchao AdamWFp8": lucid.optim.torchao.AdamWFp8,
}


def lucid_step(cls: type, p0: np.ndarray, g: np.ndarray) -> Callable[[], None]:
    """One compiled step of lucid's ``cls`` on the parameter, synchronised."""
    w = lucid.Parameter(jnp.asarray(p0))
    compiled = lucid.compile_optimizer(cls([w], lr=1e-3))
    w.grad = jnp.asarray(g)

    def step() -> None:
        compiled.step()
        jax.block_until_ready(w.data)

    return step


def reference_steps(p0: np.ndarray, g: np.ndarray) -> dict[str, Callable[[], None]]:
    """The references' own optimizers (eager), those installed."""
    try:
        import torch
    except ImportError:
        return {}
    makers: dict[str, Callable] = {
        "torch AdamW float32 (foreach)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True)
    }
    try:
        import bitsandbytes as bnb

        makers["bitsandbytes AdamW8bit"] = lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-3)
    except ImportError:
        pass
    try:
        import torchao.optim as ao

        for name in ("AdamW8bit", "AdamW4bit", "AdamWFp8"):
            makers[f"torchao {name}"] = lambda ps, name=name: getattr(ao, name)(ps, lr=1e-3)
    except ImportError:
        pass
    steps = {}
    for name, make in makers.items():
        w = torch.nn.Parameter(torch.from_numpy(p0.copy()))
        w.grad = torch.from_numpy(g.copy())
        steps[name] = make([w]).step
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-references", action="store_true")
    args = parser.parse_args()
    shape = (args.rows, args.cols)
    rng = np.random.default_rng(0)
    p0 = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    steps = {f"lucid {n}": lucid_step(cls, p0, g) for n, cls in LUCID.items()}
    if not args.no_references:
        steps.update(reference_steps(p0, g))
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                times[name].append(1e3 * (time.perf_counter() - start))
    load_after = os.getloadavg()
    medians = {name: statistics.median(t) for name, t in times.items()}
    try:
        import torch

        threads = f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        threads = ""
    print(
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"jax {jax.__version__}{threads}"
    )
    print(
        f"one float32 parameter of {shape[0]} x {shape[1]}, {args.rounds} rounds x "
        f"{args.steps} steps interleaved"
    )
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}".format(*load_before))
    print("load average (1, 5, 15 min) after:  {:.2f} {:.2f} {:.2f}".format(*load_after))
    print(f"\n{'variant':36s} {'min ms':>8s} {'median':>8s} {'ratio':>6s} {'(min)':>6s}")
    for name, t in times.items():
        base = (
            "lucid AdamW float32" if name.startswith("lucid") else "torch AdamW float32 (foreach)"
        )
        ratio = medians[base] / medians[name] if base in medians else float("nan")
        least = min(times[base]) / min(t) if base in times else float("nan")
        print(f"{name:36s} {min(t):8.2f} {medians[name]:8.2f} {ratio:6.2f} {least:6.2f}")


if __name__ == "__main__":
    main()
