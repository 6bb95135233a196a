"""The examples run: every notebook top to bottom in a fresh kernel, and train_mlp.py.

Each notebook runs in a kernel started from this interpreter (so in this
environment, whichever jax lane it is), with the repository root on
``PYTHONPATH``, ``examples/`` as the working directory and matplotlib's
non-interactive Agg backend. A cell that raises fails the test; the notebooks
carry their own assertions (for example that lucid's and torch's loss curves
coincide).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys
import time

import jax
import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
KERNEL = "lucid-tests"
CELL_TIMEOUT_S = 300  # a guard against a hang; each notebook takes well under 2 minutes


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec that runs this interpreter, and the environment the kernel inherits."""
    jupyter_dir = tmp_path_factory.mktemp("jupyter")
    spec_dir = jupyter_dir / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "lucid tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {"JUPYTER_PATH": str(jupyter_dir), "PYTHONPATH": pythonpath, "MPLBACKEND": "Agg"}


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_clean(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_env, monkeypatch):
    for name, value in kernel_env.items():
        monkeypatch.setenv(name, value)
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")


def _load_train_mlp():
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLES / "train_mlp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_mlp_loss_falls():
    train_mlp = _load_train_mlp()
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)  # as a user runs it (conftest turns x64 on)
    try:
        losses = train_mlp.main(epochs=60)
    finally:
        jax.config.update("jax_enable_x64", x64)
    assert len(losses) == 60
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
