"""The examples run: every notebook top to bottom in a fresh kernel, and train_mlp.py.

Each notebook runs as examples/execute_notebooks.py runs it to store its
outputs: in a kernel started from this interpreter (so in this environment,
whichever jax lane it is), with the repository root on ``PYTHONPATH``,
``examples/`` as the working directory and matplotlib's inline backend
(Agg-rendered PNGs). A cell that raises fails the test; the notebooks carry
their own assertions (for example that lucid's and torch's loss curves
coincide).

The notebooks are stored with their outputs, so that the documentation site
and the code host show results and plots. Those outputs must be current: the
digest of the code (and of the example modules it imports) recorded when they
were stored must match the sources, and every cell that gives output when run
must have output stored.
"""

from __future__ import annotations

import importlib.util
import pathlib
import time

import jax
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execute_notebooks = _load_example("execute_notebooks")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]
    assert execute_notebooks.notebooks() == NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_outputs_are_current(path):
    nbformat.validate(nbformat.read(path, as_version=4))
    reasons = execute_notebooks.stale_reasons(path)
    assert not reasons, (
        f"{path.name}: {'; '.join(reasons)}. "
        f"Refresh its outputs: {execute_notebooks.refresh_command(path)}"
    )


def _draws(outputs):
    return any("image/png" in output.get("data", {}) for output in outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    stored = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    with execute_notebooks.kernel_environment():
        # raises CellExecutionError, with the cell and traceback, on any error
        executed = execute_notebooks.execute(stored)
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")

    # every cell that shows something when run shows it in the stored notebook too: some
    # output, and a figure where the run draws one (text varies: timings, warnings per lane)
    missing = []
    for index, (ran, kept) in enumerate(zip(executed.cells, stored.cells, strict=True)):
        if ran.cell_type != "code" or not ran.outputs:
            continue
        if not kept.outputs or (_draws(ran.outputs) and not _draws(kept.outputs)):
            missing.append(f"cell {index} ({ran.source[:40]!r}...)")
    assert not missing, (
        f"{path.name}: no stored output for {', '.join(missing)}. "
        f"Refresh its outputs: {execute_notebooks.refresh_command(path)}"
    )


def test_train_mlp_loss_falls():
    train_mlp = _load_example("train_mlp")
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)  # as a user runs it (conftest turns x64 on)
    try:
        losses = train_mlp.main(epochs=60)
    finally:
        jax.config.update("jax_enable_x64", x64)
    assert len(losses) == 60
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
