"""The compiled step of every low-bit Adam against lucid's float32 AdamW, side by side.

For each variant (lucid's float32 AdamW, bitsandbytes' Adam8bit and AdamW8bit, torchao's
AdamW8bit, AdamW4bit and AdamWFp8) and each parameter set of ``--sets``
(`benchmarks/shapes.py`, plus ``one_4096``: one 4096x4096 weight, and ``small_gpt``: a
GPT-2 of width 256, 4 blocks and a 8192-token vocabulary), it prints:

* ``ms``: the median compiled step (``lucid.compile_optimizer``) and ``ratio``, float32
  AdamW's time over this one's (above 1: faster than float32 Adam);
* ``bytes/param``: the bytes XLA's cost analysis counts for the update of each tensor
  (each distinct shape compiled on its own as one jitted update, hyper-parameters as
  arguments as the compiled step passes them), over the parameter count (on the CPU a
  state of whole blocks is updated by a loop over chunks, `in_chunks` of
  `lucid.functional._lowbit.chunks`, whose body the cost analysis counts once: there this is
  one chunk's bytes, not the step's);
* ``floor``: the bytes each parameter must move in one pass (float32 parameters: read
  p and g, write p, 12 bytes; and read and write each moment: float32 4 + 4, 8-bit
  codes 1 + 1, 4-bit 0.5 + 0.5; the per-block scales, read and written, 8 bytes per
  block), tensors too small for low-bit state counted as float32 Adam;
* ``two_pass``: the floor of an XLA program, which needs one pass more over a quantized
  tensor to find the blocks' new scales before it can write the codes (the codes and
  the gradient read twice);
* ``fusions``: the kernels XLA's optimized HLO launches for one tensor of the set's
  largest shape.

It needs only jax, numpy and lucid (no torch, bitsandbytes or torchao), so it runs on
any JAX device::

    python benchmarks/bench_lowbit_step.py                      # CPU, under ~2 minutes
    python benchmarks/bench_lowbit_step.py --sets gpt2_small,gpt2_xl --repeats 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp

import lucid
import lucid.optim.bnb
import lucid.optim.torchao
from benchmarks import bench_bnb, shapes
from lucid.functional import _apply

shapes.SETS.setdefault("one_4096", lambda: [(4096, 4096)])
shapes.SETS.setdefault("small_gpt", lambda: shapes.gpt2(d_model=256, n_layer=4, vocab=8192))

# name: (class, bytes of one moment's codes per element (None: float32 state),
#        elements per scale, smallest tensor with low-bit state, is low-bit for size n)
VARIANTS = {
    "AdamW float32": (lucid.optim.AdamW, None, 0),
    "bnb Adam8bit": (lucid.optim.bnb.Adam8bit, 1.0, 256),
    "bnb AdamW8bit": (lucid.optim.bnb.AdamW8bit, 1.0, 256),
    "torchao AdamW8bit": (lucid.optim.torchao.AdamW8bit, 1.0, 256),
    "torchao AdamW4bit": (lucid.optim.torchao.AdamW4bit, 0.5, 128),
    "torchao AdamWFp8": (lucid.optim.torchao.AdamWFp8, 1.0, 256),
}


def low_bit(name: str, size: int, block: int) -> bool:
    """Whether a tensor of ``size`` elements gets low-bit state (the references' rules)."""
    if VARIANTS[name][1] is None:
        return False
    if name.startswith("bnb"):
        return size >= 4096
    return size >= 4096 and size % block == 0


def floors(name: str, shape_list: list) -> tuple[float, float]:
    """Bytes per parameter of one pass and of two passes (see the module docstring)."""
    _, code_bytes, block = VARIANTS[name]
    one = two = 0.0
    for shape in shape_list:
        n = math.prod(shape)
        if low_bit(name, n, block):
            moments = 2 * (2 * code_bytes) + 2 * 8 * math.ceil(n / block) / n
            one += n * (12 + moments)
            two += n * (12 + moments + 2 * code_bytes + 4)
        else:
            one += n * 28
            two += n * 28
    total = shapes.numel(shape_list)
    return one / total, two / total


def _leaf_program(cls, shape):
    """The jitted update of one tensor, as the compiled step runs it: ``(compiled, n)``."""
    param = lucid.Parameter(jnp.zeros(shape, jnp.float32))
    opt = cls([param], lr=1e-3)
    rule, options = opt.rule, opt.param_groups[0]
    hyper, flags = rule.split(options)
    hyper = {k: jnp.asarray(v, jnp.float32) for k, v in _apply.pack(rule, hyper).items()}
    p = jnp.full(shape, 0.02, jnp.float32)
    state = _apply.init_leaf(rule, flags, hyper, p)

    def update(h, p, g, s):
        return _apply.apply_leaf(rule, flags, h, p, g, s)

    return jax.jit(update, donate_argnums=(1, 3)).lower(hyper, p, p, state).compile()


def cost(cls, shape_list: list, dump: str | None = None) -> tuple[float, int]:
    """XLA's bytes accessed per parameter over the set, and the fusions of the largest
    (whose optimized HLO is written to the file ``dump``, if given)."""
    counts: dict[tuple, int] = {}
    for shape in shape_list:
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
    total_bytes = 0.0
    largest = max(counts, key=math.prod)
    fusions = 0
    for shape, count in counts.items():
        compiled = _leaf_program(cls, shape)
        analysis = compiled.cost_analysis()
        if isinstance(analysis, list | tuple):
            analysis = analysis[0]
        total_bytes += count * float(analysis.get("bytes accessed", 0.0))
        if shape == largest:
            text = compiled.as_text()
            fusions = len(re.findall(r"=\s*\S+\s+fusion\(", text))
            if dump:
                with open(dump, "w") as file:
                    file.write(text)
    return total_bytes / shapes.numel(shape_list), fusions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shapes.add_sets_argument(parser, default="one_4096,small_gpt")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-cost", action="store_true", help="skip XLA's cost analysis")
    parser.add_argument("--dump", help="a folder for the optimized HLO of each variant's update")
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if "AdamW float32" not in names:
        names.insert(0, "AdamW float32")
    report = {"device": str(jax.devices()[0]), "jax": jax.__version__, "sets": {}}
    for set_name in args.sets:
        shape_list = shapes.SETS[set_name]()
        rows = {}
        for name in names:
            cls = VARIANTS[name][0]
            row = {"ms": round(bench_bnb.run(cls, shape_list, args)[0].median_ms, 3)}
            one, two = floors(name, shape_list)
            if not args.no_cost:
                dump = None
                if args.dump:
                    os.makedirs(args.dump, exist_ok=True)
                    slug = re.sub(r"\W+", "_", f"{set_name}_{name}")
                    dump = os.path.join(args.dump, f"{slug}.hlo")
                per_param, fusions = cost(cls, shape_list, dump)
                row["bytes/param"] = round(per_param, 2)
                row["fusions"] = fusions
            row["floor"] = round(one, 2)
            row["two_pass"] = round(two, 2)
            rows[name] = row
        base = rows["AdamW float32"]["ms"]
        for row in rows.values():
            row["ratio"] = round(base / row["ms"], 3)
        report["sets"][set_name] = {
            "tensors": len(shape_list),
            "params": shapes.numel(shape_list),
            "rows": rows,
        }
        print(f"\n{set_name}: {len(shape_list)} tensors, {shapes.numel(shape_list):,} params")
        print(
            f"{'variant':20s} {'ms':>9s} {'ratio':>6s} {'B/param':>8s} {'floor':>6s} "
            f"{'2-pass':>6s} {'fusions':>7s}"
        )
        for name, row in rows.items():
            print(
                f"{name:20s} {row['ms']:9.3f} {row['ratio']:6.2f} "
                f"{row.get('bytes/param', float('nan')):8.2f} {row['floor']:6.2f} "
                f"{row['two_pass']:6.2f} {row.get('fusions', -1):7d}",
                flush=True,
            )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
