"""The built documentation site shows lucid's API and nothing of its insides.

Reads every HTML page of a site built by ``mkdocs build --strict`` (the directory in
``LUCID_SITE_DIR``, else ``site/`` at the repository root, mkdocs' default) and fails on
what a reader must never see there:

* ``ForwardRef(`` in the rendered text: a type annotation shown as typing's repr
  (``ForwardRef('Any')`` in a NamedTuple's Attributes table);
* a memory address (``0x`` and six or more hex digits): an object's default repr, which
  is also a sign that a value was rendered that should not have been (a module's
  imports, a spec table);
* a private name as a rendered identifier: a base class (``Bases: ..._TrainEval``), an
  object heading, a name in a signature, or a code span that is a dotted name of lucid's
  with a private part (``lucid.optim._engine.Group``);
* a page over the size bound (``MAX_TEXT`` characters of visible text, ``MAX_HTML``
  bytes of HTML once inline images, scripts and styles are set aside): one module
  rendered with everything it imported made a 154,000-pixel page.

Without a built site the tests that read it skip, saying so; ``.ci/run`` builds the site
and then runs this file with ``LUCID_SITE_REQUIRED=1``, under which a missing site fails.
The checks themselves are tested on small pages written here, so they are known to catch
what they look for whether or not a site is present.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("LUCID_SITE_DIR") or ROOT / "site")
REQUIRED = os.environ.get("LUCID_SITE_REQUIRED") == "1"

MAX_TEXT = 300_000  # characters of visible text on one page (the largest is ~270,000)
MAX_HTML = 1_000_000  # bytes of HTML without inline images, scripts and styles

ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
PRIVATE_PART = re.compile(r"(?:^|\.)_(?!_)[A-Za-z0-9]")  # `_x`, not a dunder `__x__`
DOTTED = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*$")
NAME_IN_SIGNATURE = re.compile(r"(?<![\w.])_(?!_)[A-Za-z]\w*")
# other packages' private names that pages name on purpose, as the behaviour lucid matches
FOREIGN_PRIVATE = {
    "_fp32_to_bf16_sr",  # torchao's stochastic rounding, which lucid's reproduces
    "_zeropower_via_newtonschulz",  # torch's Muon iteration, which lucid's reproduces
    # torch's LRScheduler attributes, in its state_dict (and so in lucid's)
    "_last_lr",
    "_step_count",
    "_initial_step",
    # kron-torch's counters, kept on its optimizer object (lucid keeps them per parameter)
    "_prob_step",
    "_update_counter",
}
DATA_URI = re.compile(r"""(["'(])data:[^"')]*""")
INLINE_BLOCK = re.compile(r"<(script|style)\b[^>]*>.*?</\1>", re.S | re.I)


class _Page(HTMLParser):
    """The visible text of a page, its code spans (with where they are) and object ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.codes: list[tuple[str, str]] = []  # (where: "bases" | "signature" | "text", text)
        self.object_ids: list[str] = []
        self._stack: list[tuple[str, str]] = []  # (tag, class)
        self._code: list[str] | None = None
        self._skip = 0

    def _inside(self, css_class: str) -> bool:
        return any(css_class in classes.split() for _, classes in self._stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = attributes.get("class") or ""
        if tag in ("script", "style"):
            self._skip += 1
        if tag in ("br", "img", "input", "meta", "link", "hr", "wbr"):
            return
        if "doc-heading" in classes.split() and attributes.get("id"):
            self.object_ids.append(attributes["id"] or "")
        self._stack.append((tag, classes))
        if tag == "code" and self._code is None:
            self._code = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
        while self._stack:
            open_tag, _ = self._stack.pop()
            if open_tag == tag:
                break
        if (
            tag == "code"
            and self._code is not None
            and not any(t == "code" for t, _ in self._stack)
        ):
            where = (
                "bases"
                if self._inside("doc-class-bases")
                else "signature"
                if self._inside("doc-signature")
                else "text"
            )
            self.codes.append((where, "".join(self._code).strip()))
            self._code = None

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.text.append(data)
        if self._code is not None:
            self._code.append(data)


def read(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    page.close()
    return page


def problems(html: str) -> list[str]:
    """What a reader must not see on this page, one line each (empty: nothing)."""
    page = read(html)
    text = "".join(page.text)
    out = []
    if "ForwardRef(" in text:
        i = text.index("ForwardRef(")
        out.append(
            f"{text.count('ForwardRef(')} ForwardRef( in the text, first: {text[i : i + 40]!r}"
        )
    addresses = ADDRESS.findall(text)
    if addresses:
        out.append(f"{len(addresses)} memory addresses, first {addresses[0]}")
    for where, code in page.codes:
        if where == "bases":
            names = re.split(r"[\s,\[\]]+", code)
        elif where == "signature":
            names = NAME_IN_SIGNATURE.findall(code)
        else:
            names = [code] if DOTTED.match(code) else []
        for name in names:
            if where == "text" and name in FOREIGN_PRIVATE:
                continue
            if (
                name
                and PRIVATE_PART.search(name)
                and (where != "text" or name.startswith(("lucid", "_")))
            ):
                out.append(f"a private name in {where}: {name!r}")
    for object_id in page.object_ids:
        if object_id.startswith("lucid") and PRIVATE_PART.search(object_id):
            out.append(f"a private object rendered: {object_id!r}")
    if len(text) > MAX_TEXT:
        out.append(f"{len(text):,} characters of text (bound {MAX_TEXT:,})")
    bare = DATA_URI.sub(r"\1", INLINE_BLOCK.sub("", html))
    if len(bare.encode()) > MAX_HTML:
        out.append(f"{len(bare.encode()):,} bytes of HTML (bound {MAX_HTML:,})")
    return out


def pages() -> list[Path]:
    return sorted(p for p in SITE.rglob("*.html") if "assets" not in p.relative_to(SITE).parts)


def _site_pages() -> list[Path]:
    if REQUIRED and not pages():
        raise AssertionError(f"LUCID_SITE_REQUIRED=1 but {SITE} holds no built site")
    return pages()


PAGES = _site_pages()
needs_site = pytest.mark.skipif(
    not PAGES,
    reason=f"no built site in {SITE}: build it with `mkdocs build --strict` (or set "
    "LUCID_SITE_DIR to one); .ci/run builds it and runs this file after",
)


@needs_site
def test_the_site_has_its_pages():
    names = {p.relative_to(SITE).as_posix() for p in PAGES}
    for expected in ("index.html", "reference/optim.html", "benchmarks.html", "extending.html"):
        assert expected in names, f"{expected} missing from {SITE}"


@needs_site
@pytest.mark.parametrize(
    "page", PAGES or [None], ids=[p.relative_to(SITE).as_posix() for p in PAGES] or ["none"]
)
def test_page_shows_the_api_only(page):
    found = problems(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(SITE)}:\n  " + "\n  ".join(found)


@needs_site
def test_the_optimizer_reference_leaves_the_engine_hooks_to_extending():
    optim = read((SITE / "reference/optim.html").read_text(encoding="utf-8")).object_ids
    extending = read((SITE / "extending.html").read_text(encoding="utf-8")).object_ids
    hooks = ["begin_step", "end_step", "engine_groups", "use_backend", "import_state"]
    for hook in hooks:
        assert f"lucid.optim.Optimizer.{hook}" not in optim
        assert f"lucid.optim.Optimizer.{hook}" in extending
    for torch_api in ["step", "zero_grad", "state_dict", "load_state_dict", "add_param_group"]:
        assert f"lucid.optim.Optimizer.{torch_api}" in optim


@needs_site
def test_each_scheduler_entry_shows_its_plot():
    html = (SITE / "reference/lr_scheduler.html").read_text(encoding="utf-8")
    entries = re.split(
        r'(?=<h2 id="lucid\.optim\.lr_scheduler\.\w+" class="doc doc-heading")', html
    )
    plotted = {}
    for entry in entries[1:]:
        name = re.match(r'<h2 id="lucid\.optim\.lr_scheduler\.(\w+)"', entry).group(1)
        # in the entry, above its first section (Parameters:), as torch's docs place it
        at = entry.find(f'src="../assets/schedules/{name}.png"')
        sections = entry.find("doc-section-title")
        plotted[name] = at >= 0 and (sections < 0 or at < sections)
    missing = [name for name, shown in plotted.items() if not shown and name != "LRScheduler"]
    assert len(plotted) >= 16 and not missing, f"scheduler entries without their plot: {missing}"


# --------------------------------------------------- the checks, on pages written here
def _doc(body: str) -> str:
    return f"<html><head><style>.x{{}}</style></head><body>{body}</body></html>"


def test_a_clean_page_passes():
    html = _doc(
        '<h2 id="lucid.optim.Adam" class="doc doc-heading">Adam</h2>'
        '<p class="doc doc-class-bases">Bases: <code>lucid.optim.Optimizer</code></p>'
        '<div class="doc-signature highlight"><pre><code>Adam(params, lr=0.001, '
        "__call__=None)</code></pre></div><p>torch's <code>_fp32_to_bf16_sr</code>, "
        "<code>x = ||u||_F</code>, <code>param_groups</code>, <code>__call__</code>, "
        '0x1f, <img src="data:image/png;base64,' + "A" * (MAX_HTML + 10) + '"></p>'
    )
    assert problems(html) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("<td>ForwardRef('Any')</td>", "ForwardRef("),
        ("<pre>SPECS = {Adam: &lt;Rule at 0x7f3a2b1c9d00&gt;}</pre>", "memory addresses"),
        (
            '<p class="doc doc-class-bases">Bases: <code>lucid.optim.schedulefree._TrainEval'
            "</code></p>",
            "private name in bases",
        ),
        ('<h3 id="lucid.functional._lowbit.bnb" class="doc doc-heading">x</h3>', "private object"),
        ('<div class="doc-signature"><pre><code>f(x=_MISSING)</code></pre></div>', "signature"),
        ("<p>one <code>lucid.optim._engine.Group</code> per group</p>", "private name in text"),
        ("<p>see <code>_ops</code></p>", "private name in text"),
        ("<p>" + "word " * (MAX_TEXT // 5 + 1) + "</p>", "characters of text"),
        ("<!--" + "x" * MAX_HTML + "-->", "bytes of HTML"),
    ],
)
def test_each_check_catches_what_it_looks_for(body, expected):
    found = problems(_doc(body))
    assert any(expected in line for line in found), found


# ------------------------------------------- the pages agree with their sources (no site)
def _speed_figures(readme: str) -> list[str]:
    """The benchmark figures the README quotes: its lines that name an H200, as they print."""
    figures = []
    for paragraph in readme.split("\n\n"):
        if "H200" not in paragraph:
            continue
        for low, high in re.findall(r"(\d+\.\d+)-(\d+\.\d+)x", paragraph):
            figures += [f"{low}x", f"{high}x"]
        figures += re.findall(r"\d+\.\d+(?= ms)", paragraph)
    return figures


def test_the_readme_quotes_the_benchmarks_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    figures = _speed_figures(readme)
    assert len(figures) >= 8, figures  # the speed paragraph and the low-bit row
    missing = [f for f in figures if f not in page]
    assert not missing, f"README quotes figures docs/benchmarks.md does not have: {missing}"


def test_getting_started_lists_every_extra_as_pyproject_has_it():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", page, re.M)}
    assert set(rows) == set(extras), (sorted(rows), sorted(extras))
    for extra, requirements in extras.items():
        for requirement in requirements:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            assert name.lower() in rows[extra].lower(), f"`{extra}` row does not name {name}"
