"""Parameter sets for the benchmarks, as lists of shapes (one shape per tensor).

* ``gpt2_small``: GPT-2 small (124M) in Hugging Face's layout -- 148 tensors,
  124,439,808 floats.
* ``gpt2_xl``: GPT-2 XL (1.5B) -- 580 tensors, 1,557,611,200 floats (float32
  Adam needs ~25 GB for params, grads and two moments).
* ``one_tensor``: one flat tensor of 256 Mi floats (pure bandwidth, no
  per-tensor overhead).
* ``many_small``: 2000 tensors of 4096 floats (per-tensor overhead dominates).

``python benchmarks/shapes.py`` prints every set's tensor count and size.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

Shape = tuple[int, ...]


def gpt2(*, d_model: int, n_layer: int, vocab: int = 50257, n_ctx: int = 1024) -> list[Shape]:
    """GPT-2's parameters in Hugging Face's order; ``Conv1D`` weights are ``(in, out)``."""
    block = [
        (d_model,),  # ln_1.weight
        (d_model,),  # ln_1.bias
        (d_model, 3 * d_model),  # attn.c_attn.weight
        (3 * d_model,),  # attn.c_attn.bias
        (d_model, d_model),  # attn.c_proj.weight
        (d_model,),  # attn.c_proj.bias
        (d_model,),  # ln_2.weight
        (d_model,),  # ln_2.bias
        (d_model, 4 * d_model),  # mlp.c_fc.weight
        (4 * d_model,),  # mlp.c_fc.bias
        (4 * d_model, d_model),  # mlp.c_proj.weight
        (d_model,),  # mlp.c_proj.bias
    ]
    embeddings = [(vocab, d_model), (n_ctx, d_model)]  # wte, wpe
    final_norm = [(d_model,), (d_model,)]  # ln_f.weight, ln_f.bias
    return embeddings + block * n_layer + final_norm


def gpt2_small() -> list[Shape]:
    """GPT-2 small: d_model 768, 12 blocks."""
    return gpt2(d_model=768, n_layer=12)


def gpt2_xl() -> list[Shape]:
    """GPT-2 XL: d_model 1600, 48 blocks."""
    return gpt2(d_model=1600, n_layer=48)


def one_tensor(n: int = 256 * 2**20) -> list[Shape]:
    """A single flat tensor of ``n`` floats."""
    return [(n,)]


def many_small(n: int = 2000, size: int = 4096) -> list[Shape]:
    """``n`` flat tensors of ``size`` floats each."""
    return [(size,)] * n


SETS: dict[str, Callable[[], list[Shape]]] = {
    "gpt2_small": gpt2_small,
    "gpt2_xl": gpt2_xl,
    "one_tensor": one_tensor,
    "many_small": many_small,
}


def numel(shapes: list[Shape]) -> int:
    """Total number of elements over all shapes."""
    return sum(math.prod(s) for s in shapes)


def parse_sets(text: str) -> list[str]:
    """``"gpt2_small,many_small"`` -> ``["gpt2_small", "many_small"]``; an argparse ``type``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown parameter set(s) {unknown}; choose from {', '.join(SETS)}"
        )
    return names


def add_sets_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """Add ``--sets NAME[,NAME...]`` (parsed by :func:`parse_sets`) to ``parser``."""
    parser.add_argument(
        "--sets",
        type=parse_sets,
        default=parse_sets(default),
        help=f"comma-separated parameter sets from: {', '.join(SETS)} (default: {default})",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sets_argument(parser, default=",".join(SETS))
    for name in parser.parse_args().sets:
        shapes = SETS[name]()
        print(f"{name:12s} {len(shapes):5d} tensors  {numel(shapes):>15,d} floats")


if __name__ == "__main__":
    main()
