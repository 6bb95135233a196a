"""Every ``Returns:`` section renders as one row per returned value on the docs site.

The site's mkdocstrings parses docstrings with griffe's Google parser, with the options
``mkdocs.yml`` gives it. Two of griffe's rules split one sentence into several typed rows:

* with ``returns_multiple_items`` on (griffe's default), every line of the section at the
  section's own indentation starts one more returned value, so a description wrapped
  without a deeper indent becomes a row per line, each typed from the return annotation;
* a first line ``word: text`` or ``(type): text`` is read as a value named ``word`` (or
  typed ``type``) described by ``text``: "Returns: updates: the new ..." is a row named
  ``updates``.

lucid's Returns sections describe what is returned in sentences (a tuple as one value), so
each must parse, with the site's options, as exactly one unnamed value. The docstrings are
every one ``tests/test_reference.py`` reads: the sources' (with ``ast``) and the live ones
of the public objects (some are generated at import time).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import griffe
import yaml
from test_reference import all_docstrings

ROOT = Path(__file__).resolve().parent.parent


def site_options() -> dict[str, Any]:
    """The Google parser options the site's mkdocstrings passes to griffe (mkdocs.yml)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            options = plugin["mkdocstrings"]["handlers"]["python"]["options"]
            assert options["docstring_style"] == "google"
            return dict(options.get("docstring_options", {}))
    raise AssertionError("mkdocs.yml configures no mkdocstrings python handler")


def returns_rows(doc: str, **options: Any) -> list[list[tuple[str, str]]]:
    """(name, description) of each row of each Returns section griffe parses from `doc`."""
    docstring = griffe.Docstring(inspect.cleandoc(doc))
    logger = logging.getLogger("griffe")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # its warnings (a missing type) are not the question
    try:
        parsed = docstring.parse(griffe.Parser.google, warnings=False, **options)
    finally:
        logger.setLevel(level)
    return [
        [(row.name, row.description) for row in section.value]
        for section in parsed
        if section.kind is griffe.DocstringSectionKind.returns
    ]


def split_tables(doc: str, **options: Any) -> list[str]:
    """What is wrong with each Returns section of `doc` that is not one unnamed row."""
    problems = []
    for rows in returns_rows(doc, **options):
        if len(rows) != 1:
            problems.append(f"{len(rows)} rows: {[description for _, description in rows]}")
        elif rows[0][0]:
            problems.append(f"a row named {rows[0][0]!r}: {rows[0][1][:60]!r}")
    return problems


def test_every_returns_section_is_one_row_on_the_site():
    options = site_options()
    found, checked = [], 0
    for where, doc in all_docstrings():
        if "Returns:" not in doc:
            continue
        checked += 1
        found += [f"{where}: {problem}" for problem in split_tables(doc, **options)]
    assert checked > 100, f"only {checked} Returns sections read: the collection broke"
    assert not found, "\n".join(sorted(set(found)))


def test_the_check_catches_split_tables():
    """The check above, on Returns sections griffe splits, and on ones it does not."""
    wrapped = """Summary.

    Returns:
      The new state, a pytree shaped like
      the parameters.
    """
    named = """Summary.

    Returns:
      updates: the new updates.
    """
    indented = """Summary.

    Returns:
      The new state, a pytree shaped like
        the parameters.
    """
    # griffe's defaults: a wrapped line is a second value; a deeper indent continues it
    assert len(split_tables(wrapped)) == 1
    assert [len(rows) for rows in returns_rows(wrapped)] == [2]
    assert split_tables(indented) == []
    # a word and a colon at the start is a name, whatever the options
    assert split_tables(named) == ["a row named 'updates': 'the new updates.'"]
    assert split_tables(named, **site_options()) == ["a row named 'updates': 'the new updates.'"]
    # the site's options read the wrapped sentence as one value
    assert split_tables(wrapped, **site_options()) == []
    assert returns_rows(wrapped, **site_options()) == [
        [("", "The new state, a pytree shaped like\nthe parameters.")]
    ]
