"""Matrix preconditioners on the CPU: state bytes per parameter and step time, lucid's
compiled step against lucid's compiled AdamW and against the reference's own step.

The shapes are GPT-2's layout scaled down for a CPU (``--d-model``, ``--layers``,
``--vocab``, ``--ctx``). A step's time is the mean over whole refresh periods (two of
them), so the preconditioner refreshes are paid in it as in training, the least of
`REPEATS` such means; every row runs in this process, on the same inputs, and the ratios
printed are of times measured in this run. The first line gives the date, the machine and
its load average when the run began.

Each optimizer is a `Row` in ``ROWS``: its lucid class, its reference class (``None``
where none is installed) and the options both take. Add a row for another optimizer of
the family and the table gets its line.

jax's CPU decompositions (eigh, QR, SVD) call the LAPACK of SciPy's OpenBLAS, whose
threads spin while they wait: on a machine whose cores other jobs hold, a refresh's SVD took
seconds instead of milliseconds (measured: Shampoo's refresh 15 s with OpenBLAS's default
threads, 74 ms with ``OPENBLAS_NUM_THREADS=1``, at a load average of 12 on 2 cores). The
header prints the setting; set it to 1 on a shared machine.

Run: ``OPENBLAS_NUM_THREADS=1 python benchmarks/bench_matrix.py [--rows SOAP,Shampoo]
[--d-model 192 --layers 2]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from shapes import gpt2, numel

REPEATS = 3
"""Each time is the least of this many means over two refresh periods: on a shared machine
the least is the one the others' load disturbed least."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One optimizer of the table.

    Attributes:
      name: the name printed.
      lucid: ``lucid(params, **options) -> lucid optimizer``.
      reference: ``reference(params, **options) -> torch optimizer``, or ``None``.
      options: the keywords both take (the refresh settings included).
      period: the steps of one refresh period (the timing covers two).
    """

    name: str
    lucid: Callable[..., Any]
    reference: Callable[..., Any] | None
    options: dict[str, Any]
    period: int


def _rows() -> dict[str, Row]:
    import lucid

    try:
        import pytorch_optimizer
    except ImportError:  # the reference is a test dependency
        pytorch_optimizer = None
    rows = {
        "AdamW": Row("AdamW", lucid.optim.AdamW, None, {"lr": 1e-3}, 1),
        "SOAP": Row(
            "SOAP",
            lucid.optim.SOAP,
            None if pytorch_optimizer is None else pytorch_optimizer.SOAP,
            {"lr": 3e-3, "precondition_frequency": 10},
            10,
        ),
        "Shampoo": Row(
            "Shampoo",
            lucid.optim.Shampoo,
            None if pytorch_optimizer is None else pytorch_optimizer.Shampoo,
            {"lr": 1e-3, "preconditioning_compute_steps": 10},
            10,
        ),
    }
    return rows


def _nbytes(tree: Any) -> int:
    """Bytes of every array (jax, NumPy or torch) in a nested state."""
    if hasattr(tree, "nbytes") and not isinstance(tree, list | tuple | dict):
        return int(tree.nbytes)
    if hasattr(tree, "element_size"):
        return int(tree.element_size() * tree.numel())
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_nbytes(v) for v in tree)
    return 0


def _lucid_time(row: Row, shapes: list, grads: list, steps: int) -> tuple[float, float, float]:
    """(first step incl. compiling ms, mean ms over ``steps``, state bytes per parameter)."""
    import jax
    import jax.numpy as jnp

    import lucid

    params = [lucid.Parameter(jnp.asarray(g * 0.5)) for g in grads]
    opt = row.lucid(params, **row.options)
    compiled = lucid.compile_optimizer(opt)
    for p, g in zip(params, grads):
        p.grad = jnp.asarray(g)
    start = time.perf_counter()
    compiled.step()
    jax.block_until_ready([p.data for p in params])
    first = 1e3 * (time.perf_counter() - start)
    for _ in range(2):  # two more: the second step's program (updates) is now warm too
        compiled.step()
    jax.block_until_ready([p.data for p in params])
    means = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(steps):
            compiled.step()
        jax.block_until_ready([p.data for p in params])
        means.append(1e3 * (time.perf_counter() - start) / steps)
    state = compiled.state_dict()["state"]
    mean = min(means)
    return first, mean, _nbytes(state) / numel(shapes)


def _reference_time(row: Row, shapes: list, grads: list, steps: int) -> tuple[float, float]:
    """(mean ms over ``steps`` of the reference's eager step, state bytes per parameter)."""
    import torch

    params = [torch.tensor(g * 0.5) for g in grads]
    opt = row.reference(params, **row.options)
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g)
    for _ in range(3):
        opt.step()
    means = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        means.append(1e3 * (time.perf_counter() - start) / steps)
    return min(means), _nbytes(opt.state_dict()["state"]) / numel(shapes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", default="SOAP,Shampoo", help="comma-separated rows (AdamW always)"
    )
    parser.add_argument("--d-model", type=int, default=192)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--ctx", type=int, default=256)
    args = parser.parse_args()

    import jax
    import torch

    shapes = gpt2(d_model=args.d_model, n_layer=args.layers, vocab=args.vocab, n_ctx=args.ctx)
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=s).astype(np.float32) * 1e-2 for s in shapes]
    rows = _rows()
    wanted = ["AdamW"] + [r for r in args.rows.split(",") if r and r != "AdamW"]
    print(
        f"# {datetime.date.today().isoformat()}  {platform.processor() or platform.machine()}"
        f"  {os.cpu_count()} cores  jax {jax.__version__}  torch {torch.__version__}"
        f"  torch threads {torch.get_num_threads()}  load average {os.getloadavg()[0]:.1f}"
        f"  OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    )
    print(
        f"# GPT-2 layout, d_model {args.d_model}, {args.layers} blocks, vocab {args.vocab}, "
        f"ctx {args.ctx}: {len(shapes)} tensors, {numel(shapes):,d} floats (float32)"
    )
    print(
        "| optimizer | state B/param (lucid) | state B/param (reference) | first step ms "
        "| lucid step ms | reference step ms | lucid / AdamW | reference / lucid |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    adamw_ms = math.nan
    for name in wanted:
        row = rows[name]
        steps = 2 * row.period
        first, ms, state = _lucid_time(row, shapes, grads, steps)
        if name == "AdamW":
            adamw_ms = ms
        ref_ms, ref_state = (math.nan, math.nan)
        if row.reference is not None:
            ref_ms, ref_state = _reference_time(row, shapes, grads, steps)
        print(
            f"| {name} | {state:.1f} | {ref_state:.1f} | {first:.0f} | {ms:.2f} | {ref_ms:.2f} "
            f"| {ms / adamw_ms:.2f} | {ref_ms / ms:.2f} |"
        )


if __name__ == "__main__":
    main()
