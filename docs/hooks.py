"""MkDocs hook: show the Sphinx roles left in docstrings as plain code.

Docstrings name other objects the Sphinx way (``:class:`~lucid.Parameter```);
mkdocstrings renders Markdown, where that reads ``:class:`` followed by the
code span. This keeps the code span and drops the role (and a leading ``~``,
which in Sphinx means "show the last component only").
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|obj|exc):<code>(~?)([^<]*)</code>")


def _code(match: re.Match) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **_) -> str:
    return _ROLE.sub(_code, html)
