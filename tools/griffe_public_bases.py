"""A griffe extension: a class's bases as a user can name them, and records without internals.

The site reads lucid's live classes (``force_inspection``), and griffe's inspector writes
each base as ``base.__module__ + "." + base.__qualname__``: a Schedule-Free class showed
``Bases: lucid.optim.schedulefree._TrainEval``, a scheduler ``lucid.optim._schedulers.base.
LRScheduler``, a NamedTuple ``builtins.tuple``. This extension writes each base by the public
name lucid exports it under (``lucid.optim.lr_scheduler.LRScheduler``); a private base no
public module exports is replaced by its nearest public ancestors (``_TrainEval`` by
``lucid.optim.Optimizer``); a NamedTuple's base is ``typing.NamedTuple``. A NamedTuple's
fields also lose the ``_tuplegetter(0, "Alias for field number 0")`` value and docstring
Python gives them: the class's ``Attributes`` table documents each field.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

import griffe


def _private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


@functools.cache
def _public_names() -> dict[int, str]:
    """id(class) -> the shortest public path lucid exports it under (module + __all__ name)."""
    import lucid

    names: dict[int, str] = {}
    modules = [lucid] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(lucid.__path__, "lucid.")
        if not _private(info.name)
    ]
    for module in modules:
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name, None)
            if isinstance(value, type):
                path = f"{module.__name__}.{name}"
                known = names.get(id(value))
                if known is None or len(path) < len(known):
                    names[id(value)] = path
    return names


def _public_bases(cls: type) -> list[str]:
    """The bases of `cls` as public paths, a private base replaced by its public bases."""
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return ["typing.NamedTuple"]
    out: list[str] = []
    for base in cls.__bases__:
        if base is object:
            continue
        path = f"{base.__module__}.{base.__qualname__}"
        if _private(path):
            public = _public_names().get(id(base))
            candidates = [public] if public else _public_bases(base)
        else:
            candidates = [path]
        out.extend(c for c in candidates if c not in out)
    return out


class PublicBases(griffe.Extension):
    """Rewrites each inspected class's bases by their public names; cleans NamedTuple fields."""

    def on_class_members(self, *, node: Any, cls: griffe.Class, **kwargs: Any) -> None:
        live = getattr(node, "obj", None)
        if not isinstance(live, type) or not (live.__module__ or "").startswith("lucid"):
            return
        cls.bases = _public_bases(live)
        for field in getattr(live, "_fields", ()) if issubclass(live, tuple) else ():
            member = cls.members.get(field)
            if isinstance(member, griffe.Attribute) and not member.is_alias:
                member.value = None
                if member.docstring and member.docstring.value.startswith("Alias for field"):
                    member.docstring = None
