"""A griffe extension: attribute types from the live classes' annotations.

The site reads lucid's live objects (``force_inspection``: signatures and Args are made at
import time), and griffe's inspector types no class attribute: a NamedTuple's fields, a
dataclass's, a class's ``x: ClassVar[T] = ...`` all rendered with an empty Type column in
the ``Attributes`` tables. This extension gives each class member the annotation its class
(or a lucid base) declares, and declares an annotated name the class only sets on its
instances (``param_groups: list[dict]`` in a class body) as an attribute with that type,
which the ``Attributes`` table then shows; such an attribute has no docstring of its own, so
it is not rendered as a member (``show_if_no_docstring`` is off). A type alias kept on a
class becomes a ``TypeAlias`` attribute. (griffe's Google parser carries a row's type over
to the next row whose name it cannot type, so an untyped row after a typed one showed the
previous row's type: every row here is typed or none after it.)
"""

from __future__ import annotations

import inspect
import re
from typing import Any, ClassVar, ForwardRef, get_args, get_origin

import griffe

_CLASSVAR = re.compile(r"^(?:typing\.)?ClassVar\[(.*)\]$", re.S)


def _text(annotation: Any) -> str:
    """An annotation as the source spells it, without ``ClassVar[...]``."""
    if isinstance(annotation, ForwardRef):
        # a NamedTuple's fields under `from __future__ import annotations`: typing wraps each
        # string annotation in a ForwardRef, whose repr would show as `ForwardRef('Any')`
        annotation = annotation.__forward_arg__
    if isinstance(annotation, str):
        match = _CLASSVAR.match(annotation.strip())
        return match.group(1) if match else annotation
    if get_origin(annotation) is ClassVar:
        args = get_args(annotation)
        return _text(args[0]) if args else "Any"
    return inspect.formatannotation(annotation)


def _annotations(cls: type) -> dict[str, str]:
    """Name -> annotation text over `cls` and its bases defined in lucid (nearest first)."""
    out: dict[str, str] = {}
    for base in cls.__mro__:
        module = getattr(base, "__module__", "") or ""
        if base is not cls and not module.startswith("lucid"):
            continue
        for name, annotation in vars(base).get("__annotations__", {}).items():
            out.setdefault(name, _text(annotation))
    return out


class LiveAnnotations(griffe.Extension):
    """Types the members of every inspected class from its live annotations."""

    def on_class_members(self, *, node: Any, cls: griffe.Class, **kwargs: Any) -> None:
        live = getattr(node, "obj", None)
        if not isinstance(live, type):
            return
        for name, member in list(cls.members.items()):
            value = getattr(live, name, None)
            if member.is_alias and get_origin(value) is not None:
                # a type alias kept on the class (torch's `Optimizer.OptimizerPreHook`):
                # inspection makes it an alias of `collections.abc.Callable`, and griffe's
                # Attributes table then carries the row above's type over to it; it is a
                # TypeAlias whose value is the live one
                alias = griffe.Attribute(name, value=_text(value), parent=cls)
                alias.annotation = "TypeAlias"
                alias.docstring = griffe.Docstring(f"A type alias: `{_text(value)}`.", parent=alias)
                cls.set_member(name, alias)
        for name, annotation in _annotations(live).items():
            member = cls.members.get(name)
            if member is None:
                cls.set_member(name, griffe.Attribute(name, annotation=annotation, parent=cls))
            elif (
                isinstance(member, griffe.Attribute)
                and not member.is_alias
                and member.annotation is None
            ):
                member.annotation = annotation
