"""Start-up of the compiled step: how long from ``compile_optimizer(opt)`` to the end of
the first compiled step, and where the time goes.

    PYTHONPATH=. python benchmarks/bench_startup.py --sets gpt2_small,gpt2_xl,many_small

For each parameter set (float32, Adam), in a fresh optimizer: ``layout`` is
``compile_optimizer`` (flat buffers built, parameters moved into them),
``grads`` assigning every ``p.grad`` by hand (a loop that uses ``lucid.backward``
accumulates into the flat buffer in one call instead), ``first step`` the first
``opt.step()`` (the XLA compilation of the step), ``second step`` a steady one.
Each set runs in its own process, so no compilation cache carries over.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

_CHILD = """
import sys, time, json
t0 = time.perf_counter()
import jax, jax.numpy as jnp
import lucid
sys.path.insert(0, "benchmarks")
import shapes
t_import = time.perf_counter() - t0
S = shapes.SETS[sys.argv[1]]()
params = [lucid.Parameter(jnp.zeros(s, jnp.float32)) for s in S]
grads = [jnp.full(s, 1e-3, jnp.float32) for s in S]
jax.block_until_ready(grads)
sync = lambda: jax.block_until_ready(params[0].location[0].buffer)
opt = lucid.optim.Adam(params, lr=1e-3)
t1 = time.perf_counter()
lucid.compile_optimizer(opt)
sync()
t2 = time.perf_counter()
for p, g in zip(params, grads):
    p.grad = g
sync()
t3 = time.perf_counter()
opt.step()
sync()
t4 = time.perf_counter()
opt.step()
sync()
t5 = time.perf_counter()
print(json.dumps({"set": sys.argv[1], "tensors": len(S), "import_s": t_import,
                  "layout_s": t2 - t1, "grads_s": t3 - t2, "first_step_s": t4 - t3,
                  "second_step_ms": 1e3 * (t5 - t4), "to_first_step_s": t4 - t1,
                  "device": str(jax.devices()[0])}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="gpt2_small,gpt2_xl,many_small")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    print(f"date: {time.strftime('%Y-%m-%d')}")
    header = f"{'set':11s} {'tensors':>7s} {'layout s':>9s} {'grads s':>8s} {'1st step s':>10s}"
    print(header + f" {'2nd ms':>8s} {'compile_optimizer -> 1st step done, s':>38s}")
    for name in args.sets.split(","):
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, name], capture_output=True, text=True, check=True
        ).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{name:11s} {row['tensors']:7d} {row['layout_s']:9.3f} {row['grads_s']:8.3f} "
            f"{row['first_step_s']:10.3f} {row['second_step_ms']:8.2f} "
            f"{row['to_first_step_s']:38.3f}",
            flush=True,
        )
    print(f"device: {rows[0]['device'] if rows else '?'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
