"""Host cost of one eager ``opt.step()``: lucid against torch, tiny tensors on the CPU.

    PYTHONPATH=. python benchmarks/bench_eager_host.py

With 16 floats per tensor the arithmetic is nothing and a step costs what its
host code costs: Python per parameter, dispatch, launches. Every
implementation runs in this one process on the CPU, torch on one thread
(``torch.set_num_threads(1)``), over 10, 100 and 1000 parameters in 1 and 4
groups, for Adam, AdamW and SGD with momentum 0.9:

* ``lucid eager``: ``opt.step()`` of a lucid optimizer, waiting for its results
  at the end of each step (the last parameter of every group: each group's
  update is one executable, run in order);
* ``lucid compiled``: the same after ``lucid.compile_optimizer(opt)``, waiting
  for the flat buffer;
* ``torch foreach`` and ``torch for-loop``: ``torch.optim``'s ``foreach=True``
  and ``foreach=False``.

Each figure is the median of ``--repeats`` (60) synchronised steps after
``--warmup`` (10) untimed ones, in milliseconds; the ratio columns are
lucid / torch foreach (below 1: lucid is faster). Gradients are fixed arrays
set once, so a step is the optimizer's work alone.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _timing import measure  # noqa: E402

import lucid  # noqa: E402

OPTIMIZERS = {
    "Adam": {"lr": 1e-3},
    "AdamW": {"lr": 1e-3, "weight_decay": 1e-2},
    "SGD": {"lr": 1e-2, "momentum": 0.9},
}
MODES = ("lucid eager", "lucid compiled", "torch foreach", "torch for-loop")
SIZE = 16  # floats per tensor


def _values(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(SIZE).astype(np.float32) for _ in range(n)]
    grads = [rng.standard_normal(SIZE).astype(np.float32) * 0.01 for _ in range(n)]
    return values, grads


def _split(items: list, groups: int) -> list[list]:
    """``items`` in ``groups`` contiguous groups (as equal as they come)."""
    bounds = np.linspace(0, len(items), groups + 1).round().astype(int)
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


def bench_lucid(name: str, n: int, groups: int, compiled: bool, args) -> float:
    values, grads = _values(n)
    params = [lucid.Parameter(v) for v in values]
    split = _split(params, groups)
    opt = getattr(lucid.optim, name)([{"params": g} for g in split], **OPTIMIZERS[name])
    if compiled:
        lucid.compile_optimizer(opt)
    for p, g in zip(params, grads):
        p.grad = jax.numpy.asarray(g)
    lasts = [g[-1] for g in split]

    def step():
        opt.step()
        if compiled:
            storage, _ = lasts[-1].location
            return storage.values  # the flat buffer: no slice
        return [p.data for p in lasts]

    timing = measure(step, jax.block_until_ready, warmup=args.warmup, repeats=args.repeats)
    return timing.median_ms


def bench_torch(name: str, n: int, groups: int, foreach: bool, args) -> float:
    import torch

    values, grads = _values(n)
    params = []
    for v, g in zip(values, grads):
        p = torch.nn.Parameter(torch.from_numpy(v.copy()))
        p.grad = torch.from_numpy(g.copy())
        params.append(p)
    groups_ = [{"params": g} for g in _split(params, groups)]
    opt = getattr(torch.optim, name)(groups_, **OPTIMIZERS[name], foreach=foreach)
    timing = measure(opt.step, lambda _: None, warmup=args.warmup, repeats=args.repeats)
    return timing.median_ms


def run(mode: str, name: str, n: int, groups: int, args) -> float:
    if mode == "lucid eager":
        result = bench_lucid(name, n, groups, False, args)
    elif mode == "lucid compiled":
        result = bench_lucid(name, n, groups, True, args)
    else:
        result = bench_torch(name, n, groups, mode == "torch foreach", args)
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    print(
        f"# jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
        f"(1 thread), python {platform.python_version()}; {SIZE} float32 per tensor; "
        f"median of {args.repeats} steps after {args.warmup}, ms per step"
    )
    header = ["optimizer", "params", "groups", *args.modes]
    ratios = [m for m in args.modes if m.startswith("lucid")]
    if "torch foreach" in args.modes:
        header += [f"{m.removeprefix('lucid ')} / foreach" for m in ratios]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in args.optimizers:
        for n in args.sizes:
            for groups in args.groups:
                times = {mode: run(mode, name, n, groups, args) for mode in args.modes}
                row = [name, str(n), str(groups)] + [f"{times[m]:.3f}" for m in args.modes]
                if "torch foreach" in args.modes:
                    row += [f"{times[m] / times['torch foreach']:.2f}" for m in ratios]
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
