"""Static type checkers see lucid's real signatures.

lucid makes its optimizers' constructors and factories at import time from one `Signature`
each, so its source shows a checker ``Adam(params, defaults)``; the package ships ``.pyi``
stubs, written by ``tools/stubs.py`` from the live signatures, and ``py.typed``. These tests
keep the stubs current, and run mypy (pinned in the ``test`` extra) over calls that spell
every keyword right, which must pass clean, and over their twins with one keyword
misspelled, each of which must be flagged: the hand-written pair in ``tests/typecheck/``
(AdamW, bitsandbytes' AdamW8bit, torchao's AdamW4bit, AdamWScheduleFree, ``adam``, a
schedule, an LR scheduler, a torch functional form) and a pair written here for every
registered class and every made factory.

The checker reads lucid's sources and stubs only, offline: third-party packages resolve
to ``Any`` (``--no-site-packages``), so the result does not depend on the installed jax;
one more run checks the hand-written pair against the installed jax, optax and numpy.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "typecheck"
FLAGGED = re.compile(
    r'^(?P<file>[^:]+):(?P<line>\d+): error: Unexpected keyword argument "(?P<kw>\w+)"'
)


def _tools_stubs():
    spec = importlib.util.spec_from_file_location("lucid_tools_stubs", ROOT / "tools" / "stubs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STUBS = _tools_stubs()


def _mypy(files: list[Path], cache: Path, *, site_packages: bool = False) -> list[str]:
    """mypy's error lines for ``files`` (lucid's own modules are read but not reported)."""
    try:
        import mypy  # noqa: F401
    except ImportError:  # pragma: no cover - the test extra installs it
        pytest.fail("mypy is not installed: install lucid's test extra (pip install -e '.[test]')")
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file=",
        "--follow-imports=silent",
        "--show-error-codes",
        # a dependency without type information (optax before py.typed) is read as Any
        "--disable-error-code=import-untyped",
        "--no-error-summary",
        "--no-color-output",
        f"--cache-dir={cache}",
    ]
    if not site_packages:
        command += ["--no-site-packages", "--ignore-missing-imports"]
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    result = subprocess.run(
        [*command, *map(str, files)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed
    return [line for line in result.stdout.splitlines() if ": error:" in line]


def _misspelled(good: Path, bad: Path) -> set[tuple[int, str]]:
    """``(line, keyword)`` of each keyword of a call in ``bad`` that its twin call in
    ``good`` (the same call, in order) does not spell that way."""
    pairs = zip(
        (n for n in ast.walk(ast.parse(good.read_text())) if isinstance(n, ast.Call)),
        (n for n in ast.walk(ast.parse(bad.read_text())) if isinstance(n, ast.Call)),
        strict=True,
    )
    wrong = set()
    for right, call in pairs:
        spelled = {k.arg for k in right.keywords}
        wrong |= {(call.lineno, k.arg) for k in call.keywords if k.arg not in spelled}
    return wrong


def _every_made_call(directory: Path) -> tuple[Path, Path]:
    """Twin files calling every registered class and every made factory: with each of its
    keywords by name, at its default; and with its first keyword that has a default
    misspelled."""
    import inspect

    from lucid.optim._registry import registered

    made: list[tuple[str, str, inspect.Signature, bool]] = []
    for entry in registered():
        signature = inspect.signature(entry.cls.__init__)
        made.append((entry.cls.__module__, entry.name, signature, True))
    for module in STUBS.stubbed_modules():
        for name in module.__all__:
            value = getattr(module, name)
            if STUBS._synthesized(value) and not isinstance(value, type):
                made.append((module.__name__, name, inspect.signature(value), False))
    assert len(made) > 130, len(made)  # 69 classes, 66 factories
    header = ["import jax.numpy as jnp", "import lucid", "", "w = lucid.Parameter(jnp.zeros(3))"]
    imports = [
        f"from {module} import {name} as made{i}" for i, (module, name, _, _) in enumerate(made)
    ]
    good, bad = [*imports, *header], [*imports, *header]
    for i, (_, _, signature, is_class) in enumerate(made):
        keywords = [p for p in signature.parameters.values() if p.name not in ("self", "params")]
        # a value for each keyword: its default, or a float (bitsandbytes' SGD has no default lr)
        value = {p.name: "0.1" if p.default is p.empty else repr(p.default) for p in keywords}
        required = [f"{p.name}=0.1" for p in keywords if p.default is p.empty]
        typo = next(p.name for p in keywords if p.default is not p.empty)
        params = ["[w]"] if is_class else []
        good.append(f"made{i}({', '.join([*params, *(f'{k}={v}' for k, v in value.items())])})")
        bad.append(f"made{i}({', '.join([*params, *required, f'{typo}_typo={value[typo]}'])})")
    paths = directory / "every_spelled.py", directory / "every_misspelled.py"
    for path, lines in zip(paths, (good, bad)):
        path.write_text("\n".join(lines) + "\n")
    return paths


def test_the_stubs_are_the_live_signatures():
    """Each stub is what `tools/stubs.py` writes from the modules as they are now: a
    signature changed without regenerating fails here."""
    assert STUBS.stale() == []


def test_every_made_constructor_and_factory_has_a_stub():
    """The modules stubbed are those that make constructors or factories: every registered
    class's module is among them, and the package is marked typed."""
    from lucid.optim._registry import registered

    stubbed = {module.__name__ for module in STUBS.stubbed_modules()}
    assert {entry.cls.__module__ for entry in registered()} <= stubbed
    assert {
        "lucid.functional.adam",
        "lucid.functional.bnb.adam",
        "lucid.functional.torchao.adam",
        "lucid.functional.schedulefree",
    } <= stubbed
    assert (ROOT / "lucid" / "py.typed").exists()


def test_a_stub_gives_each_keyword_its_type_and_default():
    text = (ROOT / "lucid" / "optim" / "bnb.pyi").read_text()
    assert "class AdamW8bit(BnbOptimizer):" in text
    assert "min_8bit_size: int = 4096," in text
    text = (ROOT / "lucid" / "functional" / "adam.pyi").read_text()
    assert "betas: tuple[Any, Any] = (0.9, 0.999)," in text
    assert "-> GradientTransformation: ..." in text


def test_the_checker_flags_every_misspelled_keyword_and_nothing_else(tmp_path):
    good, bad = CASES / "spelled.py", CASES / "misspelled.py"
    every_good, every_bad = _every_made_call(tmp_path)
    stubs = sorted((ROOT / "lucid").rglob("*.pyi"))
    errors = _mypy([good, bad, every_good, every_bad, *stubs], tmp_path / "cache")
    by_file: dict[str, list[str]] = {}
    for line in errors:
        by_file.setdefault(Path(line.split(":")[0]).name, []).append(line)
    for spelled, misspelled in [(good, bad), (every_good, every_bad)]:
        assert spelled.name not in by_file, "\n".join(by_file[spelled.name])
        expected = _misspelled(spelled, misspelled)
        assert len(expected) >= (9 if spelled == good else 130)
        found = set()
        for line in by_file.pop(misspelled.name, []):
            match = FLAGGED.match(line)
            assert match, line
            found.add((int(match["line"]), match["kw"]))
        assert found == expected
    assert not by_file, "errors in the stubs: " + "\n".join(
        line for lines in by_file.values() for line in lines
    )


def test_the_checker_flags_them_against_the_installed_jax(tmp_path):
    """The same hand-written pair, with this environment's jax, optax and numpy typed as
    they are (either jax lane): the stubs need none of their types, and break with none."""
    good, bad = CASES / "spelled.py", CASES / "misspelled.py"
    errors = _mypy([good, bad], tmp_path / "cache", site_packages=True)
    assert not [line for line in errors if line.startswith(str(good.relative_to(ROOT)))]
    found = {(int(m["line"]), m["kw"]) for m in map(FLAGGED.match, errors) if m}
    assert found == _misspelled(good, bad)
    assert len(errors) == len(found), errors
