"""Every public module of lucid says what its API is, in ``__all__``.

A public module is one whose dotted name has no part with a leading underscore. Its
``__all__`` is what ``from module import *`` gives, what the docs site renders of it
(``tools/griffe_exports.py``) and, for a package, everything its namespace shows: a
package's namespace is the API, nothing that its own code imported to do its work.
A module of implementation (``lucid.optim.bnb``, ``lucid.functional.adam``) keeps the names
other modules of lucid read from it (``ADAM``, ``ADAM_SIGNATURE``) outside ``__all__``:
importable, undocumented, not part of the API.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import types
from pathlib import Path

import griffe
import pytest
import yaml

import lucid


def _public_modules() -> list[str]:
    names = ["lucid"]
    for info in pkgutil.walk_packages(lucid.__path__, "lucid."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def _packages() -> list[str]:
    modules = _public_modules()
    return [name for name in modules if hasattr(importlib.import_module(name), "__path__")]


PUBLIC = _public_modules()
# modules that only gather other modules' objects under one name, as packages do
REEXPORTS = ["lucid.optim.lr_scheduler"]


def test_the_walk_finds_the_public_modules():
    """The walk sees every public module, and no private one (a walk that found nothing
    would pass every test below)."""
    for name in ["lucid", "lucid.optim", "lucid.optim.bnb", "lucid.functional.schedules.decay"]:
        assert name in PUBLIC
    assert not [name for name in PUBLIC if "._" in name]
    assert len(PUBLIC) > 60


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_module_declares_its_api(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    exported = module.__all__
    assert isinstance(exported, list | tuple)
    assert all(isinstance(entry, str) for entry in exported)
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    missing = [entry for entry in exported if not hasattr(module, entry)]
    assert not missing, f"{name}.__all__ names what the module lacks: {missing}"
    private = [entry for entry in exported if entry.startswith("_")]
    assert not private, f"{name}.__all__ exports private names: {private}"


@pytest.mark.parametrize("name", [*_packages(), *REEXPORTS])
def test_a_package_namespace_is_its_api(name):
    """``dir(package)``, less dunders, private names and submodules, is ``__all__``."""
    module = importlib.import_module(name)
    shown = {
        key
        for key, value in vars(module).items()
        if not key.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert shown == set(module.__all__) - {
        key for key in module.__all__ if isinstance(getattr(module, key), types.ModuleType)
    }


def test_the_names_the_issue_found_are_gone():
    """The helpers that leaked into the namespaces of the low-bit families (and so into the
    docs) are no longer there."""
    import lucid.functional.bnb
    import lucid.optim.bnb
    import lucid.optim.torchao

    assert not {"SPECS", "WRAPPED"} & set(dir(lucid.optim.bnb))
    assert "SPECS" not in dir(lucid.functional.bnb)
    assert not {"FORM_OF", "SIGNED", "MOMENTS"} & set(dir(lucid.optim.torchao))


ROOT = Path(__file__).resolve().parent.parent


def _site_options() -> dict:
    """The options the site's mkdocstrings python handler runs with (mkdocs.yml)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            return plugin["mkdocstrings"]["handlers"]["python"]["options"]
    raise AssertionError("mkdocs.yml configures no mkdocstrings python handler")


def _extensions(entries: list) -> griffe.Extensions:
    """mkdocs.yml's griffe extensions (paths relative to the repository, as mkdocs runs)."""
    return griffe.load_extensions(
        *(str(ROOT / e) if isinstance(e, str) and ".py:" in e else e for e in entries)
    )


def _documented_modules() -> list[str]:
    """Every module a page renders with ``::: name``."""
    names = set()
    for page in (ROOT / "docs").rglob("*.md"):
        for match in re.finditer(r"^::: ([\w.]+)", page.read_text(), flags=re.M):
            name = match[1]
            if importlib.util.find_spec(name.rsplit(".", 1)[0]) is None:
                continue
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue  # an object, not a module
            if hasattr(module, "__all__") and getattr(module, "__name__", "") == name:
                names.add(name)
    return sorted(names)


@pytest.mark.parametrize("name", _documented_modules())
def test_the_site_renders_a_module_as_its_api(name):
    """A module the docs render (``::: lucid.optim.bnb``) has, as the site's griffe reads it
    (the extensions of mkdocs.yml, live inspection), exactly ``__all__`` beside its
    submodules: not ``SPECS``, ``TYPE_CHECKING``, ``Mapping`` or the whole ``Optimizer``."""
    options = _site_options()
    assert options["force_inspection"]
    extensions = _extensions(options["extensions"])
    module = importlib.import_module(name)
    members = griffe.inspect(name, extensions=extensions).members
    shown = {key for key in members if not isinstance(getattr(module, key, None), types.ModuleType)}
    assert shown == {
        key for key in module.__all__ if not isinstance(getattr(module, key), types.ModuleType)
    }


def test_the_site_renders_lucid_optim_bnb_as_its_api():
    """Without tools/griffe_exports.py, griffe shows what lucid.optim.bnb imported: this is
    what the test above guards against."""
    options = _site_options()
    kept = [e for e in options["extensions"] if "griffe_exports" not in str(e)]
    assert len(kept) < len(options["extensions"])
    members = griffe.inspect("lucid.optim.bnb", extensions=_extensions(kept)).members
    assert {"Mapping", "TYPE_CHECKING", "Optimizer"} <= set(members)
