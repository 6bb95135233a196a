"""No module of lucid reads another module's private attributes.

Layers talk through small documented interfaces: an ``obj._name`` access is allowed
only where ``_name`` is defined in the same module (an attribute it assigns, a
function, class or variable it defines), or on ``self``/``cls``/``super()`` for a
member of the class's own hierarchy (a protected member, an interface between a base
class and its subclasses). Importing a private name from another module is refused
too. NamedTuple's underscore API (``_fields``, ``_replace``...) is public.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "lucid"
NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make", "_field_defaults"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def _private_members() -> dict[str, set[str]]:
    """Every private name each class of lucid defines (methods and attributes)."""
    members: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                members.setdefault(node.name, set()).update(
                    n for n in _defined(node) if _is_private(n)
                )
    return members


def _bases(tree: ast.AST) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found[node.name] = [
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            ]
    return found


def _on_self(node: ast.Attribute) -> bool:
    value = node.value
    if isinstance(value, ast.Name) and value.id in ("self", "cls"):
        return True
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def _is_module(path: Path, node: ast.ImportFrom, name: str) -> bool:
    """Whether ``from <module> import <name>`` imports a module (a package's private
    module is the package's own business) rather than a private name of a module."""
    base = path.parent
    for _ in range(max(node.level - 1, 0)):
        base = base.parent
    if node.module:
        base = base.joinpath(*node.module.split("."))
    return (base / f"{name}.py").exists() or (base / name / "__init__.py").exists()


def violations(path: Path, members: dict[str, set[str]]) -> list[str]:
    tree = ast.parse(path.read_text())
    defined = _defined(tree)
    inherited = set().union(*(members.get(b, set()) for bs in _bases(tree).values() for b in bs))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            name = node.attr
            if name in NAMEDTUPLE_API or name in defined:
                continue
            if _on_self(node) and name in inherited:
                continue
            found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: .{name}")
        elif isinstance(node, ast.ImportFrom):
            found.extend(
                f"{path.relative_to(ROOT.parent)}:{node.lineno}: imports {alias.name}"
                for alias in node.names
                if _is_private(alias.name) and not _is_module(path, node, alias.name)
            )
    return found


def test_no_module_reads_another_modules_private_attributes():
    members = _private_members()
    found = [v for path in sorted(ROOT.rglob("*.py")) for v in violations(path, members)]
    assert not found, "private access across modules:\n" + "\n".join(found)


def test_the_check_catches_a_private_access_across_modules(tmp_path):
    source = tmp_path / "lucid" / "example.py"
    source.parent.mkdir()
    source.write_text(
        "from .other import _helper\n"
        "class A:\n"
        "    def go(self, optimizer):\n"
        "        self._own = 1\n"
        "        return optimizer._step_pre_hooks, self._own\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path / "lucid"
    try:
        found = violations(source, {})
    finally:
        ROOT = saved
    assert sorted(found) == [
        "lucid/example.py:1: imports _helper",
        "lucid/example.py:5: ._step_pre_hooks",
    ]


@pytest.mark.parametrize("name", ["_fields", "_replace"])
def test_namedtuple_api_is_not_private(name, tmp_path):
    source = tmp_path / "m.py"
    source.write_text(f"def f(state):\n    return state.{name}\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert violations(source, {}) == []
    finally:
        ROOT = saved
