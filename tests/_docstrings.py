"""Reading Google-style docstrings (as griffe reads them), for the tests of the docs."""

from __future__ import annotations

import re

# Google section headers (griffe's), synonyms mapped to one name
SECTIONS = {
    "Args": "Args",
    "Arguments": "Args",
    "Parameters": "Args",
    "Params": "Args",
    "Attributes": "Attributes",
    "Returns": "Returns",
    "Return": "Returns",
    "Yields": "Yields",
    "Raises": "Raises",
    "Warns": "Warns",
    "Examples": "Examples",
    "Example": "Examples",
    "Note": "Notes",
    "Notes": "Notes",
    "Warning": "Warnings",
    "Warnings": "Warnings",
}
ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:")


def sections(doc: str) -> dict[str, list[str]]:
    """A cleaned docstring's Google sections: header -> the lines under it."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        header = line.rstrip()
        if header.endswith(":") and header[:-1] in SECTIONS:
            current = out.setdefault(SECTIONS[header[:-1]], [])
        elif current is not None:
            if line and not line[0].isspace():
                current = None  # back to prose
            else:
                current.append(line)
    return out


def entry_texts(lines: list[str]) -> dict[str, str]:
    """A section's entries (``name: text`` or ``name (type): text``), read at the
    indentation of its first entry: ``{name: text}``, continuation lines joined."""
    body = [line for line in lines if line.strip()]
    if not body:
        return {}
    indent = len(body[0]) - len(body[0].lstrip())
    texts: dict[str, str] = {}
    for line in body:
        if len(line) - len(line.lstrip()) == indent:
            match = ENTRY.match(line.strip())
            assert match, f"not a section entry: {line.strip()!r}"
            name = match.group(1)
            texts[name] = line.strip()[match.end() :].strip()
        else:
            texts[name] += " " + line.strip()
    return texts


def entries(lines: list[str]) -> list[str]:
    """The names of a section's entries, in order."""
    return list(entry_texts(lines))


def section_names(doc: str, *headers: str) -> list[str] | None:
    """The entry names of the first of ``headers`` present (None: none present)."""
    found = sections(doc)
    for header in headers:
        if header in found:
            return entries(found[header])
    return None
