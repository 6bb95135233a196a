"""MkDocs hook: the example notebooks (``examples/*.ipynb``, outside docs_dir) as site pages.

mkdocs-jupyter renders the ``.ipynb`` files among the site's files. This hook
adds the notebooks of ``examples/`` to them, before that plugin looks, as
``examples/<name>.ipynb``: the nav and docs/examples.md name them by that path,
and each page is built at ``examples/<name>/``. No copy or link of the files
is kept in docs/, so a fresh clone builds as it is. The pages show the
outputs stored in the notebooks (mkdocs-jupyter's ``execute: false``);
examples/execute_notebooks.py stores them and tests/test_notebooks.py holds
them current.

On those pages the hook also

* points the notebooks' relative links, written for the code host (for
  example ``../docs/benchmarks.md``), at the site's pages, and warns (an error
  under ``--strict``) about one that has no page on the site;
* drops the MathJax 2 and mermaid loaders that nbconvert's template writes
  into every notebook, both from cdnjs: every page of the site loads the
  MathJax bundled in docs/javascripts/, whose configuration typesets notebook
  Markdown as well, and no notebook draws a mermaid diagram;
* points the theme's "Skip to content" link at the notebook's first heading
  where mkdocs-jupyter's table of contents names an anchor the page lacks (a
  title with code spans, "`compile_optimizer` and `fused_step`", gave ``#and``
  while nbconvert wrote ``id="compile_optimizer-and-fused_step"``).

A progress bar (tqdm writes to stderr) is shown as plain output, not in the
error colour nbconvert's CSS gives stderr: docs/stylesheets/extra.css.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from urllib.parse import unquote

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

FOLDER = "examples"  # in the repository, and as the pages' place on the site
log = logging.getLogger(f"mkdocs.hooks.{__name__}")

_MATHJAX_LOADER = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
_MERMAID_LOADER = re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid.*?</script>', re.S)
_LINK = re.compile(r'(<a\s[^>]*?href=")([^"#]+)((?:#[^"]*)?")')
_SKIP = re.compile(r'(<a href="#)([^"]*)(" class="md-skip">)')
_FIRST_HEADING = re.compile(r'<h[1-6] id="([^"]+)"')


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _is_notebook(page: Page) -> bool:
    uri = page.file.src_uri
    return uri.startswith(f"{FOLDER}/") and uri.endswith(".ipynb")


@event_priority(100)  # before mkdocs-jupyter's on_files, which takes over .ipynb files
def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    for path in sorted((root / FOLDER).glob("*.ipynb")):
        uri = f"{FOLDER}/{path.name}"
        if files.get_file_from_path(uri) is None:
            files.append(File(uri, str(root), config.site_dir, config.use_directory_urls))
    return files


def on_serve(server, config: MkDocsConfig, builder):
    server.watch(str(_root(config) / FOLDER))
    return server


def _site_url(target: str, page: Page, config: MkDocsConfig, files: Files) -> str | None:
    """The site's URL (relative to ``page``) of the page a repository-relative link names."""
    in_repo = posixpath.normpath(posixpath.join(FOLDER, unquote(target)))
    docs = Path(config.docs_dir).resolve().relative_to(_root(config)).as_posix()
    uri = in_repo.removeprefix(f"{docs}/") if in_repo.startswith(f"{docs}/") else in_repo
    file = files.get_file_from_path(uri)
    return None if file is None else file.url_relative_to(page.file)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if not _is_notebook(page):
        return html
    html = _MERMAID_LOADER.sub("", _MATHJAX_LOADER.sub("", html))

    def relink(match: re.Match) -> str:
        start, target, end = match.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("/"):
            return match.group(0)  # a URL, not a path in the repository
        url = _site_url(target, page, config, files)
        if url is None:
            log.warning("%s links to '%s', which is no page of the site", page.file.src_uri, target)
            return match.group(0)
        return f"{start}{url}{end}"

    return _LINK.sub(relink, html)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    if not _is_notebook(page):
        return output
    skip = _SKIP.search(output)
    heading = _FIRST_HEADING.search(output)
    if skip and heading and f'id="{skip.group(2)}"' not in output:
        output = output[: skip.start(2)] + heading.group(1) + output[skip.end(2) :]
    return output
