"""Every ```python block of README.md and docs/**/*.md runs as shown.

A page reads like one script: its Python blocks run in order in one namespace, in a
fresh interpreter started in an empty directory with jax's default configuration (x64
off), as a user pasting them would run them. A failure names the page, the block and
its line; tracebacks point at the page's own lines.

What a page may rely on is on the page: a *setup* block, its first Python block,
collapsed (``??? note "Setup"`` in the mkdocs pages; ``<details><summary>Setup
</summary>`` in README.md, which a code host renders without mkdocs). No other Python
hides in a collapsed block. Blocks that are not Python carry an honest tag (```bash,
```text, ...): no bare fence, and no Python under another tag, so nothing escapes.

Two things a page cannot say in a Python block, the test knows:

- ``HOST_DEVICES``: pages whose blocks run on several devices get that many host CPU
  devices (``--xla_force_host_platform_device_count``, which must be set before jax
  starts, as the page tells a user), with the precautions tests/_distributed.py
  explains, and the run checks it saw them.
- A block preceded by ``<!-- docs test: run as N processes -->`` is a program of its
  own for ``jax.distributed``: it runs in N processes, each as ``python program.py
  COORDINATOR_ADDRESS N PROCESS_ID`` (the page shows that launch command), and each
  must finish cleanly.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _distributed import HOST_DEVICES as MACHINE_ALONE
from _distributed import free_port, rendezvous_flags, run_processes
from _markdown import Block, Container, fenced_blocks, python_blocks

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PYTHON_PAGES = [page for page in PAGES if python_blocks(page.read_text())]
HOST_DEVICES = {"docs/distributed.md": 8, "docs/optimizers/matrix.md": 8}
LANGUAGES = {"python", "bash", "console", "text"}
PROCESSES = re.compile(r"docs test: run as (\d+) processes")
TIMEOUT = 240  # seconds for one page: far above what any takes

RUNNER = r"""
import json, linecache, sys, traceback

job = json.load(sys.stdin)
page = job["page"]
linecache.cache[page] = (len(job["text"]), None, job["text"].splitlines(True), page)
namespace = {"__name__": "__main__"}
for block in job["blocks"]:
    try:
        # padded so that line numbers are the page's
        code = compile("\n" * (block["line"] - 1) + block["source"], page, "exec")
        exec(code, namespace)
    except BaseException:
        print(f"{page}: python block {block['number']} (line {block['line']}) raised:",
              file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
if "jax" in sys.modules:
    print("devices:", len(sys.modules["jax"].devices()))
print("OK")
"""


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _env(devices: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    if devices is not None:
        flags = [f"--xla_force_host_platform_device_count={devices}", *rendezvous_flags()]
        env["XLA_FLAGS"] = " ".join(flags)
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_CPU_ENABLE_ASYNC_DISPATCH"] = "false"  # see tests/_distributed.py
    return env


def _processes(block: Block) -> int | None:
    if block.note is None or not block.note.startswith("docs test:"):
        return None
    match = PROCESSES.fullmatch(block.note)
    assert match, f"line {block.line - 1}: unknown directive <!-- {block.note} -->"
    return int(match[1])


def run_page(name: str, text: str, cwd: Path, devices: int | None = None) -> str:
    """Runs the page's blocks (but the separate programs) in order; returns stdout."""
    numbered = [(n, block) for n, block in enumerate(python_blocks(text), 1)]
    job = {
        "page": name,
        "text": text,
        "blocks": [
            {"number": n, "line": block.line, "source": block.source}
            for n, block in numbered
            if _processes(block) is None
        ],
    }
    result = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(job),
        cwd=cwd,
        env=_env(devices),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if result.returncode or not result.stdout.rstrip().endswith("OK"):
        pytest.fail(result.stderr[-6000:] or result.stdout[-2000:], pytrace=False)
    for n, block in numbered:
        if (count := _processes(block)) is not None:
            _run_program(name, n, block, count, cwd)
    return result.stdout


def _run_program(name: str, number: int, block: Block, count: int, cwd: Path) -> None:
    program = cwd / "program.py"
    program.write_text("\n" * (block.line - 1) + block.source)  # the page's line numbers
    address = f"127.0.0.1:{free_port()}"
    results = run_processes(
        lambda i: [sys.executable, str(program), address, str(count), str(i)],
        count,
        _env(devices=1),
        TIMEOUT,
        cwd=cwd,
    )
    for i, (returncode, _, err) in enumerate(results):
        if returncode:
            where = f"{name}: python block {number} (line {block.line}), process {i} of {count}"
            pytest.fail(f"{where} raised:\n{err[-6000:]}", pytrace=False)


def _param(page: Path) -> Any:
    """A page, marked to hold the machine alone where it runs several host devices or
    processes (tests/_distributed.py's ``HOST_DEVICES``)."""
    several = _name(page) in HOST_DEVICES or any(map(_processes, python_blocks(page.read_text())))
    return pytest.param(page, id=_name(page), marks=[MACHINE_ALONE] if several else [])


@pytest.mark.parametrize("page", [_param(page) for page in PYTHON_PAGES])
def test_page_runs_as_shown(page: Path, tmp_path: Path):
    name = _name(page)
    stdout = run_page(name, page.read_text(), tmp_path, HOST_DEVICES.get(name))
    if name in HOST_DEVICES:
        assert f"devices: {HOST_DEVICES[name]}" in stdout, stdout[-2000:]


def test_a_failing_block_fails_naming_page_block_and_line(tmp_path: Path):
    text = "# A page\n\n```python\nx = 1\n```\n\nText.\n\n```python\nassert x == 2\n```\n"
    with pytest.raises(pytest.fail.Exception) as failure:
        run_page("docs/a_page.md", text, tmp_path)
    message = str(failure.value)
    assert "docs/a_page.md: python block 2 (line 10) raised:" in message
    assert 'File "docs/a_page.md", line 10' in message and "assert x == 2" in message
    # a block that ends the interpreter early has not run the page
    with pytest.raises(pytest.fail.Exception, match="python block 1"):
        run_page("docs/a_page.md", "```python\nraise SystemExit(0)\n```\n", tmp_path)
    # a program run as several processes fails when one of them does
    program = "import sys\n\nassert sys.argv[2:] != ['2', '1']\n"
    marker = "<!-- docs test: run as 2 processes -->"
    text = f"```python\nx = 1\n```\n\n{marker}\n```python\n{program}```\n"
    with pytest.raises(pytest.fail.Exception) as failure:
        run_page("docs/a_page.md", text, tmp_path)
    message = str(failure.value)
    assert "docs/a_page.md: python block 2 (line 7), process 1 of 2 raised:" in message
    assert "line 9" in message


def test_the_block_reader_finds_blocks_in_containers_and_their_lines():
    text = "\n".join(
        [
            "<details><summary>Setup</summary>",  # 1
            "",
            "```python",
            "a = 1",  # 4
            "```",
            "",
            "</details>",
            "",
            '??? note "Setup"',  # 9
            "",
            "    ```python",
            "    def f():",  # 12
            "        return 2",
            "    ```",
            "",
            "<!-- docs test: run as 2 processes -->",
            "~~~~python",
            "````",  # 18: inside the tilde fence
            "~~~~",
            "",
            "```",
            "bare",  # 22
            "```",
            '???+ example "Open"',
            "    ```python",
            "    b = 2",  # 26
            "    ```",
        ]
    )
    blocks = fenced_blocks(text)
    assert [(b.language, b.line) for b in blocks] == [
        ("python", 4),
        ("python", 12),
        ("python", 18),
        ("", 22),
        ("python", 26),
    ]
    assert blocks[0].container.syntax == "<details>" and blocks[0].container.title == "Setup"
    assert blocks[1].container.syntax == "???" and blocks[1].container.collapsed
    assert blocks[1].source == "def f():\n    return 2\n"
    assert blocks[2].container is None and blocks[2].note == "docs test: run as 2 processes"
    assert blocks[2].source == "````\n"
    assert blocks[4].container == Container("???+", "Open", collapsed=False)
    names = {_name(page) for page in PYTHON_PAGES}
    assert {"README.md", "docs/index.md", "docs/distributed.md", "docs/optimizers/sgd.md"} <= names


def _looks_like_python(source: str) -> bool:
    """Source that parses as Python and does something (a bare word does not)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    doing = (ast.Import, ast.ImportFrom, ast.Assign, ast.Call, ast.FunctionDef, ast.ClassDef)
    return any(isinstance(node, doing) for node in ast.walk(tree))


def test_every_fence_is_tagged_and_only_python_is_tagged_python():
    problems = []
    for page in PAGES:
        for block in fenced_blocks(page.read_text()):
            where = f"{_name(page)}:{block.line - 1}"
            if not block.language:
                problems.append(f"{where}: a bare ``` fence; tag it (```text if illustrative)")
            elif block.language not in LANGUAGES:
                problems.append(f"{where}: ```{block.language} (tags used: {sorted(LANGUAGES)})")
            elif block.language != "python" and _looks_like_python(block.source):
                problems.append(f"{where}: Python tagged ```{block.language}")
            elif block.language == "python" and not block.source.strip():
                problems.append(f"{where}: an empty ```python block")
    assert not problems, "\n".join(problems)


def _bound(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _loaded(tree: ast.AST) -> set[str]:
    return {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def test_setup_blocks_come_first_collapsed_and_are_used():
    problems = []
    for page in PAGES:
        name, blocks = _name(page), python_blocks(page.read_text())
        for n, block in enumerate(blocks, 1):
            where, box = f"{name}: python block {n} (line {block.line})", block.container
            if box is None or (box.title != "Setup" and not box.collapsed):
                continue
            if box.title != "Setup":
                problems.append(f"{where}: Python hidden in a collapsed block, not the setup")
                continue
            if not box.collapsed:
                problems.append(f"{where}: the setup block is shown open; collapse it")
            if n != 1:
                problems.append(f"{where}: a setup block comes first on its page")
            wanted = "<details>" if name == "README.md" else "???"
            if box.syntax != wanted:
                problems.append(f"{where}: a setup block here is written {wanted}")
            later = set().union(*(_loaded(ast.parse(b.source)) for b in blocks[n:]))
            if not _bound(ast.parse(block.source)) & later:
                problems.append(f"{where}: the setup defines nothing the page's blocks use")
    assert not problems, "\n".join(problems)
