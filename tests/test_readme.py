"""The README's porting example runs, and gives torch's numbers for torch's loop."""

from __future__ import annotations

import pathlib

import numpy as np
import torch
from _markdown import fenced_blocks, python_blocks

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _block_with(text: str) -> str:
    """The README's one Python block containing ``text`` (by content, not position)."""
    found = [b.source for b in python_blocks(README.read_text()) if text in b.source]
    assert len(found) == 1, f"{len(found)} README python blocks contain {text!r}"
    return found[0]


def _first_bash(path: pathlib.Path) -> str:
    return next(b.source for b in fenced_blocks(path.read_text()) if b.language == "bash")


def test_readme_opens_with_the_two_setup_commands():
    first_block = _first_bash(README)
    commands = [line for line in first_block.splitlines() if line.strip()]
    assert len(commands) == 2
    assert "examples/train_mlp.py" in commands[0] and "pytest" in commands[1]


def test_readme_port_matches_the_torch_loop_it_replaces():
    namespace: dict = {}
    exec(compile(_block_with("lucid.optim.AdamW([w, b]"), "README.md", "exec"), namespace)
    x = torch.as_tensor(np.asarray(namespace["x"], np.float32))
    y = torch.as_tensor(np.asarray(namespace["y"], np.float32))
    w = torch.zeros((3, 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.AdamW([w, b], lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)
    for _ in range(300):
        opt.zero_grad()
        loss = torch.mean((x @ w + b - y) ** 2)
        loss.backward()
        opt.step()
        sched.step()
    np.testing.assert_allclose(np.asarray(namespace["w"].data), w.detach().numpy(), rtol=2e-4)
    np.testing.assert_allclose(
        np.asarray(namespace["b"].data), b.detach().numpy(), rtol=2e-4, atol=1e-6
    )


def test_readme_functional_example_gives_torchs_adamw_under_cosine_after_optax_clipping():
    """The README's ``optax.chain(clip_by_global_norm(1.0), LF.adamw(lr=cosine))`` against
    torch's AdamW + CosineAnnealingLR fed the same gradients clipped optax's way
    (``g * min(1, 1 / |g|)``), over enough steps for the schedule to matter."""
    import jax.numpy as jnp
    import optax

    namespace: dict = {}
    exec(compile(_block_with("optax.chain("), "README.md", "exec"), namespace)
    tx = namespace["tx"]
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=3) * scale for scale in np.linspace(0.1, 5.0, 40)]
    params = {"w": jnp.ones(3, jnp.float64)}
    state = tx.init(params)
    tw = torch.ones(3, dtype=torch.float64, requires_grad=True)
    topt = torch.optim.AdamW([tw], lr=1e-3)
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=1000)
    for g in grads:
        updates, state = tx.update({"w": jnp.asarray(g)}, state, params)
        params = optax.apply_updates(params, updates)
        tw.grad = torch.tensor(g * min(1.0, 1.0 / np.linalg.norm(g)))
        topt.step()
        tsched.step()
    np.testing.assert_allclose(np.asarray(params["w"]), tw.detach().numpy(), rtol=1e-10)


def test_the_docs_getting_started_page_shows_the_same_two_commands():
    docs = README.parent / "docs" / "getting-started.md"
    assert _first_bash(docs) == _first_bash(README)
