"""The API reference is complete, and its docstrings are written in the site's markup.

* every name in the public modules' ``__all__`` is rendered by a ``:::`` directive on a
  docs page (itself, or as a member of a rendered module; an optimizer on its own page);
* every public function, class, method and property has a docstring of its own; every
  public function, class and method documents in a Google ``Args:`` section exactly the
  parameters of its signature, in any order (a NamedTuple or dataclass may list its
  fields under ``Attributes:`` instead), and one that returns something has a
  ``Returns:`` section; every public function and class (the NamedTuples and
  dataclasses aside) has an example;
* every public instance attribute a constructor sets is documented (``Attributes:``,
  ``Args:`` or a documented property);
* no docstring in lucid holds reStructuredText: Sphinx roles, tables, directives or
  ``::`` literal blocks (mkdocstrings renders Markdown; nothing rewrites them).

Docstrings are read from the live objects (some are generated at import time), and
every docstring in the sources is also read with ``ast``, private modules included.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import itertools
import pkgutil
import re
import types
from pathlib import Path
from typing import Any

import pytest
from _docstrings import section_names, sections

import lucid

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

MODULES = [
    "lucid",
    "lucid.optim",
    "lucid.optim.lr_scheduler",
    "lucid.optim.swa_utils",
    "lucid.optim.checkpoint",
    "lucid.optim.functional",
    "lucid.optim.bnb",
    "lucid.optim.schedulefree",
    "lucid.functional",
    "lucid.functional.schedules",
    "lucid.functional.bnb",
    "lucid.functional.schedulefree",
    "lucid.nn",
    "lucid.nn.utils",
    "lucid.optim.torchao",
    "lucid.functional.torchao",
]


ROLE = re.compile(r"(?<![\w`]):[a-z]+(?::[a-z]+)?:`")
RST = {
    "a Sphinx role": ROLE,
    "an rST simple table": re.compile(r"^\s*=+(?: +=+)+\s*$", re.M),
    "an rST grid table": re.compile(r"^\s*\+(?:[-=]+\+)+\s*$", re.M),
    "an rST directive": re.compile(r"^\s*\.\. [a-z][\w-]*::", re.M),
    "an rST literal block (a line ending in '::')": re.compile(r"\S::\s*$", re.M),
}


# --------------------------------------------------------------------- docstrings
def generated_doc(obj: Any) -> bool:
    """The ``__doc__`` a NamedTuple or dataclass writes when it was given none."""
    doc = obj.__doc__ or ""
    return "\n" not in doc and doc.startswith(f"{obj.__name__}(") and doc.endswith(")")


def own_doc(obj: Any) -> str:
    """The object's docstring, cleaned; a class's own (not a base's), a method's own or
    its base method's (what ``inspect.getdoc`` shows)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        return "" if doc is None or generated_doc(obj) else inspect.cleandoc(doc)
    return inspect.getdoc(obj) or ""


def is_record(cls: type) -> bool:
    """A NamedTuple or a dataclass: the constructor's parameters are its fields."""
    return dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))


def parameter_names(obj: Any) -> list[str]:
    if getattr(obj, "_is_protocol", False):  # a typing.Protocol is never constructed
        return []
    names = []
    for parameter in inspect.signature(obj).parameters.values():
        if parameter.name in ("self", "cls"):
            continue
        star = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        names.append(star + parameter.name)
    return names


def returns_something(fn: Any) -> bool:
    annotation = inspect.signature(fn).return_annotation
    return annotation not in (inspect.Signature.empty, None, "None")


# ------------------------------------------------------------------ public objects
def public_names() -> list[tuple[str, str, Any]]:
    out = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            out.append((module_name, name, getattr(module, name)))
    return out


def kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    alias = isinstance(obj, types.GenericAlias) or type(obj).__module__ in (
        "typing",
        "_collections_abc",
    )  # a type alias such as Schedule = Callable[...] is callable, but data
    if callable(obj) and not alias:
        return "function"
    return "data"


def public_classes() -> dict[int, type]:
    classes = {}
    for _, _, obj in public_names():
        if inspect.isclass(obj):
            classes[id(obj)] = obj
    return classes


def lucid_bases(cls: type) -> list[type]:
    return [base for base in cls.__mro__ if base.__module__.split(".")[0] == "lucid"]


def public_members(cls: type) -> list[tuple[str, Any]]:
    """``(qualified name, member)`` for the public methods and properties a class defines
    or inherits from lucid's classes (a NamedTuple's tuple methods aside), each named
    after the class that defines it."""
    out, seen = [], set()
    for base in lucid_bases(cls):
        for name, member in vars(base).items():
            if name.startswith("_") or name in seen:
                continue
            function = inspect.unwrap(member)
            if inspect.isfunction(function) and function.__qualname__ != f"{base.__name__}.{name}":
                continue  # a base's method set on the class (Optimizer wraps step, as torch)
            seen.add(name)
            routine = isinstance(member, staticmethod | classmethod) or inspect.isfunction(function)
            if isinstance(member, property) or routine:
                # named where it is defined: an inherited method is checked once
                out.append((f"{base.__module__}.{base.__qualname__}.{name}", getattr(base, name)))
    return out


def instance_attributes(cls: type) -> set[str]:
    """Public attributes the constructors of ``cls`` and its lucid bases set on ``self``."""
    names: set[str] = set()
    for base in lucid_bases(cls):
        init = vars(base).get("__init__")
        if init is None:
            continue
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(init)))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if (
                        isinstance(leaf, ast.Attribute)
                        and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == "self"
                        and not leaf.attr.startswith("_")
                    ):
                        names.add(leaf.attr)
    return names


def documented_attributes(cls: type) -> set[str]:
    names: set[str] = set()
    for base in lucid_bases(cls):
        doc = own_doc(base)
        names |= set(section_names(doc, "Attributes") or [])
        names |= set(section_names(doc, "Args") or [])
        for name, member in vars(base).items():
            if isinstance(member, property) and (member.__doc__ or "").strip():
                names.add(name)
    return names


# ----------------------------------------------------------------- the reference
def directives() -> list[tuple[str, str, Any]]:
    """``(page, identifier, members option)`` for every ``:::`` directive; the option is
    None (not given), False, or the list of member names."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("::: "):
                continue
            identifier, members, j = line[4:].strip(), None, i + 1
            while j < len(lines) and lines[j].startswith(" "):
                text = lines[j].strip()
                if text == "members: false":
                    members = False
                elif text == "members:":
                    members = []
                elif text.startswith("- ") and isinstance(members, list):
                    members.append(text[2:].strip())
                j += 1
            found.append((str(page.relative_to(DOCS)), identifier, members))
    return found


def resolve(identifier: str) -> Any:
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(identifier)


@functools.cache
def rendered() -> dict[int, str]:
    """``id(object) -> where`` for every object the reference renders."""
    out = {}
    for page, identifier, members in directives():
        obj = resolve(identifier)
        out[id(obj)] = f"{page}: {identifier}"
        if inspect.ismodule(obj) and members is not False:
            names = members if members is not None else getattr(obj, "__all__", [])
            for name in names:
                out[id(getattr(obj, name))] = f"{page}: {identifier}.{name}"
        elif isinstance(members, list):
            for name in members:
                out[id(getattr(obj, name))] = f"{page}: {identifier}.{name}"
    return out


@functools.cache
def attribute_docstrings() -> dict[tuple[str, str], str]:
    """``(module, name) -> docstring`` of every documented module-level assignment."""
    out = {}
    for module_name, path in source_files():
        body = ast.parse(path.read_text()).body
        for node, after in itertools.pairwise(body):
            target = node.targets[0] if isinstance(node, ast.Assign) else None
            if isinstance(node, ast.AnnAssign):
                target = node.target
            if (
                isinstance(target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                out[(module_name, target.id)] = inspect.cleandoc(after.value.value)
    return out


def source_files() -> list[tuple[str, Path]]:
    files = []
    for info in pkgutil.walk_packages(lucid.__path__, "lucid."):
        module = importlib.import_module(info.name)
        files.append((info.name, Path(module.__file__)))
    files.append(("lucid", Path(lucid.__file__)))
    return files


# ---------------------------------------------------------------------- the tests
def ids(params: list[tuple[str, str, Any]]) -> list[str]:
    return [f"{module}.{name}" for module, name, _ in params]


PUBLIC = public_names()


def test_the_reference_pages_hold_directives():
    assert len(directives()) > 50


@pytest.mark.parametrize(("module", "name", "obj"), PUBLIC, ids=ids(PUBLIC))
def test_every_public_name_is_rendered(module, name, obj):
    assert id(obj) in rendered(), f"{module}.{name} is rendered by no ::: directive"


@pytest.mark.parametrize(("module", "name", "obj"), PUBLIC, ids=ids(PUBLIC))
def test_every_public_name_is_documented(module, name, obj):
    what = kind(obj)
    if what == "module":
        assert (obj.__doc__ or "").strip(), f"module {module}.{name} has no docstring"
        return
    if what == "data":
        docs = attribute_docstrings()
        found = [
            doc
            for (where, attr), doc in docs.items()
            if attr == name and getattr(importlib.import_module(where), attr, None) is obj
        ]
        assert found, f"{module}.{name} has no attribute docstring where it is defined"
        return
    doc = own_doc(obj)
    assert doc, f"{module}.{name} has no docstring"
    expected = parameter_names(obj)
    if what == "class" and is_record(obj):
        documented = section_names(doc, "Attributes", "Args")
    else:
        documented = section_names(doc, "Args")
    assert sorted(documented or []) == sorted(expected), (
        f"{module}.{name}: documented parameters {documented} != signature {expected}"
    )
    if what == "function" and returns_something(obj):
        assert "Returns" in sections(doc), f"{module}.{name} has no Returns section"
    if not (what == "class" and is_record(obj)):
        examples = sections(doc).get("Examples")
        assert examples and any(">>>" in line for line in examples), (
            f"{module}.{name} has no example"
        )


def class_members() -> list[tuple[str, Any]]:
    out = []
    for cls in public_classes().values():
        if is_record(cls):
            continue
        out += public_members(cls)
    return sorted(dict(out).items())


MEMBERS = class_members()


@pytest.mark.parametrize(("name", "member"), MEMBERS, ids=[name for name, _ in MEMBERS])
def test_every_public_method_and_property_is_documented(name, member):
    if isinstance(member, property):
        assert (member.__doc__ or "").strip(), f"property {name} has no docstring"
        return
    doc = own_doc(member)
    assert doc, f"{name} has no docstring"
    expected = parameter_names(member)
    documented = section_names(doc, "Args") or []
    assert sorted(documented) == sorted(expected), (
        f"{name}: documented parameters {documented} != signature {expected}"
    )
    if returns_something(member):
        assert "Returns" in sections(doc), f"{name} has no Returns section"


# a NamedTuple's or dataclass's fields are its constructor's parameters, checked above
CLASSES = sorted(
    (cls for cls in public_classes().values() if not is_record(cls)),
    key=lambda cls: f"{cls.__module__}.{cls.__name__}",
)


@pytest.mark.parametrize("cls", CLASSES, ids=[cls.__name__ for cls in CLASSES])
def test_every_public_attribute_is_documented(cls):
    missing = instance_attributes(cls) - documented_attributes(cls)
    assert not missing, f"{cls.__name__} sets undocumented attributes {sorted(missing)}"


def all_docstrings() -> list[tuple[str, str]]:
    """``(where, docstring)`` for every docstring in lucid's sources, and every live one of
    the public objects and their members (some are generated at import time)."""
    out = []
    for module_name, path in source_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    name = getattr(node, "name", "")
                    out.append((f"{module_name}:{node.lineno if name else 1} {name}", doc))
    for (module_name, name), doc in attribute_docstrings().items():
        out.append((f"{module_name}.{name}", doc))
    for module, name, obj in PUBLIC:
        if kind(obj) in ("class", "function"):
            out.append((f"{module}.{name}", own_doc(obj)))
    for name, member in MEMBERS:
        out.append((name, own_doc(member.fget if isinstance(member, property) else member)))
    return out


def test_no_docstring_holds_restructuredtext():
    found = []
    for where, doc in all_docstrings():
        for what, pattern in RST.items():
            match = pattern.search(doc)
            if match:
                found.append(f"{where}: {what}: {match.group(0).strip()!r}")
    assert not found, "\n".join(sorted(set(found)))


def test_the_checks_catch_what_they_look_for():
    """The parsers behind the tests above, on docstrings with known faults."""
    doc = inspect.cleandoc(
        """Summary.

        Args:
          x: one.
            More on x.
          *args: the rest.

        Returns:
          Something.
        """
    )
    assert section_names(doc, "Args") == ["x", "*args"]
    assert "Returns" in sections(doc)
    assert section_names(doc.replace("Args:", "Parameters:"), "Args") == ["x", "*args"]

    def f(x, *args, y=1):
        return x

    assert parameter_names(f) == ["x", "*args", "y"]  # y is missing from the doc above
    assert all(
        pattern.search(text)
        for pattern, text in [
            (RST["a Sphinx role"], "see :class:`~lucid.Parameter`"),
            (RST["a Sphinx role"], "see :py:func:`f`"),
            (RST["an rST simple table"], "=====  =====\na      b\n=====  ====="),
            (RST["an rST directive"], ".. math::\n\n   x"),
            (RST["an rST literal block (a line ending in '::')"], "as follows::\n\n    x"),
        ]
    )
    assert not RST["a Sphinx role"].search("a `code` span, a [link][lucid.Parameter]")

    assert {"param_groups", "defaults"} <= instance_attributes(lucid.optim.Optimizer)
    assert generated_doc(dataclasses.make_dataclass("D", ["a"]))
