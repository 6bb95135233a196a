"""A real training loop: a small GPT trained with AdamW, in torch, optax and lucid.

    PYTHONPATH=. python benchmarks/bench_gpt_loop.py            # the GPU run (~29.5M params)
    PYTHONPATH=. python benchmarks/bench_gpt_loop.py --small    # a tiny model, 5 iterations

(On a CPU shared with other work, ``OMP_NUM_THREADS=1`` keeps torch's thread pool from
spin-waiting, which otherwise makes its CPU iterations 100x slower.)

The optimizer benchmarks (``bench_compiled.py``) time ``opt.step()`` alone. A
user sees the whole iteration: forward, backward, gradient clipping, the
optimizer step and the scheduler, each a separate call in torch's idiom. This
benchmark times that iteration for one model (``benchmarks/gpt_model.py``: a
GPT-2-style decoder, 8 layers, d_model 512, tied head; the same NumPy weights
and the same fixed token batches on both sides) with torch's usual recipe:
AdamW (lr 3e-4, betas (0.9, 0.95)) in two groups (weight decay 0.1 on the >=2-D
weights, 0 on biases and LayerNorms), a ``LambdaLR`` warm-up (10 steps) then
cosine to 10%, and ``clip_grad_norm_`` at 1.0. Five loops, each written line by
line as its user would:

1. ``torch eager``: ``opt.zero_grad(); loss = model(x); loss.backward();
   clip_grad_norm_(...); opt.step(); sched.step()``, AdamW ``fused=True`` on
   CUDA (``foreach=True`` on CPU);
2. ``optax jit``: ``optax.chain(clip_by_global_norm, adamw(schedule, mask=...))``
   and ``value_and_grad`` in one ``jax.jit`` with donated parameters and state,
   the fair JAX baseline (its clipping and Adam epsilon differ from torch's by
   rounding-sized terms, so its losses are close to, not equal to, torch's);
3. ``lucid eager``: ``opt.zero_grad(); loss = lucid.backward(loss_fn, params, x);
   lucid.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); sched.step()``;
4. ``lucid compiled``: the same loop after ``lucid.compile_optimizer(opt)``;
5. ``lucid fused``: ``fused_step(loss_fn, opt, grad_transform=clip_grad_norm(1.0))``,
   then ``loss = fused(params, x); sched.step()`` (forward, backward, clipping and
   update in one executable).

Per loop it reports:

* ``ms/it``: the median wall time of an iteration that ends by reading the loss
  (as a loop logging it does) and waiting for the update to land on the device;
* ``pipelined``: ms per iteration over ``--pipelined`` iterations issued back to
  back with one sync at the end (the throughput of a loop that rarely logs);
* ``first ms``: the first iteration (tracing and compilation included), and
  ``setup+first``: from the start of that loop's setup (parameters onto the
  device, optimizer, scheduler, compile calls) to the end of its first iteration;
  JAX's caches are cleared before each JAX loop, so every loop compiles cold;
* the loss curve's largest relative difference from torch's, and its difference
  at the first iteration (same weights: forward rounding only). The lucid loops
  compute torch's exact math, so they agree with torch to float32 rounding.

Matmuls run in full float32 on both sides (torch's TF32 flags off, JAX's
``jax_default_matmul_precision`` "highest"), so the comparison holds on GPUs;
``--tf32`` lets both sides use TF32 instead (the losses then differ by more than rounding).
Each loop runs ``--warmup`` (5, the first included) + ``--steps`` (60) synced + 1 + ``--pipelined``
(20) iterations, 86 by default, over which the schedule runs its course.
The ratios at the end compare each lucid loop with optax and torch measured in
the same run.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

import lucid
from benchmarks._timing import measure, measure_pipelined, parameter_buffers
from benchmarks.bench_compiled import hardware
from benchmarks.gpt_model import (
    SMALL,
    Config,
    init_weights,
    lr_factor,
    lr_factor_jax,
    make_batches,
    make_jax_loss,
    make_torch_model,
    parameter_names,
)

LR, BETAS, WEIGHT_DECAY, MAX_NORM, WARMUP_STEPS = 3e-4, (0.9, 0.95), 0.1, 1.0, 10
LOOPS = ("torch", "optax", "eager", "compiled", "fused")
LABELS = {
    "torch": "torch eager",
    "optax": "optax jit",
    "eager": "lucid eager",
    "compiled": "lucid compiled",
    "fused": "lucid fused",
}

# A loop's step: iteration index -> loss (on the device); its sync: loss -> None.
Step = Callable[[int], Any]
Sync = Callable[[Any], None]


class Setup:
    """What every loop shares: the model's config and weights, batches, schedule length."""

    def __init__(self, cfg: Config, total_steps: int, torch_device: str) -> None:
        self.cfg = cfg
        self.names = parameter_names(cfg)
        self.weights = init_weights(cfg)
        batches = make_batches(cfg)
        self.jax_batches = [jax.device_put(b) for b in batches]
        self.torch_batches = [torch.from_numpy(b).long().to(torch_device) for b in batches]
        self.torch_device = torch_device
        self.total_steps = total_steps
        self.warmup = min(WARMUP_STEPS, max(total_steps // 4, 1))

    def lr_lambda(self, step: int) -> float:
        return lr_factor(step, self.warmup, self.total_steps)

    def decays(self, name: str) -> bool:
        return self.weights[name].ndim >= 2


# ------------------------------------------------------------------------------ loops


def torch_loop(s: Setup) -> tuple[Step, Sync]:
    cuda = s.torch_device.startswith("cuda")
    model = make_torch_model(s.cfg, s.weights, s.torch_device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=LR,
        betas=BETAS,
        **({"fused": True} if cuda else {"foreach": True}),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, s.lr_lambda)
    batches = s.torch_batches

    def step(i: int) -> Any:
        x = batches[i % len(batches)]
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
        return loss.detach()

    def sync(loss: Any) -> None:
        loss.item()
        if cuda:
            torch.cuda.synchronize()

    return step, sync


def optax_loop(s: Setup) -> tuple[Step, Sync]:
    loss_fn = make_jax_loss(s.cfg)
    params = {name: jnp.asarray(w) for name, w in s.weights.items()}
    tx = optax.chain(
        optax.clip_by_global_norm(MAX_NORM),
        optax.adamw(
            lambda count: LR * lr_factor_jax(count, s.warmup, s.total_steps),
            b1=BETAS[0],
            b2=BETAS[1],
            weight_decay=WEIGHT_DECAY,
            mask={name: s.decays(name) for name in params},
        ),
    )
    # optax may hand out one zeros buffer for several moments; donation needs distinct ones
    opt_state = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tx.init(params))

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    box = [params, opt_state]
    batches = s.jax_batches

    def step(i: int) -> Any:
        box[0], box[1], loss = train_step(box[0], box[1], batches[i % len(batches)])
        return loss

    def sync(loss: Any) -> None:
        float(loss)
        jax.block_until_ready(box)

    return step, sync


def lucid_loop(s: Setup, mode: str) -> tuple[Step, Sync]:
    loss_fn = make_jax_loss(s.cfg)
    params = {name: lucid.Parameter(jnp.asarray(w)) for name, w in s.weights.items()}
    all_params = [params[name] for name in s.names]
    opt = lucid.optim.AdamW(
        [
            {"params": [p for p in all_params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in all_params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=BETAS,
    )
    sched = lucid.optim.lr_scheduler.LambdaLR(opt, s.lr_lambda)
    batches = s.jax_batches

    if mode == "fused":
        fused = lucid.optim.fused_step(
            loss_fn, opt, grad_transform=lucid.functional.clip_grad_norm(MAX_NORM)
        )

        def step(i: int) -> Any:
            loss = fused(params, batches[i % len(batches)])
            sched.step()
            return loss

    else:
        if mode == "compiled":
            lucid.compile_optimizer(opt)

        def step(i: int) -> Any:
            opt.zero_grad()
            loss = lucid.backward(loss_fn, params, batches[i % len(batches)])
            lucid.nn.utils.clip_grad_norm_(all_params, MAX_NORM)
            opt.step()
            sched.step()
            return loss

    def sync(loss: Any) -> None:
        float(loss)
        # wherever the parameters live now (their own arrays or a compiled flat buffer)
        jax.block_until_ready(parameter_buffers(all_params))

    return step, sync


def build(s: Setup, loop: str) -> tuple[Step, Sync]:
    if loop == "torch":
        return torch_loop(s)
    if loop == "optax":
        return optax_loop(s)
    return lucid_loop(s, loop)


def run(s: Setup, loop: str, args: argparse.Namespace) -> dict[str, Any]:
    """One loop, from a cold start: setup, the timed iterations, the losses."""
    gc.collect()
    if loop != "torch":
        jax.clear_caches()
    losses: list[Any] = []
    start = time.perf_counter()
    step_of, sync = build(s, loop)
    setup_ms = 1e3 * (time.perf_counter() - start)
    counter = iter(range(s.total_steps))

    def step() -> Any:
        loss = step_of(next(counter))
        losses.append(loss)
        return loss

    timing = measure(step, sync, warmup=args.warmup, repeats=args.steps)
    pipelined = measure_pipelined(step, sync, repeats=args.pipelined)
    curve = [float(x) for x in losses]
    assert len(curve) == s.total_steps
    return {
        "loop": loop,
        "label": LABELS[loop],
        "ms": timing.median_ms,
        "pipelined_ms": pipelined,
        "first_ms": timing.first_ms,
        "setup_first_ms": setup_ms + timing.first_ms,
        "times_ms": timing.times_ms,
        "losses": curve,
    }


# ------------------------------------------------------------------------------ main


def set_precision(tf32: bool) -> str:
    """Both frameworks' float32 matmul precision; returns a line describing it."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if tf32 else "highest")
    return (
        f"matmul precision: jax_default_matmul_precision="
        f"{jax.config.jax_default_matmul_precision!r}; torch "
        f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
        f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}"
    )


def warm_runtimes(device: str) -> None:
    """Start both runtimes (device contexts, BLAS handles) before any loop is timed."""
    a = torch.ones(64, 64, device=device)
    (a @ a).sum().item()
    b = jnp.ones((64, 64))
    jax.block_until_ready(jax.jit(lambda x: x @ x)(b))


def rel_diff(curve: list[float], reference: list[float]) -> tuple[float, float]:
    """(largest, first-iteration) relative difference of a loss curve from ``reference``."""
    a, b = np.asarray(curve, np.float64), np.asarray(reference, np.float64)
    rel = np.abs(a - b) / np.abs(b)
    return float(rel.max()), float(rel[0])


def report(results: list[dict[str, Any]]) -> None:
    by = {r["loop"]: r for r in results}
    print(
        f"\n{'loop':15s} {'ms/it':>8s} {'pipelined':>9s} {'first ms':>9s} {'setup+first':>11s} "
        f"{'loss[0]':>8s} {'loss[-1]':>8s} {'max rel vs torch':>16s} {'at it 0':>8s}"
    )
    for r in results:
        diff = first = "-"
        if "torch" in by and r["loop"] != "torch":
            d, f = rel_diff(r["losses"], by["torch"]["losses"])
            r["max_rel_diff_vs_torch"], r["first_rel_diff_vs_torch"] = d, f
            diff, first = f"{d:.2e}", f"{f:.1e}"
        print(
            f"{r['label']:15s} {r['ms']:8.2f} {r['pipelined_ms']:9.2f} {r['first_ms']:9.0f} "
            f"{r['setup_first_ms']:11.0f} {r['losses'][0]:8.4f} {r['losses'][-1]:8.4f} "
            f"{diff:>16s} {first:>8s}"
        )
    if "eager" in by:
        print("\nlucid loops vs lucid eager (max rel loss difference):", end="")
        for loop in ("compiled", "fused"):
            if loop in by:
                d, _ = rel_diff(by[loop]["losses"], by["eager"]["losses"])
                print(f"  {LABELS[loop]} {d:.2e}", end="")
        print()
    refs = [ref for ref in ("optax", "torch") if ref in by]
    lucid_loops = [r for r in results if r["loop"] in ("eager", "compiled", "fused")]
    if refs and lucid_loops:
        print("\nratios (lucid time / reference time; < 1 is faster), synced | pipelined:")
        for r in lucid_loops:
            parts = []
            for ref in refs:
                sync_ratio = r["ms"] / by[ref]["ms"]
                pipe_ratio = r["pipelined_ms"] / by[ref]["pipelined_ms"]
                r[f"vs_{ref}"] = {"ms": sync_ratio, "pipelined": pipe_ratio}
                parts.append(f"vs {LABELS[ref]} {sync_ratio:5.2f} | {pipe_ratio:5.2f}")
            print(f"  {r['label']:15s} " + "   ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny model, 5 iterations (CPU)")
    parser.add_argument("--steps", type=int, default=None, help="timed synced iterations (60)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first iterations (5)")
    parser.add_argument(
        "--pipelined", type=int, default=None, help="iterations issued back to back (20)"
    )
    parser.add_argument("--loops", default=",".join(LOOPS), help=f"subset of {','.join(LOOPS)}")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (8192)")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on both sides")
    parser.add_argument("--torch-device", default=None, help="cuda if available, else cpu")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    small = {"steps": 2, "warmup": 1, "pipelined": 1}
    full = {"steps": 60, "warmup": 5, "pipelined": 20}
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    cfg = SMALL if args.small else Config()
    if args.vocab:
        cfg = Config(**(cfg.as_dict() | {"vocab": args.vocab}))
    loops = args.loops.split(",")
    unknown = set(loops) - set(LOOPS)
    if unknown:
        parser.error(f"unknown loops {sorted(unknown)}; choose from {','.join(LOOPS)}")
    if args.torch_device is None:
        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"

    print(hardware())
    print(f"started: {datetime.datetime.now().isoformat(timespec='seconds')}")
    precision = set_precision(args.tf32)
    print(precision)
    # one iteration more than asked: measure_pipelined runs one synced iteration first
    total = args.warmup + args.steps + 1 + args.pipelined
    s = Setup(cfg, total, args.torch_device)
    n_params = sum(w.size for w in s.weights.values())
    print(
        f"model: {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, MLP 4x, "
        f"vocab {cfg.vocab}, context {cfg.context}, batch {cfg.batch}, tied head; "
        f"{n_params / 1e6:.2f}M parameters in {len(s.weights)} tensors"
    )
    print(
        f"iterations per loop: {total} ({args.warmup} warm-up incl. the first, "
        f"{args.steps} timed synced, 1 + {args.pipelined} pipelined); schedule: "
        f"{s.warmup} warm-up steps, cosine to 10% at step {total}; torch on {args.torch_device}, "
        f"jax on {jax.devices()[0].platform}"
    )
    warm_runtimes(args.torch_device)
    results = []
    for loop in loops:
        result = run(s, loop, args)
        results.append(result)
        gc.collect()  # the loop's model and optimizer are garbage now
        if args.torch_device.startswith("cuda"):
            torch.cuda.empty_cache()
        print(
            f"  {result['label']:15s} {result['ms']:8.2f} ms/it, first {result['first_ms']:.0f} "
            f"ms, final loss {result['losses'][-1]:.4f}",
            flush=True,
        )
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "hardware": hardware(),
                    "date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "precision": precision,
                    "config": cfg.as_dict(),
                    "n_params": int(n_params),
                    "n_tensors": len(s.weights),
                    "iterations": vars(args) | {"total": total, "lr_warmup": s.warmup},
                    "results": results,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
