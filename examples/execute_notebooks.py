"""Run the example notebooks top to bottom and store their outputs in the .ipynb files.

    python examples/execute_notebooks.py            # every notebook in examples/
    python examples/execute_notebooks.py 03 05      # those whose file names contain 03 or 05
    python examples/execute_notebooks.py --check    # run nothing; exit 1 naming stale notebooks

A notebook runs as tests/test_notebooks.py runs it: in a fresh kernel of this
interpreter, with the repository root on ``PYTHONPATH`` and ``examples/`` as
the working directory. Figures are PNGs from matplotlib's inline backend
(Agg-rendered) at ``DPI``; a progress bar is stored as its last state, as
Jupyter shows it.

Each notebook's metadata records, under ``"lucid"``, a SHA-256 of its code
cells' sources and of the example modules they import (04 draws its figure
with ``schedules_gallery.py``). tests/test_notebooks.py fails when that digest
differs from the current sources, and when a cell that gives output when run
has none stored; this command refreshes them.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
COMMAND = "python examples/execute_notebooks.py"
METADATA_KEY = "lucid"
KERNEL = "lucid-examples"
CELL_TIMEOUT_S = 300  # a guard against a hang; each notebook takes well under 2 minutes
DPI = 72  # modest PNGs: the figures are 7 to 17 inches wide
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def notebooks() -> list[Path]:
    return sorted(EXAMPLES.glob("*.ipynb"))


def _code_sources(notebook: nbformat.NotebookNode) -> list[str]:
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


def example_imports(notebook: nbformat.NotebookNode) -> list[str]:
    """The modules of examples/ (file names) that the notebook's code cells import."""
    names = set()
    for source in _code_sources(notebook):
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell magic: no plain imports to find
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(f"{name}.py" for name in names if (EXAMPLES / f"{name}.py").is_file())


def source_digest(notebook: nbformat.NotebookNode) -> str:
    """SHA-256 of what decides the outputs: the code cells and the example modules they use."""
    digest = hashlib.sha256()
    for source in _code_sources(notebook):
        digest.update(b"cell\0" + source.encode() + b"\0")
    for name in example_imports(notebook):
        text = (EXAMPLES / name).read_text(encoding="utf-8").replace("\r\n", "\n")
        digest.update(b"module\0" + name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def refresh_command(path: Path) -> str:
    return f"{COMMAND} {path.stem.split('_')[0]}"


def stale_reasons(path: Path) -> list[str]:
    """Why the outputs stored in ``path`` are not those of its current sources (empty: current)."""
    notebook = nbformat.read(path, as_version=4)
    recorded = notebook.metadata.get(METADATA_KEY, {}).get("sources_sha256")
    reasons = []
    if recorded is None:
        reasons.append("no outputs stored by this script (no sources_sha256 in its metadata)")
    elif recorded != source_digest(notebook):
        names = " or ".join(["its code cells", *example_imports(notebook)])
        reasons.append(f"the stored outputs are stale: {names} changed since they were run")
    unrun = [
        c.source[:50] for c in notebook.cells if c.cell_type == "code" and not c.execution_count
    ]
    if unrun:
        reasons.append(f"{len(unrun)} code cell(s) not run, the first: {unrun[0]!r}")
    return reasons


@contextlib.contextmanager
def kernel_environment() -> Iterator[None]:
    """A kernelspec that runs this interpreter, and the environment its kernels start in."""
    with tempfile.TemporaryDirectory() as jupyter_dir:
        spec_dir = Path(jupyter_dir) / "kernels" / KERNEL
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "lucid examples",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        settings = {
            "JUPYTER_PATH": jupyter_dir,
            "PYTHONPATH": pythonpath,
            "MPLBACKEND": INLINE_BACKEND,
        }
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def execute(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``notebook`` run top to bottom; call inside ``kernel_environment()``.

    Raises nbclient's CellExecutionError, with the cell and traceback, if a cell raises.
    """
    notebook = copy.deepcopy(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    figure_kwargs = {"bbox_inches": "tight", "dpi": DPI}
    NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        record_timing=False,
        resources={"metadata": {"path": str(EXAMPLES)}},
        extra_arguments=[f"--InlineBackend.print_figure_kwargs={figure_kwargs!r}"],
    ).execute()
    return notebook


def _last_state(text: str) -> str:
    """Each line as a terminal leaves it: what follows its last carriage return."""
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))


def tidy_outputs(cell: nbformat.NotebookNode) -> None:
    """Merge a cell's consecutive stream outputs and keep progress bars' final state."""
    outputs = []
    for output in cell.outputs:
        previous = outputs[-1] if outputs else None
        if (
            output.output_type == "stream"
            and previous is not None
            and previous.output_type == "stream"
            and previous.name == output.name
        ):
            previous.text += output.text
        else:
            outputs.append(output)
    for output in outputs:
        if output.output_type == "stream":
            output.text = _last_state(output.text)
    cell.outputs = [o for o in outputs if o.output_type != "stream" or o.text.strip()]


def _private_strings() -> dict[str, str]:
    """Strings that would identify this machine if an output printed them."""
    found = {
        "repository path": str(ROOT),
        "interpreter prefix": sys.prefix,
        "base interpreter prefix": sys.base_prefix,
        "home directory": str(Path.home()),
        "host name": socket.gethostname(),
    }
    return {what: text for what, text in found.items() if len(text) > 3}


def leaks(notebook: nbformat.NotebookNode) -> list[str]:
    """Text outputs that name this machine's paths or host name (image data is not text)."""
    private = _private_strings()
    problems = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            texts = [output.get("text", ""), "\n".join(output.get("traceback", []))]
            texts += [v for k, v in output.get("data", {}).items() if k.startswith("text/")]
            for what, text in private.items():
                if any(text in str(t) for t in texts):
                    problems.append(f"cell {index} prints this machine's {what}")
    return problems


def store(path: Path) -> float:
    """Run ``path`` and write it back with its outputs and source digest; returns seconds."""
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    with kernel_environment():
        executed = execute(notebook)
    seconds = time.perf_counter() - start
    for cell in executed.cells:
        if cell.cell_type == "code":
            tidy_outputs(cell)
    problems = leaks(executed)
    if problems:
        raise SystemExit(f"{path.name}: not written: " + "; ".join(problems))
    # keep the stored metadata (nbclient writes the kernel's language_info, version included)
    executed.metadata = copy.deepcopy(notebook.metadata)
    executed.metadata[METADATA_KEY] = {
        "sources_sha256": source_digest(notebook),
        "example_modules": example_imports(notebook),
        "refresh": COMMAND,
    }
    nbformat.validate(executed)
    nbformat.write(executed, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run the notebooks whose file names contain one")
    parser.add_argument("--check", action="store_true", help="run nothing; report stale notebooks")
    args = parser.parse_args(argv)
    paths = [p for p in notebooks() if not args.names or any(n in p.name for n in args.names)]
    if not paths:
        parser.error(f"no notebook in examples/ matches {args.names}")
    if args.check:
        stale = {p: stale_reasons(p) for p in paths}
        for path, reasons in stale.items():
            if reasons:
                print(f"{path.name}: {'; '.join(reasons)}; refresh: {refresh_command(path)}")
        return 1 if any(stale.values()) else 0
    for path in paths:
        seconds = store(path)
        size = path.stat().st_size / 1024
        print(f"{path.name}: ran in {seconds:.0f} s, stored with its outputs ({size:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
