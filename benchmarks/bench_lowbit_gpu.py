"""Low-bit optimizer steps on a GPU: the references' own CUDA steps beside lucid's, in one
process, on the same parameter sets (`benchmarks/shapes.py`).

Rows (each the optimizer step alone, gradients set once, float32 parameters):

* references (torch on CUDA, when importable): torch's ``AdamW(fused=True)``;
  bitsandbytes' ``AdamW8bit`` (its CUDA kernel); torchao's ``AdamW8bit``, ``AdamW4bit``
  and ``AdamWFp8`` (its step, which torchao runs through ``torch.compile``);
* lucid's compiled step (``lucid.compile_optimizer``) of ``AdamW`` (float32 state),
  ``bnb.AdamW8bit`` and ``torchao.AdamW8bit``/``AdamW4bit``/``AdamWFp8``.

Each row gives ms per step synchronised (median of ``--repeats`` steps, the device
waited for after each) and pipelined (``--repeats`` steps back to back, one wait at the
end, as a training loop runs), and each lucid row its speed-up over lucid's float32
AdamW (its time over the row's, each way). The references run first and give their memory
back (``torch.cuda.empty_cache``) before jax takes its own share of the GPU (with both
in one process, jax's pool, which does not shrink, left torch too little for GPT-2 XL's
float32 AdamW on an 80 GB H100).

    python benchmarks/bench_lowbit_gpu.py --sets gpt2_small,gpt2_xl
    python benchmarks/bench_lowbit_gpu.py --sets gpt2_xl --references ''   # lucid's only

On jax 0.11 and later, lucid runs its fused kernels on Pallas' deprecated Triton backend
only when ``LUCID_PALLAS_TRITON=1`` is set (`lucid.functional._lowbit.pallas`); the
script says which path ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import shapes
from benchmarks._timing import measure, measure_pipelined

REFERENCES = {
    "torch AdamW fused (float32)": ("torch.optim", "AdamW", {"fused": True}),
    "bitsandbytes AdamW8bit": ("bitsandbytes.optim", "AdamW8bit", {}),
    "torchao AdamW8bit": ("torchao.optim", "AdamW8bit", {}),
    "torchao AdamW4bit": ("torchao.optim", "AdamW4bit", {}),
    "torchao AdamWFp8": ("torchao.optim", "AdamWFp8", {}),
}

LUCID = {
    "lucid AdamW (float32)": ("lucid.optim", "AdamW"),
    "lucid bnb AdamW8bit": ("lucid.optim.bnb", "AdamW8bit"),
    "lucid torchao AdamW8bit": ("lucid.optim.torchao", "AdamW8bit"),
    "lucid torchao AdamW4bit": ("lucid.optim.torchao", "AdamW4bit"),
    "lucid torchao AdamWFp8": ("lucid.optim.torchao", "AdamWFp8"),
}


def _class(module: str, name: str) -> Any:
    import importlib

    return getattr(importlib.import_module(module), name)


def _time(step: Callable[[], Any], sync: Callable[[Any], Any], args: Any) -> dict:
    timing = measure(step, sync, warmup=args.warmup, repeats=args.repeats)
    pipelined = measure_pipelined(step, sync, repeats=args.repeats)
    return {
        "sync_ms": round(timing.median_ms, 3),
        "pipelined_ms": round(pipelined, 3),
        "first_s": round(timing.first_ms / 1e3, 1),
    }


def reference_row(name: str, shape_list: list, args: Any) -> dict:
    """One reference optimizer's step on CUDA (torch)."""
    import torch

    module, cls_name, options = REFERENCES[name]
    cls = _class(module, cls_name)
    torch.manual_seed(0)
    params = [
        torch.nn.Parameter(0.02 * torch.randn(s, device="cuda", dtype=torch.float32))
        for s in shape_list
    ]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = cls(params, lr=1e-4, weight_decay=0.01, **options)

    def sync(_: Any) -> None:
        torch.cuda.synchronize()

    try:
        return _time(opt.step, sync, args)
    finally:
        del opt, params
        gc.collect()
        torch.cuda.empty_cache()


def lucid_row(name: str, shape_list: list, args: Any) -> dict:
    """One lucid optimizer's compiled step (jax)."""
    import jax
    import jax.numpy as jnp

    import lucid
    from benchmarks._timing import jax_sync, parameter_buffers

    cls = _class(*LUCID[name])
    key = jax.random.PRNGKey(0)
    params = [lucid.Parameter(0.02 * jax.random.normal(key, s, jnp.float32)) for s in shape_list]
    compiled = lucid.compile_optimizer(cls(params, lr=1e-4, weight_decay=0.01))
    for p in params:
        p.grad = jnp.full(p.shape, 1e-3, jnp.float32)

    def step() -> Any:
        compiled.step()
        return parameter_buffers(params)

    return _time(step, jax_sync, args)


def _print(name: str, row: dict, base: dict | None) -> None:
    ratio = ""
    if base is not None and "sync_ms" in row:
        row["speedup_sync"] = round(base["sync_ms"] / row["sync_ms"], 3)
        row["speedup_pipelined"] = round(base["pipelined_ms"] / row["pipelined_ms"], 3)
        ratio = f"{row['speedup_sync']:8.2f} {row['speedup_pipelined']:8.2f}"
    if "error" in row:
        print(f"{name:30s} {row['error']}", flush=True)
        return
    print(
        f"{name:30s} {row['sync_ms']:9.3f} {row['pipelined_ms']:9.3f} {ratio}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shapes.add_sets_argument(parser, default="gpt2_small,gpt2_xl")
    parser.add_argument("--references-on", default="gpt2_xl", help="sets to run them on")
    parser.add_argument("--references", default=",".join(REFERENCES), help="which (or none)")
    parser.add_argument("--lucid", default=",".join(LUCID), help="lucid rows to run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    report: dict[str, Any] = {"sets": {}}
    results: dict[str, dict] = {s: {} for s in args.sets}
    references = [n.strip() for n in args.references.split(",") if n.strip()]
    on = [s for s in args.sets if s in args.references_on.split(",")]
    if references and on:
        import torch

        report["torch"] = torch.__version__
        for set_name in on:
            shape_list = shapes.SETS[set_name]()
            for name in references:
                try:
                    row = reference_row(name, shape_list, args)
                except Exception as error:  # a reference missing or failing: say so
                    row = {"error": f"{type(error).__name__}: {error}"[:200]}
                results[set_name][name] = row
                print(f"[{set_name}] {name}: {row}", flush=True)
    import jax  # (after torch has given its memory back: jax takes its share now)

    from lucid.functional._lowbit import pallas as kernel_ops

    report |= {
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "fused_kernels": kernel_ops.triton_backend(),
    }
    print(json.dumps(report), flush=True)
    names = [n.strip() for n in args.lucid.split(",") if n.strip()]
    if "lucid AdamW (float32)" not in names:
        names.insert(0, "lucid AdamW (float32)")
    for set_name in args.sets:
        shape_list = shapes.SETS[set_name]()
        rows = results[set_name]
        for name in names:
            try:
                rows[name] = lucid_row(name, shape_list, args)
            except Exception as error:  # say so, and go on with the next row
                rows[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
            gc.collect()
            print(f"[{set_name}] {name}: {rows[name]}", flush=True)
    for set_name in args.sets:
        rows = results[set_name]
        base = rows["lucid AdamW (float32)"]
        base = base if "sync_ms" in base else None
        print(f"\n{set_name}: {shapes.numel(shapes.SETS[set_name]()):,} params")
        print(f"{'step':30s} {'sync ms':>9s} {'pipe ms':>9s} {'x sync':>8s} {'x pipe':>8s}")
        for name, row in rows.items():
            _print(name, row, base if name.startswith("lucid") else None)
        report["sets"][set_name] = rows
    print(json.dumps(report))


if __name__ == "__main__":
    main()
