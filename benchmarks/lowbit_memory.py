"""Bytes of state per parameter and step time: lucid's torchao optimizers, from the arrays.

    python benchmarks/lowbit_memory.py [--rows 4096] [--cols 1024]

For one float32 parameter of ``rows x cols`` elements, each optimizer takes one
compiled step and the state it then holds is summed over its arrays
(``state_bytes_per_device``: codes, scales and the 4-byte step). With torchao
installed (and ``TORCHDYNAMO_DISABLE=1``), torchao's own state after one step is
measured the same way (codes, scales and the code map each of its state tensors
carries). The step time is the median of ``--repeats`` compiled steps after one
warm-up step (the first compiles). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import jax
import jax.numpy as jnp

import lucid

CASES = [
    ("AdamW", {}, lucid.optim.AdamW),
    ("AdamW8bit", {}, lucid.optim.torchao.AdamW8bit),
    ("AdamWFp8", {}, lucid.optim.torchao.AdamWFp8),
    ("AdamW4bit", {}, lucid.optim.torchao.AdamW4bit),
    ("AdamW4bit", {"block_size": 256}, lucid.optim.torchao.AdamW4bit),
]


def lucid_bytes(cls: type, options: dict, shape: tuple[int, int], repeats: int) -> tuple:
    """State bytes per parameter after one compiled step, and the median step time (ms)."""
    w = lucid.Parameter(jnp.zeros(shape, jnp.float32))
    compiled = lucid.compile_optimizer(cls([w], **options))
    w.grad = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
    compiled.step()
    jax.block_until_ready(w.data)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled.step()
        jax.block_until_ready(w.data)
        times.append(1e3 * (time.perf_counter() - start))
    size = shape[0] * shape[1]
    return sum(compiled.state_bytes_per_device().values()) / size, statistics.median(times)


def torchao_bytes(name: str, options: dict, shape: tuple[int, int]) -> float | None:
    """torchao's state bytes per parameter after one step (None without torchao)."""
    try:
        import torch
        import torchao.optim as ao
    except ImportError:
        return None
    cls = getattr(ao, name, None) or getattr(torch.optim, name)
    w = torch.nn.Parameter(torch.zeros(shape))
    opt = cls([w], **options)
    w.grad = torch.ones(shape)
    opt.step()
    total = 0
    for value in opt.state[w].values():
        parts = [getattr(value, a) for a in ("codes", "scale", "qmap") if hasattr(value, a)]
        for tensor in parts or [value]:
            total += tensor.numel() * tensor.element_size()
    return total / w.numel()


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shape = (args.rows, args.cols)
    print(f"one float32 parameter of {shape[0]} x {shape[1]} elements, {jax.devices()[0]}\n")
    print("| optimizer | block | lucid B/param | torchao B/param | lucid step (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for name, options, cls in CASES:
        mine, ms = lucid_bytes(cls, options, shape, args.repeats)
        theirs = torchao_bytes(name, options, shape)
        block = (
            options.get("block_size")
            or {
                "AdamW": "-",
                "AdamW8bit": 256,
                "AdamWFp8": 256,
                "AdamW4bit": 128,
            }[name]
        )
        shown = "-" if theirs is None else f"{theirs:.4f}"
        print(f"| {name} | {block} | {mine:.4f} | {shown} | {ms:.1f} |")


if __name__ == "__main__":
    main()
