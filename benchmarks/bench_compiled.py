"""compile_optimizer and fused_step against torch's fused/foreach kernels and optax.

    PYTHONPATH=. python benchmarks/bench_compiled.py --sets gpt2_small,many_small

For each parameter set and optimizer (float32) it measures, in one run, the
median ms per step of:

* ``torch fused`` / ``torch foreach``: torch.optim with ``fused=True`` (CUDA
  only) or ``foreach=True``, gradients set once;
* ``optax``: the optax rule jitted with donated params and state, one array per tensor;
* ``lucid functional``: ``lucid.functional.<rule>`` jitted the same way;
* ``lucid eager``: ``opt.step()`` of the stateful shell;
* ``lucid compiled``: ``opt.step()`` after ``compile_optimizer(opt)``;
* ``lucid fused``: ``fused_step`` with the loss ``sum(p * c)`` (gradient ``c``,
  a fixed array per tensor), so it also pays one forward read of ``p`` and ``c``;

plus the floor: the minimum bytes the rule must move (Adam: 28 per parameter)
at the device-to-device copy bandwidth measured in the same run, and the
compile time of the compiled step (its first call).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lucid
from benchmarks import shapes as shape_sets
from benchmarks._timing import (
    Timing,
    gb_per_s,
    jax_sync,
    measure,
    measure_pipelined,
    torch_sync,
)

# optimizer -> (class name in torch and lucid, options, optax factory, state buffers)
OPTIMIZERS = {
    "adam": ("Adam", {"lr": 1e-3}, lambda: optax.adam(1e-3), 2),
    "adamw": (
        "AdamW",
        {"lr": 1e-3, "weight_decay": 1e-2},
        lambda: optax.adamw(1e-3, weight_decay=1e-2),
        2,
    ),
    "sgd": ("SGD", {"lr": 1e-2, "momentum": 0.9}, lambda: optax.sgd(1e-2, momentum=0.9), 1),
    # the rest of torch's elementwise optimizers (no optax counterpart with torch's math):
    # name -> (class, options, None, number of parameter-sized state buffers)
    "rmsprop": ("RMSprop", {"lr": 1e-2}, None, 1),
    "adagrad": ("Adagrad", {"lr": 1e-2}, None, 1),
    "adadelta": ("Adadelta", {}, None, 2),
    "adamax": ("Adamax", {"lr": 2e-3}, None, 2),
    "radam": ("RAdam", {"lr": 1e-3}, None, 2),
    "nadam": ("NAdam", {"lr": 2e-3}, None, 2),
    "asgd": ("ASGD", {"lr": 1e-2}, None, 1),
    "rprop": ("Rprop", {"lr": 1e-2}, None, 2),
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


DTYPE = [jnp.float32]  # set from --dtype in main()


def _arrays(shapes, seed):
    key = jax.random.PRNGKey(seed)
    return [
        (jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32) * 0.01).astype(DTYPE[0])
        for i, s in enumerate(shapes)
    ]


def bench_optax(tx, shapes, args) -> tuple[Timing, float]:
    params, grads = _arrays(shapes, 0), _arrays(shapes, 1)
    # optax may hand out one zeros buffer for several moments; donation needs distinct ones
    state = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tx.init(params))

    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(update, donate_argnums=(0, 1))
    box = [params, state]

    def run():
        box[0], box[1] = step(box[0], box[1], grads)
        return box[0]

    return _both(run, jax_sync, args)


def _both(run, sync, args) -> tuple[Timing, float]:
    """Synchronised per-step timing, then steady-state (pipelined) ms per step."""
    timing = measure(run, sync, warmup=args.warmup, repeats=args.repeats)
    return timing, measure_pipelined(run, sync, repeats=args.repeats)


def _lucid_params(shapes):
    return [lucid.Parameter(a) for a in _arrays(shapes, 0)]


def bench_lucid(name, options, shapes, args, mode) -> tuple[Timing, float]:
    params = _lucid_params(shapes)
    opt = getattr(lucid.optim, name)(params, **options)
    grads = _arrays(shapes, 1)
    if mode == "fused":
        # a linear loss: its gradient is the fixed array c, as the other modes' gradients are
        c = jnp.concatenate([g.ravel() for g in grads])
        del grads

        def loss(ps, c):
            return jnp.vdot(jnp.concatenate([p.ravel() for p in ps]), c)

        fused = lucid.optim.fused_step(loss, opt)
        return _both(lambda: fused(params, c), jax_sync, args)
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    for p, g in zip(params, grads):
        p.grad = g

    def run():
        opt.step()
        return params[-1].location[0].buffer  # the flat buffer once compiled: no slice

    return _both(run, jax_sync, args)


def bench_torch(name, options, shapes, args, impl) -> tuple[Timing, float] | None:
    import torch

    device = args.torch_device
    if impl == "fused" and not device.startswith("cuda"):
        return None
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = []
    dtype = getattr(torch, np.dtype(DTYPE[0]).name)
    for s in shapes:
        p = torch.nn.Parameter((torch.randn(s, generator=gen) * 0.01).to(device, dtype))
        p.grad = (torch.randn(s, generator=gen) * 0.01).to(device, dtype)
        params.append(p)
    try:
        opt = getattr(torch.optim, name)(params, **options, **{impl: True})
    except (RuntimeError, ValueError, TypeError):  # no fused (or foreach) kernel for it
        return None
    try:
        timing = _both(opt.step, torch_sync(device), args)
    except RuntimeError:  # torch refuses this kernel at the first step (fused Adagrad on CUDA)
        timing = None
    del opt, params
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return timing


def run_mode(mode, cls, options, optax_factory, shapes, args) -> tuple[Timing, float] | None:
    """One implementation's timing on one parameter set (``None``: not on this device)."""
    if mode.startswith("torch_"):
        return bench_torch(cls, options, shapes, args, mode.removeprefix("torch_"))
    if mode == "optax":
        return None if optax_factory is None else bench_optax(optax_factory(), shapes, args)
    if mode == "functional":
        return bench_optax(getattr(lucid.functional, cls.lower())(**options), shapes, args)
    return bench_lucid(cls, options, shapes, args, mode)


def copy_bandwidth(args) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), measured with jax."""
    n = 256 * 2**20
    src = jnp.ones(n, jnp.float32)
    copy = jax.jit(lambda x: x * 1.0)  # one read, one write
    timing = measure(lambda: copy(src), jax_sync, warmup=3, repeats=max(args.repeats, 5))
    return 2 * 4 * n / (timing.median_ms * 1e-3)


def hardware() -> str:
    lines = [f"date: {datetime.date.today()}", f"jax {jax.__version__}, devices: {jax.devices()}"]
    try:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
        lines.append(f"torch {torch.__version__} ({gpu})")
    except ImportError:
        lines.append("torch: not installed")
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines.append(f"CPU: {cpu}, {os.cpu_count()} cores")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shape_sets.add_sets_argument(parser, default="gpt2_small,many_small")
    parser.add_argument("--optimizers", default="adam")
    parser.add_argument(
        "--modes", default="torch_fused,torch_foreach,optax,functional,eager,compiled,fused"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--torch-device", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    args = parser.parse_args()
    if args.torch_device is None:
        try:
            import torch

            args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.torch_device = "cpu"
    modes = args.modes.split(",")
    DTYPE[0] = DTYPES[args.dtype]
    itemsize = np.dtype(DTYPE[0]).itemsize
    print(hardware())
    bandwidth = copy_bandwidth(args)
    print(f"device copy bandwidth (jax, read+write): {bandwidth / 1e9:.1f} GB/s\n")
    results = []
    header = (
        f"{'optimizer':9s} {'set':11s} {'impl':14s} {'ms/step':>8s} {'pipelined':>9s} "
        f"{'GB/s':>6s} {'x floor':>7s} {'first ms':>9s}"
    )
    print(header)
    for opt_name in args.optimizers.split(","):
        cls, options, optax_factory, n_state = OPTIMIZERS[opt_name]
        for set_name in args.sets:
            shapes = shape_sets.SETS[set_name]()
            n = shape_sets.numel(shapes)
            n_bytes = itemsize * (3 + 2 * n_state) * n  # state kept in the params' dtype
            floor_ms = n_bytes / bandwidth * 1e3
            print(f"{opt_name:9s} {set_name:11s} {'floor':14s} {floor_ms:8.3f}")
            for mode in modes:
                result = run_mode(mode, cls, options, optax_factory, shapes, args)
                gc.collect()
                if result is None:
                    continue
                timing, pipelined = result
                ms = timing.median_ms
                row = {
                    "optimizer": opt_name,
                    "set": set_name,
                    "impl": mode,
                    "ms": ms,
                    "pipelined_ms": pipelined,
                    "gb_s": gb_per_s(n_bytes, pipelined),
                    "x_floor": pipelined / floor_ms,
                    "first_ms": timing.first_ms,
                    "n_params": n,
                    "n_tensors": len(shapes),
                    "dtype": args.dtype,
                }
                results.append(row)
                print(
                    f"{opt_name:9s} {set_name:11s} {mode:14s} {ms:8.3f} {pipelined:9.3f} "
                    f"{row['gb_s']:6.0f} {row['x_floor']:7.2f} {timing.first_ms:9.0f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"hardware": hardware(), "bandwidth": bandwidth, "results": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
