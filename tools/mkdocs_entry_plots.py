"""MkDocs hook: a scheduler's plot sits at the top of its reference entry, as in torch's docs.

A reference page shows each scheduler's plot by an image right after the scheduler's
``:::`` directive (``![...](../assets/schedules/StepLR.png)``), which Markdown can only put
after the whole entry: past its arguments, attributes and examples. This hook moves each
such image (a paragraph holding only an image from ``assets/schedules/``) into the entry
rendered just before it, after the entry's summary line (its first paragraph, below the
``Bases:`` line where there is one). An image with no entry before it stays where it is.
"""

from __future__ import annotations

import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

_PLOT = re.compile(r'<p><img alt="[^"]*" src="[^"]*assets/schedules/[\w.-]+\.png" /></p>')
_HEADING = re.compile(r'<h([1-6]) id="[^"]+" class="doc doc-heading"')
_CONTENTS = '<div class="doc doc-contents'
_BASES = re.compile(r'\s*<p class="doc doc-class-bases">.*?</p>', re.S)
_FIRST_PARAGRAPH = re.compile(r"\s*<p>.*?</p>", re.S)


def _moved(html: str, plot: re.Match, start: int) -> str | None:
    """The page with `plot` moved under its entry's summary, or None where it has none.

    The entry is the last object rendered between `start` (the previous plot) and the plot
    at the outermost heading level there: a class's members have headings of their own, one
    level deeper.
    """
    headings = list(_HEADING.finditer(html, start, plot.start()))
    if not headings:
        return None
    top = min(int(h.group(1)) for h in headings)
    entry = [h for h in headings if int(h.group(1)) == top][-1]
    contents = html.find(_CONTENTS, entry.end(), plot.start())
    if contents < 0:
        return None
    at = html.index(">", contents) + 1
    bases = _BASES.match(html, at)
    at = bases.end() if bases else at
    summary = _FIRST_PARAGRAPH.match(html, at)
    at = summary.end() if summary else at
    image = plot.group(0).replace("<p>", '<p class="entry-plot">', 1)
    return html[:at] + "\n" + image + html[at : plot.start()] + html[plot.end() :]


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    # last to first: a plot moves back into the entry just before it, after the plot before
    # that one, so the places of the plots not yet moved do not change
    plots = list(_PLOT.finditer(html))
    for k in reversed(range(len(plots))):
        start = plots[k - 1].end() if k else 0
        html = _moved(html, plots[k], start) or html
    return html
