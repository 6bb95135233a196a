"""The first iteration of a ported training loop, cold and with JAX's persistent cache.

    PYTHONPATH=. python benchmarks/bench_first_iteration.py --config gpt27m --repeats 3
    PYTHONPATH=. python benchmarks/bench_first_iteration.py --config small --compiles

A GPT (``benchmarks/gpt_model.py``; ``--config gpt27m``: 8 blocks, width 512,
vocabulary 4096, 27.3M parameters in 100 tensors; ``small``: 2 blocks, width 64)
trained with AdamW (lr 3e-4, betas (0.9, 0.95)) in two groups (weight decay 0.1 on
the >=2-D weights, 0 on the rest), a ``LambdaLR`` (warm-up, then cosine) and
clipping at 1.0, in the loops of ``bench_gpt_loop.py``:

* ``torch``: ``zero_grad``, forward, ``backward``, ``clip_grad_norm_``, ``step``,
  ``sched.step()``;
* ``optax``: ``optax.chain(clip_by_global_norm(1.0), adamw(schedule, mask=...))``
  and ``value_and_grad`` in one ``jax.jit`` (parameters and state donated);
* ``eager``: ``lucid.backward`` + ``lucid.nn.utils.clip_grad_norm_`` +
  ``opt.step()`` + ``sched.step()``;
* ``compiled``: the same after ``compile_optimizer``;
* ``fused``: ``fused_step`` with the clipping transform, then ``sched.step()``.

Every run is a fresh process. A JAX loop runs three times per repeat: without a
cache (``cold``), then twice with ``lucid.enable_compilation_cache`` on one new
directory (``fill``, which writes it, and ``warm``, which loads it). The forms run
interleaved within each repeat, so a machine's load falls on all of them alike;
the table gives medians over the repeats. Per run: ``setup`` (parameters onto the
device, optimizer, scheduler, ``compile_optimizer`` / ``fused_step`` /
``tx.init``: what comes before the first iteration, imports and the host-side
weights excluded), ``1st`` and ``2nd`` (the first two iterations, each waited for
on the device through the buffers the parameters live in, never ``p.data``), and
``setup+1st``.

``--compiles`` logs every compilation (``jax_log_compiles``) and prints, per form
and phase of the loop (setup, backward, clip, step, sched, fused call), each
program's count and its XLA compilation seconds and tracing + lowering seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

_COMMON = r"""
import json, logging, os, re, sys, time
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, ".")
from benchmarks import gpt_model as G
form, cache, config, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
compiles, phase, which = [], ["setup"], [""]
if log:
    jax.config.update("jax_log_compiles", True)
    pattern = re.compile(
        r"Finished (XLA compilation of|tracing(?: \+ transforming)?|jaxpr to MLIR module "
        r"conversion) (\S+)(?: for \w+)? in ([0-9.e-]+) sec"
    )

    class Record(logging.Handler):
        def emit(self, record):
            m = pattern.match(record.getMessage())
            if m:
                kind = "xla" if m.group(1).startswith("XLA") else "trace"
                name = m.group(2)
                name = name if name.startswith(("jit(", "pjit(")) else f"jit({name})"
                name = name.replace("pjit(", "jit(")
                compiles.append([which[0] + phase[0], name, kind, float(m.group(3))])

    logger = logging.getLogger("jax")
    logger.addHandler(Record())
    logger.setLevel(logging.WARNING)
    logger.propagate = False
import lucid
if cache != "-":
    lucid.enable_compilation_cache(cache)
cfg = G.CONFIGS[config]
weights = G.init_weights(cfg)
host_batches = G.make_batches(cfg, 2)
names = G.parameter_names(cfg)
LR, BETAS, WARMUP, TOTAL = 3e-4, (0.9, 0.95), 10, 100
"""

_JAX = (
    _COMMON
    + r"""
import optax
jax.block_until_ready(jnp.zeros(()))  # the backend started, as in any JAX program
t_setup = time.perf_counter()
batches = [jnp.asarray(b) for b in host_batches]
loss_fn = G.make_jax_loss(cfg)
if form == "optax":
    params = {k: jnp.asarray(weights[k]) for k in names}
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(
            lambda count: LR * G.lr_factor_jax(count, WARMUP, TOTAL), b1=BETAS[0], b2=BETAS[1],
            weight_decay=0.1, mask={k: weights[k].ndim >= 2 for k in names},
        ),
    )
    state = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tx.init(params))

    def train_step(params, state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    box = [params, state]

    def iteration(tokens):
        phase[0] = "train_step"
        box[0], box[1], loss = train_step(box[0], box[1], tokens)
        return loss

    def buffers():
        return box
else:
    params = {k: lucid.Parameter(jnp.asarray(weights[k])) for k in names}
    every = [params[k] for k in names]
    groups = [
        {"params": [p for p in every if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for p in every if p.ndim < 2], "weight_decay": 0.0},
    ]
    opt = lucid.optim.AdamW(groups, lr=LR, betas=BETAS)
    sched = lucid.optim.lr_scheduler.LambdaLR(opt, lambda s: G.lr_factor(s, WARMUP, TOTAL))
    if form == "compiled":
        lucid.compile_optimizer(opt)
    if form == "fused":
        fused = lucid.fused_step(loss_fn, opt, lucid.functional.clip_grad_norm(1.0))

        def iteration(tokens):
            phase[0] = "fused call"
            loss = fused(params, tokens)
            phase[0] = "sched"
            sched.step()
            return loss
    else:
        def iteration(tokens):
            opt.zero_grad()
            phase[0] = "backward"
            loss = lucid.backward(loss_fn, params, tokens)
            phase[0] = "clip"
            lucid.nn.utils.clip_grad_norm_(every, 1.0)
            phase[0] = "step"
            opt.step()
            phase[0] = "sched"
            sched.step()
            return loss

    def buffers():
        return list({id(s): s.buffer for s, _ in (p.location for p in every)}.values())
jax.block_until_ready(buffers())
setup = time.perf_counter() - t_setup
times = []
which[0] = "1st: "
for tokens in batches:
    start = time.perf_counter()
    loss = iteration(tokens)
    float(loss)
    jax.block_until_ready(buffers())
    times.append(time.perf_counter() - start)
    which[0] = "2nd: "
print(json.dumps({"setup": setup, "first": times[0], "second": times[1], "loss": float(loss),
                  "compiles": compiles, "device": str(jax.devices()[0].platform)}))
"""
)

_TORCH = r"""
import json, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks import gpt_model as G
torch.set_num_threads(int(sys.argv[1]))
cfg, device = G.CONFIGS[sys.argv[2]], sys.argv[3]
weights = G.init_weights(cfg)
host_batches = G.make_batches(cfg, 2)
t_setup = time.perf_counter()
model = G.make_torch_model(cfg, weights, device)
decay = [p for p in model.parameters() if p.dim() >= 2]
rest = [p for p in model.parameters() if p.dim() < 2]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
cuda = device.startswith("cuda")
kind = {"fused": True} if cuda else {"foreach": True}
opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), **kind)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: G.lr_factor(s, 10, 100))
batches = [torch.from_numpy(b).long().to(device) for b in host_batches]
if cuda:
    torch.cuda.synchronize()
setup = time.perf_counter() - t_setup
times = []
for tokens in batches:
    start = time.perf_counter()
    opt.zero_grad()
    loss = model(tokens)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    loss.item()
    if cuda:
        torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
print(json.dumps({"setup": setup, "first": times[0], "second": times[1], "loss": float(loss),
                  "compiles": []}))
"""


def _run(code: str, *args: str) -> dict:
    result = _run_quiet(code, *args)
    got = ", ".join(f"{k} {result[k]:.2f} s" for k in ("setup", "first", "second"))
    print(f"  {' '.join(args[:2])}: {got}", file=sys.stderr, flush=True)
    return result


def _run_quiet(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", os.environ.get("PYTHONPATH", "")]))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _compile_table(runs: dict[tuple[str, str], list[dict]], forms: list[str]) -> list[str]:
    """Per form and phase, each program's count and seconds in a cold run (the first
    repeat's)."""
    lines = [
        f"{'form':9s} {'phase':16s} {'program':28s} {'count':>5s} {'XLA s':>7s} {'trace s':>8s}"
    ]
    for form in forms:
        events = runs[(form, "cold")][0]["compiles"]
        table: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for phase, name, kind, seconds in events:
            row = table[(phase, name)]
            if kind == "xla":
                row[0] += 1
                row[1] += seconds
            else:
                row[2] += seconds
        total = [0, 0.0, 0.0]
        for (phase, name), (count, xla, trace) in table.items():
            lines.append(f"{form:9s} {phase:16s} {name:28s} {count:5d} {xla:7.2f} {trace:8.2f}")
            total = [total[0] + count, total[1] + xla, total[2] + trace]
        count, xla, trace = total
        lines.append(f"{form:9s} {'all':16s} {'':28s} {count:5d} {xla:7.2f} {trace:8.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="gpt27m", help="small, gpt27m, issue or default")
    parser.add_argument("--forms", default="optax,eager,compiled,fused")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-cache", action="store_true", help="cold runs only")
    parser.add_argument("--compiles", action="store_true", help="log and tabulate compilations")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--torch-device", default="cpu", help="cpu or cuda")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from benchmarks.gpt_model import CONFIGS, parameter_count

    forms = args.forms.split(",")
    log = "1" if args.compiles else "0"
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for _ in range(args.repeats):
        torch_args = (str(args.torch_threads), args.config, args.torch_device)
        runs[("torch", "-")].append(_run(_TORCH, *torch_args))
        for form in forms:
            runs[(form, "cold")].append(_run(_JAX, form, "-", args.config, log))
            if args.no_cache:
                continue
            with tempfile.TemporaryDirectory() as cache:
                runs[(form, "fill")].append(_run(_JAX, form, cache, args.config, log))
                runs[(form, "warm")].append(_run(_JAX, form, cache, args.config, log))
    cfg = CONFIGS[args.config]
    print(f"date: {datetime.date.today()}  config {args.config}: {cfg}, ")
    print(
        f"{parameter_count(cfg) / 1e6:.1f}M parameters; device "
        f"{runs[(forms[0], 'cold')][0]['device']}; medians of {args.repeats} run(s); "
        f"torch on {args.torch_device}, {args.torch_threads} thread(s)"
    )
    ref_torch = _median(runs[("torch", "-")], "first")
    ref_optax = {c: _median(rows, "first") for (f, c), rows in runs.items() if f == "optax"}
    head = f"{'form':9s} {'cache':6s} {'setup s':>8s} {'1st s':>8s} {'2nd s':>8s} "
    print(head + f"{'setup+1st':>10s} {'1st/optax':>10s} {'1st/torch':>10s}")
    for (form, cache), rows in runs.items():
        first = _median(rows, "first")
        setup = _median(rows, "setup")
        vs_optax = first / ref_optax[cache] if cache in ref_optax else float("nan")
        print(
            f"{form:9s} {cache:6s} {setup:8.2f} {first:8.2f} {_median(rows, 'second'):8.2f} "
            f"{statistics.median(r['setup'] + r['first'] for r in rows):10.2f} "
            f"{vs_optax:9.2f}x {first / ref_torch:9.2f}x"
        )
    if args.compiles:
        print()
        print("\n".join(_compile_table(runs, forms)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k[0]}/{k[1]}": v for k, v in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
