"""Fail when a built site would load anything from the network by itself.

    python .ci/check_offline_site.py SITE_DIR

Builds nothing: reads every .html, .css and .js file under SITE_DIR and lists
each reference to an absolute URL (``http://``, ``https://`` or ``//host``)
that a browser fetches without being asked:

* HTML: ``src``, ``srcset``, ``data``, ``poster`` and ``href`` of any element
  but a hyperlink (``<a>``, ``<area>``) or a ``<link>`` whose ``rel`` names a
  relation browsers do not fetch (``canonical``, ``alternate``, ...); that is
  scripts, stylesheets, icons, preloads and preconnects, images, iframes,
  SVG ``<use>``/``<image>``;
* CSS, in .css files, ``<style>`` elements and ``style`` attributes:
  ``url(...)`` and ``@import``;
* JavaScript, in .js files and inline ``<script>``: ``import(...)``,
  ``import ... from``, ``importScripts(...)`` of a URL literal.

Hyperlinks a reader clicks are fine. Exits 1 listing ``file:line: what``
(or when SITE_DIR holds no HTML page), 0 when the site loads nothing from
elsewhere.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

ABSOLUTE = re.compile(r"\s*(?:https?:)?//", re.I)
LOADING_ATTRIBUTES = {"src", "srcset", "data", "poster", "href", "xlink:href"}
HYPERLINKS = {"a", "area"}
# <link rel=...> values for which a browser fetches nothing (a canonical URL, a feed, ...)
NOT_FETCHED = {
    "alternate", "author", "bookmark", "canonical", "external", "help", "license", "me",
    "next", "nofollow", "noopener", "noreferrer", "prev", "search", "tag",
}  # fmt: skip
CSS_URL = re.compile(r"""url\(\s*(['"]?)([^'")]*)\1\s*\)|@import\s+(['"])([^'"]*)\3""", re.I)
JS_IMPORT = re.compile(
    r"""(?:\bimport\s*\(\s*|\bimport\s[^'"`;()]*?\bfrom\s*|\bimportScripts\s*\(\s*)(['"`])([^'"`]*)\1"""
)


def _absolute(url: str) -> bool:
    return bool(ABSOLUTE.match(url))


def css_references(css: str) -> list[tuple[int, str]]:
    """(line offset, URL) of the absolute url(...) and @import targets in a stylesheet."""
    found = []
    for match in CSS_URL.finditer(css):
        url = match.group(2) if match.group(2) is not None else match.group(4)
        if _absolute(url):
            found.append((css.count("\n", 0, match.start()), url.strip()))
    return found


def js_references(js: str) -> list[tuple[int, str]]:
    """(line offset, URL) of the modules and scripts a script imports from a URL literal."""
    return [
        (js.count("\n", 0, m.start()), m.group(2))
        for m in JS_IMPORT.finditer(js)
        if _absolute(m.group(2))
    ]


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[int, str]] = []
        self._inside: str | None = None  # "style" or "script" while in one

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        line = self.getpos()[0]
        values = {name: value or "" for name, value in attrs}
        rel = set(values.get("rel", "").lower().split())
        for name, value in values.items():
            if name == "style":
                self.found += [
                    (line, f"<{tag} style> url {url}") for _, url in css_references(value)
                ]
            if name not in LOADING_ATTRIBUTES:
                continue
            if name in ("href", "xlink:href") and tag in HYPERLINKS:
                continue
            if tag == "link" and rel and rel <= NOT_FETCHED:
                continue
            urls = [part.split()[0] for part in value.split(",") if part.split()]
            urls = urls if name == "srcset" else [value]
            self.found += [
                (line, f"<{tag} {name}={url.strip()}>") for url in urls if _absolute(url)
            ]
        if tag in ("style", "script"):
            self._inside = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._inside:
            self._inside = None

    def handle_data(self, data: str) -> None:
        if self._inside is None:
            return
        line = self.getpos()[0]
        scan = css_references if self._inside == "style" else js_references
        what = "<style> url" if self._inside == "style" else "<script> import"
        self.found += [(line + offset, f"{what} {url}") for offset, url in scan(data)]


def references(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each absolute URL the file makes a browser load."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".css":
        return [(1 + offset, f"url {url}") for offset, url in css_references(text)]
    if path.suffix == ".js":
        return [(1 + offset, f"import {url}") for offset, url in js_references(text)]
    page = _Page()
    page.feed(text)
    page.close()
    return page.found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    site = Path(argv[0])
    files = sorted(p for p in site.rglob("*") if p.suffix in (".html", ".css", ".js"))
    if not any(p.suffix == ".html" for p in files):
        print(f"no HTML page under {site}: nothing was checked")  # a check that read nothing
        return 1
    problems = [
        f"{path.relative_to(site)}:{line}: {what}"
        for path in files
        for line, what in references(path)
    ]
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} reference(s) to other hosts: the site is not usable offline")
        return 1
    print(f"{len(files)} HTML/CSS/JS files: nothing loaded from another host")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
