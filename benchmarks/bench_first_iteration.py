"""The first iteration of a ported training loop, cold and with JAX's persistent cache.

    PYTHONPATH=. python benchmarks/bench_first_iteration.py

A small GPT (``benchmarks/gpt_model.py``'s ``SMALL``: 2 blocks, d_model 64, 26
tensors) trained with AdamW in two weight-decay groups and torch's clipping, in
three forms: ``eager`` (``lucid.backward`` + ``clip_grad_norm_`` + ``opt.step()``),
``compiled`` (the same after ``compile_optimizer``) and ``fused`` (``fused_step``
with the clipping transform). Each form runs in fresh processes: without a
cache, then twice with ``lucid.enable_compilation_cache`` on one new directory
(the first run fills it, the second loads it). It prints the seconds of the
first and of the second iteration (process start and imports excluded), and
torch's first iteration of the same model for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import lucid
sys.path.insert(0, ".")
from benchmarks import gpt_model as G
form, cache = sys.argv[1], sys.argv[2]
if cache != "-":
    lucid.enable_compilation_cache(cache)
cfg = G.SMALL
weights = G.init_weights(cfg)
batches = [jnp.asarray(b) for b in G.make_batches(cfg, 2)]
loss_fn = G.make_jax_loss(cfg)
params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in weights.items()}
decay = [p for k, p in params.items() if k.endswith(".weight") and p.ndim == 2]
rest = [p for p in params.values() if all(p is not q for q in decay)]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
opt = lucid.optim.AdamW(groups, lr=1e-3)
if form == "compiled":
    lucid.compile_optimizer(opt)
fused = None
if form == "fused":
    fused = lucid.fused_step(loss_fn, opt, lucid.functional.clip_grad_norm(max_norm=1.0))
times = []
for tokens in batches:
    start = time.perf_counter()
    if fused is not None:
        loss = fused(params, tokens)
    else:
        opt.zero_grad()
        loss = lucid.backward(loss_fn, params, tokens)
        lucid.nn.utils.clip_grad_norm_(opt.parameters(), 1.0)
        opt.step()
    jax.block_until_ready([p.data for p in params.values()])
    times.append(time.perf_counter() - start)
print(json.dumps({"first": times[0], "second": times[1], "loss": float(loss)}))
"""

_TORCH = r"""
import json, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks import gpt_model as G
torch.set_num_threads(1)
cfg = G.SMALL
model = G.make_torch_model(cfg, G.init_weights(cfg), "cpu")
decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and p.ndim == 2]
ids = {id(p) for p in decay}
rest = [p for p in model.parameters() if id(p) not in ids]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=1e-3)
times = []
for tokens in G.make_batches(cfg, 2):
    start = time.perf_counter()
    opt.zero_grad()
    loss = model(torch.as_tensor(tokens, dtype=torch.long))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - start)
print(json.dumps({"first": times[0], "second": times[1], "loss": float(loss)}))
"""


def _run(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([".", os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", default="eager,compiled,fused")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    theirs = _run(_TORCH)
    rows.append(("torch", "-", theirs))
    for form in args.forms.split(","):
        rows.append((form, "no cache", _run(_CHILD, form, "-")))
        with tempfile.TemporaryDirectory() as cache:
            rows.append((form, "cache, cold", _run(_CHILD, form, cache)))
            rows.append((form, "cache, warm", _run(_CHILD, form, cache)))
    print(f"{'form':10s}{'cache':14s}{'1st iter s':>12s}{'2nd iter s':>12s}{'vs torch 1st':>14s}")
    for form, cache, r in rows:
        ratio = r["first"] / theirs["first"]
        print(f"{form:10s}{cache:14s}{r['first']:12.3f}{r['second']:12.4f}{ratio:13.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"form": f, "cache": c, **r} for f, c, r in rows], f, indent=1)


if __name__ == "__main__":
    main()
