"""The README opens with what lucid is and an example that prints what it shows; its
install lines name every extra; its fast test command names the files marked ``fast``; its
porting example runs, and gives torch's numbers for torch's loop."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import torch
from _markdown import fenced_blocks, python_blocks
from test_docs_code import run_page

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _block_with(text: str) -> str:
    """The README's one Python block containing ``text`` (by content, not position)."""
    found = [b.source for b in python_blocks(README.read_text()) if text in b.source]
    assert len(found) == 1, f"{len(found)} README python blocks contain {text!r}"
    return found[0]


def _first_bash(path: pathlib.Path) -> str:
    return next(b.source for b in fenced_blocks(path.read_text()) if b.language == "bash")


def test_readme_opens_with_what_lucid_is_then_an_example_then_the_commands():
    text = README.read_text()
    blocks = fenced_blocks(text)
    assert blocks[0].language == "python"
    prose = text[: text.index("```")]
    assert "**lucid is" in prose and "minutes" not in prose
    assert blocks[1].language == "text"  # what the example prints
    assert [b.language for b in blocks].index("bash") == 2


def test_the_opening_example_prints_what_the_readme_shows(tmp_path):
    """Run as a user pastes it (a fresh interpreter, x64 off): lucid's and torch's
    numbers, which the README shows equal, are printed as shown."""
    example, shown = fenced_blocks(README.read_text())[:2]
    stdout = run_page("README.md", f"```python\n{example.source}```\n", tmp_path)
    assert stdout.splitlines()[: len(shown.source.splitlines())] == shown.source.splitlines()
    lucid_line, torch_line = shown.source.splitlines()[1:3]
    assert lucid_line.split(None, 1)[1] == torch_line.split(None, 1)[1]


def test_readme_install_begins_with_the_two_setup_commands():
    first_block = _first_bash(README)
    commands = [line for line in first_block.splitlines() if line.strip()]
    assert len(commands) == 2
    assert "examples/train_mlp.py" in commands[0]
    assert commands[1].endswith("pytest -q -n 2 -m fast")


def _extras() -> set[str]:
    """The names under ``[project.optional-dependencies]`` in pyproject.toml."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    section = re.split(r"^\[", section, flags=re.M)[0]
    return set(re.findall(r"^([\w-]+) = \[", section, flags=re.M))


def test_the_install_lines_name_every_extra_as_pyproject_defines_them():
    shown = set(re.findall(r"pip install -e '\.\[([\w-]+)\]'", README.read_text()))
    assert "test" in _extras() and shown == _extras()


def test_the_fast_tests_are_the_files_the_readme_names():
    marked = {
        f"tests/{path.name}"
        for path in (ROOT / "tests").glob("test_*.py")
        if re.search(r"^(pytestmark = |@)pytest\.mark\.fast\b", path.read_text(), flags=re.M)
    }
    paragraph = next(p for p in README.read_text().split("\n\n") if p.startswith("The fast tests"))
    assert marked and set(re.findall(r"tests/test_\w+\.py", paragraph)) == marked


def test_readme_port_matches_the_torch_loop_it_replaces():
    namespace: dict = {}
    exec(compile(_block_with("lucid.optim.AdamW([w, b]"), "README.md", "exec"), namespace)
    x = torch.as_tensor(np.asarray(namespace["x"], np.float32))
    y = torch.as_tensor(np.asarray(namespace["y"], np.float32))
    w = torch.zeros((3, 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.AdamW([w, b], lr=0.1)
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
