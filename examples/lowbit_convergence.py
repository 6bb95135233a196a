"""Train one small MLP with 32-bit AdamW and torchao's 8-bit, 4-bit and fp8 AdamW; plot the losses.

    python examples/lowbit_convergence.py [output.png]

(default output: docs/assets/lowbit_convergence.png).

The task is a teacher-student regression: a random two-layer tanh network (the
teacher) labels 512 Gaussian inputs of 64 features, and a student of the same
shape (64 -> 128 -> 32, weights of 8192 and 4096 elements, so both are
quantized) fits them by full-batch steps. Every optimizer starts from the same
student and sees its own gradients; ``lucid.functional.adamw`` is the float32
reference. The test suite runs `train` too (tests/test_torchao.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lucid.functional as LF
import lucid.functional.torchao as LT

OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "32-bit AdamW": LF.adamw,
    "8-bit AdamW": LT.adamw8bit,
    "fp8 AdamW": LT.adamw_fp8,
    "4-bit AdamW": LT.adamw4bit,
}
LR = 3e-3


def problem(seed: int = 0) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    """The student's initial parameters and the data ``(x, y)``."""
    rng = np.random.default_rng(seed)

    def layer(n_in: int, n_out: int) -> dict[str, np.ndarray]:
        return {
            "w": rng.normal(size=(n_in, n_out)) / np.sqrt(n_in),
            "b": rng.normal(size=(n_out,)) * 0.1,
        }

    teacher = [layer(64, 128), layer(128, 32)]
    student = {"l1": layer(64, 128), "l2": layer(128, 32)}
    x = rng.normal(size=(512, 64))
    hidden = np.tanh(x @ teacher[0]["w"] + teacher[0]["b"])
    y = hidden @ teacher[1]["w"] + teacher[1]["b"]
    as32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return jax.tree.map(as32, student), as32(x), as32(y)


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error of the student."""
    hidden = jnp.tanh(x @ params["l1"]["w"] + params["l1"]["b"])
    return jnp.mean((hidden @ params["l2"]["w"] + params["l2"]["b"] - y) ** 2)


def train(name: str, steps: int = 300, lr: float = LR) -> np.ndarray:
    """The loss before each of ``steps`` updates and after the last (``steps + 1`` values).

    Args:
      name: a key of `OPTIMIZERS`.
      steps: the number of updates.
      lr: the learning rate (weight decay 1e-2, AdamW's default).

    Returns:
      The losses, float64.
    """
    params, x, y = problem()
    tx = OPTIMIZERS[name](lr=lr)

    def one(carry: tuple, _: None) -> tuple[tuple, jax.Array]:
        params, state = carry
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), value

    (params, _), losses = jax.jit(lambda c: jax.lax.scan(one, c, None, length=steps))(
        (params, tx.init(params))
    )
    return np.append(np.asarray(losses, np.float64), float(loss(params, x, y)))


def main() -> None:
    """Train with each optimizer and save the plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "output", nargs="?", type=Path, default=Path("docs/assets/lowbit_convergence.png")
    )
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in OPTIMIZERS:
        losses = train(name)
        ax.plot(losses, label=f"{name} (final {losses[-1]:.4f})", lw=2 if "32" in name else 1.2)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MSE)")
    ax.set_title("Teacher-student MLP, full batch, lr 3e-3: torchao's low-bit AdamW in lucid")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
