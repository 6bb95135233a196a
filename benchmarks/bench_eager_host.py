"""Host cost of one eager ``opt.step()``: lucid against torch, tiny tensors on the CPU.

    PYTHONPATH=. python benchmarks/bench_eager_host.py

With 16 floats per tensor the arithmetic is nothing and a step costs what its
host code costs: Python per parameter, dispatch, launches. Every
implementation runs in this one process on the CPU, torch on one thread
(``torch.set_num_threads(1)``), over 10, 100 and 1000 parameters in 1 and 4
groups, for Adam, AdamW and SGD with momentum 0.9:

* ``lucid eager``: ``opt.step()`` of a lucid optimizer, waiting for its results
  at the end of each step (every storage its parameters' new values live in:
  small parameters' values stay in the pieces the step returned until read);
* ``lucid eager, read``: the same, then every parameter's ``.data`` read, as a
  loop that reads each value between steps does (the first read after a step
  cuts the pieces, one call per group and call of the step);
* ``lucid compiled``: the same after ``lucid.compile_optimizer(opt)``, waiting
  for the flat buffer;
* ``torch foreach`` and ``torch for-loop``: ``torch.optim``'s ``foreach=True``
  and ``foreach=False``.

Each figure is the median of ``--repeats`` (60) synchronised steps after
``--warmup`` (10) untimed ones, in milliseconds; the four implementations' timed
steps are interleaved (one step of each in turn), so that a change in the
machine's load meets them alike. The ratio columns are lucid / torch foreach
(below 1: lucid is faster). Gradients are fixed arrays set once, so a step is
the optimizer's work alone.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

import lucid

OPTIMIZERS = {
    "Adam": {"lr": 1e-3},
    "AdamW": {"lr": 1e-3, "weight_decay": 1e-2},
    "SGD": {"lr": 1e-2, "momentum": 0.9},
}
MODES = ("lucid eager", "lucid eager, read", "lucid compiled", "torch foreach", "torch for-loop")
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


def lucid_step(name: str, n: int, groups: int, mode: str) -> Callable[[], None]:
    """One synchronised lucid step (its results waited for)."""
    compiled = mode == "lucid compiled"
    values, grads = _values(n)
    params = [lucid.Parameter(v) for v in values]
    split = _split(params, groups)
    opt = getattr(lucid.optim, name)([{"params": g} for g in split], **OPTIMIZERS[name])
    if compiled:
        lucid.compile_optimizer(opt)
    for p, g in zip(params, grads):
        p.grad = jax.numpy.asarray(g)
    lasts = [g[-1] for g in split]

    def step() -> None:
        opt.step()
        if compiled:
            storage, _ = lasts[-1].location
            jax.block_until_ready(storage.values)  # the flat buffer: no slice
        elif mode == "lucid eager":  # every storage's buffer (a parameter's own value)
            storages = {id(s): s for s, _ in (p.location for p in params)}
            jax.block_until_ready([s.buffer for s in storages.values()])
        else:
            jax.block_until_ready([p.data for p in params])

    return step


def torch_step(name: str, n: int, groups: int, foreach: bool) -> Callable[[], None]:
    """One torch step (synchronous on the CPU)."""
    import torch

    values, grads = _values(n)
    params = []
    for v, g in zip(values, grads):
        p = torch.nn.Parameter(torch.from_numpy(v.copy()))
        p.grad = torch.from_numpy(g.copy())
        params.append(p)
    groups_ = [{"params": g} for g in _split(params, groups)]
    opt = getattr(torch.optim, name)(groups_, **OPTIMIZERS[name], foreach=foreach)
    return opt.step


def make_step(mode: str, name: str, n: int, groups: int) -> Callable[[], None]:
    if mode.startswith("lucid"):
        return lucid_step(name, n, groups, mode)
    return torch_step(name, n, groups, mode == "torch foreach")


def measure_interleaved(steps: dict[str, Callable[[], None]], args) -> dict[str, float]:
    """Median ms per step of each implementation, their timed steps interleaved (one
    step of each in turn), so that a change in the machine's load meets them alike."""
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    for _ in range(args.repeats):
        for mode, step in steps.items():
            start = time.perf_counter()
            step()
            times[mode].append(1e3 * (time.perf_counter() - start))
    return {mode: statistics.median(t) for mode, t in times.items()}


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
                steps = {mode: make_step(mode, name, n, groups) for mode in args.modes}
                times = measure_interleaved(steps, args)
                del steps
                gc.collect()
                row = [name, str(n), str(groups)] + [f"{times[m]:.3f}" for m in args.modes]
                if "torch foreach" in args.modes:
                    row += [f"{times[m] / times['torch foreach']:.2f}" for m in ratios]
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
