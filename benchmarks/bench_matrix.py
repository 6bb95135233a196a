"""Matrix optimizers (Muon, SOAP, Shampoo, PSGD Kron): state bytes per parameter and step
time, lucid's compiled step against lucid's compiled AdamW and against the reference's own
step, on jax's default device (a GPU when there is one) and torch's ``cuda`` when it has one.

    PYTHONPATH=. OPENBLAS_NUM_THREADS=1 python benchmarks/bench_matrix.py          # CPU
    PYTHONPATH=. python benchmarks/bench_matrix.py --preset gpt2-small             # a GPU
    PYTHONPATH=. python benchmarks/bench_matrix.py --rows Muon,SOAP --d-model 128

**Parameters.** The hidden matrices of a GPT-2 (``benchmarks/shapes.py``'s ``gpt2``: per
block ``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``), float32, random
values and gradients: what these optimizers are given in training, the embeddings, biases
and norms going to AdamW. (Muon takes only matrices, and Shampoo's statistic of GPT-2's
embedding would be a ``50257 x 50257`` matrix, 10 GB, with an SVD at every refresh.) Every
row, AdamW's included, runs on the same matrices. ``--preset gpt2-small`` gives GPT-2 small's
(d_model 768, 12 blocks: 48 matrices, 84,934,656 floats); by default a CPU's miniature
(d_model 256, 2 blocks: 8 matrices, 1,572,864 floats; ``--d-model``, ``--layers``).

**Refresh settings.** Every preconditioner is refreshed every 10 steps: SOAP's
``precondition_frequency=10``, Shampoo's ``preconditioning_compute_steps=10``, Kron's
``preconditioner_update_probability=0.1`` (kron-torch's counter updates at every tenth step;
its default anneals from every step to 3% of steps). Muon and AdamW refresh nothing.

**Timing.** A step's time is the mean over whole refresh periods (``--periods``, 2 by
default) of steps issued back to back, with a device sync before and after
(``jax.block_until_ready``, ``torch.cuda.synchronize``), so the refreshes are paid in it as in
training; the least of ``--repeats`` such means (3 by default: on a shared machine the least
is the one the others' load disturbed least). Before it, each side runs one whole period and
one step more, untimed, so that every branch of both programs (the first step's
decomposition, a refresh) has run once: compilation and cuSOLVER's first calls are out of the
timing (a reference under ``torch.compile`` runs one more period: kron-torch's compiles again
at its second refresh). The first step's time (compilation included) is printed
for lucid. Every row runs in this process, on the same inputs; the ratios are of times
measured in this run. ``--preset gpt2-small`` times one period once (``--periods 1
--repeats 1``), to finish in a few minutes on one GPU; the header says so.

**References.** AdamW and Muon: ``torch.optim``'s (AdamW in torch's default form: foreach
on CUDA, one tensor at a time on a CPU); SOAP and Shampoo: ``pytorch_optimizer``'s
(pytorch-optimizer 4.1); Kron: ``kron_torch.Kron`` (kron-torch 0.3.3), whose functions are
compiled as it ships them (``@torch.compile``). The others ship no ``torch.compile`` and run
eagerly; ``--compile-reference`` wraps their ``step`` in ``torch.compile`` too, and
``--reference-eager`` turns kron-torch's off (``TORCHDYNAMO_DISABLE=1``). A reference that is
not installed leaves its cells ``nan``.

**State.** Bytes of every array in the optimizer's ``state_dict()["state"]`` over the
number of parameters: for lucid the state a checkpoint holds (the reference's entries).

Each optimizer is a `Row` in `ROWS`: its lucid class, its reference (``None`` where none is
installed) and the options both take. Add a row for another optimizer and the table gets its
line.

jax's CPU decompositions (eigh, QR, SVD) call the LAPACK of SciPy's OpenBLAS, whose
threads spin while they wait: on a machine whose cores other jobs hold, a refresh's SVD took
seconds instead of milliseconds (measured: Shampoo's refresh 15 s with OpenBLAS's default
threads, 74 ms with ``OPENBLAS_NUM_THREADS=1``, at a load average of 12 on 2 cores). The
header prints the setting; set it to 1 on a shared machine. torch's OpenMP threads do the
same: on 2 loaded cores a ``torch.optim.Muon`` step of four small matrices took 470 ms with
torch's 2 threads and 1.6 ms with one (``--torch-threads 1``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import io
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

import numpy as np

from benchmarks import shapes as shape_sets

PERIOD = 10
"""Steps between two preconditioner refreshes, for every optimizer that has them."""

PRESETS = {
    "cpu": {"d_model": 256, "layers": 2, "periods": 2, "repeats": 3},
    "gpt2-small": {"d_model": 768, "layers": 12, "periods": 1, "repeats": 1},
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One optimizer of the table.

    Attributes:
      name: the name printed.
      lucid: the name of its class in ``lucid.optim``.
      reference: ``() -> the reference's class``, raising ImportError where it is not
        installed; ``None`` for no reference.
      options: the keywords both take (the refresh settings included).
      period: the steps of one refresh period (the window for rows without refreshes).
      ships_compile: whether the reference compiles its own functions (``@torch.compile``).
    """

    name: str
    lucid: str
    reference: Callable[[], Any] | None
    options: dict[str, Any]
    period: int = PERIOD
    ships_compile: bool = False


def _torch(name: str) -> Callable[[], Any]:
    def load() -> Any:
        import torch

        return getattr(torch.optim, name)

    return load


def _pytorch_optimizer(name: str) -> Callable[[], Any]:
    def load() -> Any:
        import pytorch_optimizer

        return getattr(pytorch_optimizer, name)

    return load


def _kron_torch() -> Any:
    from kron_torch import Kron

    return Kron


ROWS: dict[str, Row] = {
    row.name: row
    for row in [
        Row("AdamW", "AdamW", _torch("AdamW"), {"lr": 1e-3}),
        Row("Muon", "Muon", _torch("Muon"), {"lr": 0.02}),
        Row("SOAP", "SOAP", _pytorch_optimizer("SOAP"), {"lr": 3e-3, "precondition_frequency": 10}),
        Row(
            "Shampoo",
            "Shampoo",
            _pytorch_optimizer("Shampoo"),
            {"lr": 1e-3, "preconditioning_compute_steps": 10},
        ),
        Row(
            "Kron",
            "Kron",
            _kron_torch,
            {"lr": 3e-4, "preconditioner_update_probability": 1 / PERIOD},
            ships_compile=True,
        ),
    ]
}


def hidden_matrices(d_model: int, layers: int) -> list[tuple[int, ...]]:
    """The per-block matrices of GPT-2's layout (no embeddings, biases or norms)."""
    shapes = shape_sets.gpt2(d_model=d_model, n_layer=layers, vocab=1, n_ctx=1)
    return [s for s in shapes[2:] if len(s) == 2]


def _nbytes(tree: Any) -> int:
    """Bytes of every array (jax, NumPy or torch) in a nested state."""
    if hasattr(tree, "element_size"):  # torch
        return int(tree.element_size() * tree.numel())
    if hasattr(tree, "nbytes") and hasattr(tree, "shape"):
        return int(tree.nbytes)
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_nbytes(v) for v in tree)
    return 0


@dataclasses.dataclass
class Result:
    first_ms: float
    ms: float
    state_bytes: float  # per parameter


def _timed(
    step: Callable[[], Any], sync: Callable[[], None], warmup: int, steps: int, repeats: int
) -> tuple[float, float]:
    """(the first step's ms, the least of ``repeats`` means of ``steps`` steps in ms)."""
    sync()
    start = time.perf_counter()
    step()
    sync()
    first = 1e3 * (time.perf_counter() - start)
    for _ in range(warmup - 1):
        step()
    means = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        means.append(1e3 * (time.perf_counter() - start) / steps)
    return first, min(means)


def time_lucid(row: Row, values: list, grads: list, args: argparse.Namespace) -> Result:
    import jax
    import jax.numpy as jnp

    import lucid
    from benchmarks._timing import parameter_buffers

    params = [lucid.Parameter(jnp.array(v)) for v in values]
    opt = getattr(lucid.optim, row.lucid)(params, **row.options)
    compiled = lucid.compile_optimizer(opt)
    for p, g in zip(params, grads):
        p.grad = jnp.array(g)
    jax.block_until_ready([p.grad for p in params])

    def sync() -> None:
        jax.block_until_ready(parameter_buffers(params))

    first, ms = _timed(compiled.step, sync, row.period + 1, args.periods * row.period, args.repeats)
    return Result(first, ms, _nbytes(compiled.state_dict()["state"]) / args.numel)


def time_reference(row: Row, values: list, grads: list, args: argparse.Namespace) -> Result:
    import torch

    torch.manual_seed(0)  # kron-torch's probes
    device = args.torch_device
    params = []
    for v, g in zip(values, grads):
        p = torch.nn.Parameter(torch.tensor(v, device=device))  # copies: the inputs stay
        p.grad = torch.tensor(g, device=device)
        params.append(p)
    opt = row.reference()(params, **row.options)
    step = opt.step
    if args.compile_reference and not row.ships_compile:
        step = torch.compile(step)

    def quiet_step() -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # kron-torch's memory report
            step()

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    quiet_step()  # the first step makes the state; kron-torch prints its size
    # torch.compile compiles again at the second refresh (kron-torch: measured), so a
    # compiled reference runs one more period untimed
    compiled = args.compile_reference or (row.ships_compile and not args.reference_eager)
    warmup = row.period * (2 if compiled else 1)
    first, ms = _timed(step, sync, warmup, args.periods * row.period, args.repeats)
    return Result(first, ms, _nbytes(opt.state_dict()["state"]) / args.numel)


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def header(args: argparse.Namespace) -> list[str]:
    import jax
    import torch

    device = jax.devices()[0]
    if device.platform == "cpu":
        where = f"{_cpu_name()}, {os.cpu_count()} cores"
    else:
        where = (
            f"{device.device_kind} ({device.platform}); host {_cpu_name()}, {os.cpu_count()} cores"
        )
    how = {
        row: "torch.compile as it ships"
        if ROWS[row].ships_compile and not args.reference_eager
        else "torch.compile(opt.step)"
        if args.compile_reference and not ROWS[row].ships_compile
        else "eager"
        for row in args.rows
        if ROWS[row].reference is not None
    }
    return [
        f"# {datetime.date.today().isoformat()}  {where}  load average "
        f"{os.getloadavg()[0]:.1f}  jax {jax.__version__} ({jax.default_backend()})  "
        f"torch {torch.__version__} on {args.torch_device}, {torch.get_num_threads()} threads  "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}",
        f"# {' '.join(sys.argv)}",
        f"# GPT-2 layout's hidden matrices, d_model {args.d_model}, {args.layers} block(s): "
        f"{len(args.shapes)} matrices, {args.numel:,d} floats (float32); "
        f"refresh every {PERIOD} steps",
        f"# step ms: least of {args.repeats} mean(s) over {args.periods} refresh period(s) "
        f"({args.periods * PERIOD} steps, synced before and after), after {PERIOD + 1} "
        f"untimed steps ({2 * PERIOD + 1} for a torch.compile'd reference); first step: "
        "lucid's, compilation included",
        "# references: " + ", ".join(f"{k} {v}" for k, v in how.items()),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        default=",".join(r for r in ROWS if r != "AdamW"),
        help="comma-separated rows (AdamW always, first)",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--periods", type=int, default=None, help="refresh periods timed")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--torch-device", default=None, help="default: cuda if torch has it")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch's intra-op threads (default: torch's); 1 on a shared, loaded CPU",
    )
    parser.add_argument(
        "--compile-reference",
        action="store_true",
        help="torch.compile the step of the references that do not ship it",
    )
    parser.add_argument(
        "--reference-eager", action="store_true", help="TORCHDYNAMO_DISABLE=1 (kron-torch eager)"
    )
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.rows = ["AdamW"] + [r for r in args.rows.split(",") if r and r != "AdamW"]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}: choose from {', '.join(ROWS)}")
    if args.reference_eager:
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # read when torch is imported

    import torch

    if args.torch_device is None:
        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    args.shapes = hidden_matrices(args.d_model, args.layers)
    args.numel = shape_sets.numel(args.shapes)
    rng = np.random.default_rng(0)
    values = [(rng.normal(size=s) * 0.02).astype(np.float32) for s in args.shapes]
    grads = [(rng.normal(size=s) * 0.01).astype(np.float32) for s in args.shapes]

    for line in header(args):
        print(line, flush=True)
    print(
        "| optimizer | state B/param, lucid | state B/param, reference | lucid first step ms "
        "| lucid step ms | reference step ms | lucid / AdamW | reference / lucid |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    adamw_ms = math.nan
    for name in args.rows:
        row = ROWS[name]
        began = time.perf_counter()
        ours = time_lucid(row, values, grads, args)
        if name == "AdamW":
            adamw_ms = ours.ms
        theirs = Result(math.nan, math.nan, math.nan)
        if row.reference is not None:
            try:
                theirs = time_reference(row, values, grads, args)
            except ImportError as error:
                print(f"# {name}: no reference ({error})")
        print(
            f"| {name} | {ours.state_bytes:.1f} | {theirs.state_bytes:.1f} | "
            f"{ours.first_ms:.0f} | {ours.ms:.2f} | {theirs.ms:.2f} | {ours.ms / adamw_ms:.2f} "
            f"| {theirs.ms / ours.ms:.2f} |",
            flush=True,
        )
        print(f"#   ({name}: {time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
        gc.collect()
        if args.torch_device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
