"""Draw Schedule-Free's three sequences on a small noisy problem, into one PNG.

    python examples/schedulefree_sequences.py [output.png]   # default: docs/assets/schedulefree.png

Schedule-Free SGD (``lucid.optim.schedulefree.SGDScheduleFree``) runs on an
ill-conditioned 2-D quadratic with noisy gradients. After every step the script
reads the three sequences: y, what the parameters hold in train mode (where the
gradient is taken); z, the plain SGD iterate (the optimizer's state); and x, the
average the parameters hold after ``opt.eval()``. The left panel draws the
paths, the right one the loss at x and at y: x, the weights to evaluate, is the
smooth one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import lucid

SCALES = jnp.array([1.0, 12.0])
STEPS = 300


def loss(w: jax.Array) -> jax.Array:
    """An ill-conditioned quadratic with its minimum at the origin."""
    return 0.5 * jnp.sum(SCALES * w**2)


def run(steps: int = STEPS, seed: int = 0) -> dict[str, np.ndarray]:
    """The three sequences and the losses at x and y after each step."""
    w = lucid.Parameter(jnp.array([-2.0, 1.2]))
    opt = lucid.optim.schedulefree.SGDScheduleFree([w], lr=0.08, momentum=0.9, warmup_steps=10)
    key = jax.random.PRNGKey(seed)
    ys, zs, xs = [np.asarray(w.data)], [np.asarray(w.data)], [np.asarray(w.data)]
    opt.train()
    for _ in range(steps):
        key, sub = jax.random.split(key)
        lucid.backward(loss, w)
        w.grad = w.grad + 2.0 * jax.random.normal(sub, (2,))  # a noisy gradient
        opt.step()
        opt.zero_grad()
        ys.append(np.asarray(w.data))
        zs.append(np.asarray(opt.state[w]["z"]))
        opt.eval()  # the parameters now hold x
        xs.append(np.asarray(w.data))
        opt.train()  # and y again
    paths = {"y": np.stack(ys), "z": np.stack(zs), "x": np.stack(xs)}
    for name in ("x", "y", "z"):
        paths[f"loss_{name}"] = np.asarray(jax.vmap(loss)(jnp.asarray(paths[name])))
    return paths


def draw(paths: dict[str, np.ndarray], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    grid = np.linspace(-2.3, 2.3, 200)
    gx, gy = np.meshgrid(grid, np.linspace(-1.6, 1.6, 200))
    left.contour(gx, gy, 0.5 * (gx**2 + 12 * gy**2), levels=12, colors="0.85", linewidths=0.8)
    styles = {
        "z": ("tab:orange", "z: the SGD iterate (state['z'])", 0.8),
        "x": ("tab:green", "x: the parameters after eval()", 2.5),
        "y": ("tab:blue", "y: the parameters in train mode", 1.0),
    }
    for name, (color, label, width) in styles.items():
        left.plot(*paths[name].T, color=color, lw=width, label=label, alpha=0.8)
    left.plot(0, 0, "k*", ms=10)
    left.set_title("SGDScheduleFree on a noisy quadratic")
    left.legend(loc="upper right", fontsize=8)
    left.set_aspect("equal")
    steps = np.arange(len(paths["loss_x"]))
    right.semilogy(steps, paths["loss_z"], color="tab:orange", lw=0.8, label="loss at z")
    right.semilogy(steps, paths["loss_y"], color="tab:blue", lw=1, label="loss at y (train mode)")
    right.semilogy(steps, paths["loss_x"], color="tab:green", lw=2, label="loss at x (eval mode)")
    right.set_xlabel("step")
    right.set_title("evaluate at x: train() / eval() switch the parameters")
    right.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "docs" / "assets" / "schedulefree.png"
    parser.add_argument("output", nargs="?", type=Path, default=default)
    args = parser.parse_args()
    draw(run(), args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
