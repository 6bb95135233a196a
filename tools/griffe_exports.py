"""A griffe extension: a module's members on the site are its ``__all__``.

The site reads lucid's live modules (``force_inspection``), and griffe's inspector lists
everything a module's namespace holds: what its code imported to do its work (``Any``,
``Mapping``, ``TYPE_CHECKING``), the helpers other modules of lucid read from it, the
whole ``Optimizer`` again. ``::: lucid.optim.bnb`` rendered all of it. This extension
keeps, of each module that declares ``__all__``, the members it lists and its submodules
(which pages name one by one, ``::: lucid.optim.optimizer.RemovableHandle``), so every
page shows a module's API and nothing else; ``tests/test_public_api.py`` checks that
every public module declares one.
"""

from __future__ import annotations

import types
from typing import Any

import griffe


class ExportsOnly(griffe.Extension):
    """Drops from each inspected module the members its ``__all__`` does not list."""

    def on_module_members(self, *, node: Any, mod: griffe.Module, **kwargs: Any) -> None:
        live = getattr(node, "obj", None)
        exported = getattr(live, "__all__", None)
        if not isinstance(live, types.ModuleType) or exported is None:
            return
        for name in list(mod.members):
            value = getattr(live, name, None)
            submodule = isinstance(value, types.ModuleType) and value.__name__.startswith(
                live.__name__ + "."
            )
            if name not in exported and not submodule:
                del mod.members[name]
