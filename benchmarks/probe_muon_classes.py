"""Where compiled Muon's Newton-Schulz time goes: each shape class of a parameter set
alone (its matrices stacked, the iteration `jax.vmap`-ed as the batched rule runs it),
with its FLOP rate, and the three products of one iteration of the widest class. Needs
a GPU for meaningful rates::

    PYTHONPATH=. python benchmarks/probe_muon_classes.py [--set gpt2_small]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import jax.numpy as jnp
import numpy as np
from _timing import jax_sync, measure
from bench_muon_batched import matrices_of, ns_flops

from lucid.functional.muon import orthogonalize

COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def median_ms(f, *args, repeats: int = 20) -> float:
    """Median ms of ``f(*args)`` after one warm-up call (`_timing.measure`)."""
    return measure(lambda: f(*args), jax_sync, warmup=1, repeats=repeats).median_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="gpt2_small")
    args = parser.parse_args()
    classes = collections.Counter(matrices_of(args.set))
    ns = jax.jit(jax.vmap(lambda u: orthogonalize(u, COEFFICIENTS, 5, 1e-7)))
    print(f"{jax.devices()[0]}, jax {jax.__version__}, {args.set}: ms, TFLOP/s per class")
    total_ms = total_flops = 0.0
    for (rows, cols), count in sorted(classes.items(), key=lambda kv: -kv[1] * np.prod(kv[0])):
        u = jax.random.normal(jax.random.PRNGKey(0), (count, rows, cols), jnp.float32)
        ms = median_ms(ns, u)
        flops = ns_flops([(rows, cols)] * count)
        total_ms, total_flops = total_ms + ms, total_flops + flops
        print(f"  {count:3d} x {rows:5d} x {cols:5d}  {ms:8.3f} ms  {flops / ms / 1e9:7.1f}")
    print(
        f"  all classes, one after another: {total_ms:.3f} ms, {total_flops / total_ms / 1e9:.1f}"
    )
    (rows, cols), count = max(classes.items(), key=lambda kv: max(kv[0]))
    m, n = min(rows, cols), max(rows, cols)
    x = jax.random.normal(jax.random.PRNGKey(1), (count, m, n), jnp.bfloat16)
    g = jax.random.normal(jax.random.PRNGKey(2), (count, m, m), jnp.bfloat16)
    f32 = jnp.float32
    products = {
        "gram X X^T": (lambda x, g: jnp.matmul(x, x.mT, preferred_element_type=f32), 2 * m * m * n),
        "square G G": (lambda x, g: jnp.matmul(g, g, preferred_element_type=f32), 2 * m**3),
        "update G X": (lambda x, g: jnp.matmul(g, x, preferred_element_type=f32), 2 * m * m * n),
    }
    print(f"  one iteration's products, {count} x {m} x {n} (bf16, float32 accumulation):")
    for name, (f, flops) in products.items():
        ms = median_ms(jax.jit(f), x, g)
        print(f"    {name}  {ms:8.3f} ms  {count * flops / ms / 1e9:7.1f}")


if __name__ == "__main__":
    main()
