"""Step time and effective bandwidth of every lucid.functional transform, beside its peers.

Each lucid transform (torch's defaults; ``sparse_adam`` with a dense gradient,
``lbfgs`` is the closure-less Barzilai-Borwein step) runs the full update
``grads -> tx.update -> optax.apply_updates`` as one ``jax.jit`` with the
params and the state donated, over a list of float32 arrays, one per tensor
of the chosen parameter set, with fixed random gradients. In the same run:
``torch.optim.Adam`` with ``foreach=True`` (and ``fused=True`` on CUDA) over the
same shapes, and ``optax.adam`` jitted with donation. GB/s follows the bytes
model in ``benchmarks/_timing.py`` (Adam: 28 bytes per parameter).

    PYTHONPATH=. python benchmarks/bench_transforms.py [--sets gpt2_small,many_small]
        [--optimizers adam,optax_adam,...] [--repeats 20] [--warmup 3] [--device cpu|cuda]
        [--torch-threads N] [--json out.json]

Memory: a set's params, grads and two moments take 16 bytes per float, ~25 GB for gpt2_xl,
which is why it is not a default set.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys

# jax and torch share the GPU: don't let jax grab 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import optax
import torch

import lucid.functional as LF
from benchmarks import _timing, shapes

LUCID = (
    "sgd", "adam", "adamw", "rmsprop", "adagrad", "adadelta", "adamax",
    "radam", "nadam", "asgd", "rprop", "sparse_adam", "lbfgs",
)  # fmt: skip
PEERS = ("optax_adam", "torch_adam_foreach", "torch_adam_fused")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform reports."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def hardware(torch_device: str) -> dict[str, str]:
    """What ran the benchmark: versions, devices, CPU model, date."""
    cpu = cpu_model()
    torch_name = torch.cuda.get_device_name(torch_device) if torch_device == "cuda" else cpu
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "cpu": f"{cpu} ({os.cpu_count()} logical cores)",
        "python": platform.python_version(),
        "jax": f"{jax.__version__}, devices {jax.devices()}",
        "optax": optax.__version__,
        "torch": f"{torch.__version__}, device {torch_device} ({torch_name}), "
        f"{torch.get_num_threads()} CPU threads",
    }


def random_arrays(shape_list, seed: int) -> list[jax.Array]:
    """Standard-normal float32 arrays, one per shape."""
    key = jax.random.PRNGKey(seed)
    return [jax.random.normal(jax.random.fold_in(key, i), s) for i, s in enumerate(shape_list)]


def bench_jax(tx: optax.GradientTransformation, shape_list, warmup: int, repeats: int) -> dict:
    """Time ``tx``'s jitted, donated step over float32 arrays of ``shape_list``."""
    params, grads = random_arrays(shape_list, seed=0), random_arrays(shape_list, seed=1)
    # An init may hand one zeros buffer to several state fields; donation needs distinct ones.
    state = jax.tree_util.tree_map(jnp.copy, tx.init(params))
    state_floats = sum(x.size for x in jax.tree_util.tree_leaves(state) if x.ndim > 0)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    jitted = jax.jit(step, donate_argnums=(0, 1))
    carry = [params, state]

    def run():
        carry[:] = jitted(*carry, grads)
        return carry

    timing = _timing.measure(run, _timing.jax_sync, warmup=warmup, repeats=repeats)
    return {"timing": timing, "state_floats": state_floats}


def bench_torch(shape_list, device: str, fused: bool, warmup: int, repeats: int) -> dict:
    """Time ``torch.optim.Adam(foreach=True)`` (or ``fused=True``) over ``shape_list``."""
    gen = torch.Generator(device=device).manual_seed(0)
    params = []
    for s in shape_list:
        p = torch.randn(s, device=device, generator=gen).requires_grad_()
        p.grad = torch.randn(s, device=device, generator=gen)
        params.append(p)
    opt = torch.optim.Adam(params, lr=1e-3, **({"fused": True} if fused else {"foreach": True}))

    def run():
        opt.step()

    timing = _timing.measure(run, _timing.torch_sync(device), warmup=warmup, repeats=repeats)
    state_floats = sum(t.numel() for st in opt.state.values() for t in st.values() if t.dim() > 0)
    return {"timing": timing, "state_floats": state_floats}


def run_one(name: str, shape_list, args) -> dict:
    """Benchmark one optimizer by name, then free what it allocated."""
    if name.startswith("torch_adam_"):
        fused = name.endswith("fused")
        result = bench_torch(shape_list, args.device, fused, args.warmup, args.repeats)
    else:
        tx = optax.adam(1e-3) if name == "optax_adam" else getattr(LF, name)()
        result = bench_jax(tx, shape_list, args.warmup, args.repeats)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shapes.add_sets_argument(parser, default="gpt2_small,many_small")
    parser.add_argument(
        "--optimizers",
        help=f"comma-separated, from: {', '.join(LUCID + PEERS)} "
        "(default: all; torch_adam_fused only when --device is cuda)",
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps, incl. compile")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch's device (jax uses its default backend)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="torch.set_num_threads for the CPU peers (default: torch's own choice); "
        "1 keeps them steady on a machine shared with other work",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    if args.optimizers is None:
        # The fused peer is CUDA's kernel; torch's CPU one runs only when asked for by name.
        args.optimizers = [
            o for o in LUCID + PEERS if o != "torch_adam_fused" or args.device == "cuda"
        ]
    else:
        args.optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    unknown = set(args.optimizers) - set(LUCID + PEERS)
    if unknown:
        parser.error(f"unknown optimizers {sorted(unknown)}")
    return args


def main() -> None:
    args = parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if "gpt2_xl" in args.sets and jax.default_backend() == "cpu":
        print("note: gpt2_xl with Adam needs ~25 GB of host memory per optimizer\n")
    info = hardware(args.device)
    for key, value in info.items():
        print(f"{key:8s} {value}")
    print("timings: median of", args.repeats, "steps after", args.warmup, "warm-up steps\n")

    rows = []
    for set_name in args.sets:
        shape_list = shapes.SETS[set_name]()
        n_params = shapes.numel(shape_list)
        # torch first, so its cached GPU memory is released before jax allocates.
        order = sorted(args.optimizers, key=lambda o: not o.startswith("torch"))
        for name in order:
            result = run_one(name, shape_list, args)
            timing, n_state = result["timing"], result["state_floats"] / n_params
            ms = timing.median_ms
            row = {
                "optimizer": name,
                "set": set_name,
                "tensors": len(shape_list),
                "params": n_params,
                "state_buffers": n_state,
                "ms": ms,
                "gb_s": _timing.gb_per_s(_timing.bytes_per_step(n_params, n_state), ms),
                "first_call_s": timing.first_ms / 1e3,
                "times_ms": timing.times_ms,
            }
            rows.append(row)
            print(f"  {set_name:11s} {name:19s} {ms:10.2f} ms", flush=True)

    rank = {name: i for i, name in enumerate(LUCID + PEERS)}
    rows.sort(key=lambda r: (args.sets.index(r["set"]), rank[r["optimizer"]]))
    print("\n| optimizer | set | state buffers | ms/step | GB/s | first call (s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['optimizer']} | {r['set']} | {r['state_buffers']:g} | {r['ms']:.2f} "
            f"| {r['gb_s']:.1f} | {r['first_call_s']:.1f} |"
        )

    by_key = {(r["set"], r["optimizer"]): r for r in rows}
    ratios = []
    for set_name in args.sets:
        mine = by_key.get((set_name, "adam"))
        for peer in PEERS:
            theirs = by_key.get((set_name, peer))
            if mine and theirs:
                ratios.append((set_name, peer, theirs["ms"], mine["ms"]))
    if ratios:
        print("\n| set | peer | peer ms | lucid adam ms | lucid / peer time |")
        print("| --- | --- | ---: | ---: | ---: |")
        for set_name, peer, peer_ms, mine_ms in ratios:
            ratio = mine_ms / peer_ms
            print(f"| {set_name} | {peer} | {peer_ms:.2f} | {mine_ms:.2f} | {ratio:.2f} |")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hardware": info, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
