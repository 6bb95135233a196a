"""Check lucid on your machine's default JAX device (an Apple GPU, on a Mac with
``lucid[metal]`` or ``lucid[mps]`` installed): print the platform, run every
optimizer's compiled step once in float32 there, and compare with the CPU.

    python examples/check_apple_gpu.py

Exits non-zero if a step fails or differs from the CPU by more than float32
rounding. See docs/backends.md for what is and is not expected to work.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

import lucid

OPTIMIZERS = {
    "SGD": {"lr": 0.05, "momentum": 0.9},
    "Adam": {"lr": 0.01, "amsgrad": True},
    "AdamW": {"lr": 0.01},
    "RMSprop": {"lr": 0.01, "centered": True},
    "Adagrad": {"lr": 0.1},
    "Adadelta": {"lr": 1.0},
    "Adamax": {"lr": 0.01},
    "RAdam": {"lr": 0.01},
    "NAdam": {"lr": 0.01},
    "ASGD": {"lr": 0.05},
    "Rprop": {"lr": 0.01},
    "SparseAdam": {"lr": 0.01},
    "LBFGS": {"lr": 0.1},
}


def loss_fn(params, x, y):
    w, b = params
    return jnp.mean((jnp.tanh(x @ w + b) - y) ** 2)


def one_step(name: str, device: jax.Device) -> list[np.ndarray]:
    """Two compiled steps of ``name`` on ``device`` (the second one updates the state)."""
    rng = np.random.default_rng(0)
    w0, b0 = rng.normal(size=(5, 3)), rng.normal(size=(3,))
    x, y = rng.normal(size=(16, 5)), rng.normal(size=(16, 3))

    def put(a):
        return jax.device_put(jnp.asarray(np.asarray(a, np.float32)), device)

    params = [lucid.Parameter(put(w0)), lucid.Parameter(put(b0))]
    opt = lucid.compile_optimizer(getattr(lucid.optim, name)(params, **OPTIMIZERS[name]))
    for _ in range(2):
        opt.zero_grad()
        lucid.backward(loss_fn, params, put(x), put(y))
        opt.step()
    return [np.asarray(p.data) for p in params]


def main() -> int:
    device = jax.devices()[0]
    cpu = jax.devices("cpu")[0]
    print(f"jax {jax.__version__}, default device: {device} (platform {device.platform!r})")
    if device.platform == "cpu":
        print("no accelerator found: the comparison below is CPU against CPU")
    failed = 0
    for name in OPTIMIZERS:
        try:
            here, there = one_step(name, device), one_step(name, cpu)
        except Exception as error:  # report every optimizer, then fail
            print(f"FAIL {name:10s} {type(error).__name__}: {str(error).splitlines()[0][:120]}")
            failed += 1
            continue
        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(here, there))
        ok = all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(here, there))
        print(f"{'ok  ' if ok else 'FAIL'} {name:10s} max |device - cpu| = {worst:.2e}")
        failed += not ok
    print("all optimizers agree with the CPU" if not failed else f"{failed} optimizer(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
