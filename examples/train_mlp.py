"""Train a small MLP classifier with lucid's torch-style API and watch the loss fall.

The training loop is a PyTorch loop with two lines changed: parameters are
``lucid.Parameter`` boxes and gradients come from ``lucid.backward``.

    python examples/train_mlp.py
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

import lucid


def two_spirals(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved spirals in the plane, labels 0 and 1."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.uniform(0.25, 1.0, n)) * 3 * np.pi
    sign = rng.choice([-1.0, 1.0], n)
    x = np.stack([sign * t * np.cos(t), sign * t * np.sin(t)], axis=1) / (3 * np.pi)
    x += rng.normal(scale=0.02, size=x.shape)
    return x.astype(np.float32), (sign > 0).astype(np.int32)


def init_mlp(sizes: list[int], key: jax.Array) -> list[dict[str, lucid.Parameter]]:
    layers = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        layers.append({"w": lucid.Parameter(w), "b": lucid.Parameter(jnp.zeros(fan_out))})
    return layers


def cross_entropy(model, x, y):
    h = x
    for layer in model[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    logits = h @ model[-1]["w"] + model[-1]["b"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


def main(epochs: int = 300) -> list[float]:
    x, y = two_spirals(1024)
    model = init_mlp([2, 64, 64, 2], jax.random.PRNGKey(0))
    params = [p for layer in model for p in layer.values()]
    opt = lucid.optim.AdamW(params, lr=1e-2, weight_decay=1e-4)
    sched = lucid.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    history = []
    for epoch in range(epochs):
        opt.zero_grad()
        loss = lucid.backward(cross_entropy, model, x, y)
        opt.step()
        sched.step()
        history.append(float(loss))
        if epoch % 50 == 0 or epoch == epochs - 1:
            print(f"epoch {epoch:4d}  loss {float(loss):.4f}  lr {sched.get_last_lr()[0]:.5f}")
    return history


if __name__ == "__main__":
    losses = main()
    print(f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}")
