""".ci/check_offline_site.py: what it flags in a built site, and what it lets pass.

CI runs it on the site ``mkdocs build --strict`` just built; here it reads a
small made-up site, so that a reference it should catch is known to be caught.
"""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_offline_site", ROOT / ".ci" / "check_offline_site.py"
)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

FETCHED = """<!doctype html>
<html><head>
<link rel="stylesheet" href="https://fonts.example.com/css?family=Roboto">
<link rel="preconnect" href="//fonts.example.com">
<script src="https://cdn.example.com/mathjax/tex-chtml.js"></script>
<style>@import "https://cdn.example.com/theme.css";
.x { background: url(http://img.example.com/a.png) }</style>
<script type="module">const m = (await import("https://cdn.example.com/mermaid.mjs")).default;</script>
</head><body>
<img src="https://img.example.com/b.png">
<img srcset="b.png 1x, https://img.example.com/b2.png 2x">
<iframe src="https://video.example.com/embed/1"></iframe>
<div style="background-image: url('https://img.example.com/c.png')"></div>
<svg><use xlink:href="https://icons.example.com/sprite.svg#i"></use></svg>
</body></html>
"""

LOCAL = """<!doctype html>
<html><head>
<link rel="canonical" href="https://lucid.example.com/page/">
<link rel="stylesheet" href="../assets/main.css">
<script src="../javascripts/mathjax/tex-svg-full.js"></script>
<style>
.y { background: url("data:image/svg+xml,<svg xmlns='http://www.w3.org/2000/svg'/>") }
</style>
<script>const ns = "http://www.w3.org/2000/svg"; import("./local.js");</script>
</head><body>
<a href="https://github.com/pytorch/pytorch">a hyperlink is fine</a>
<svg xmlns="http://www.w3.org/2000/svg"><a href="https://example.com">so is this</a></svg>
<img src="data:image/png;base64,iVBORw0KGgo=">
</body></html>
"""


def _site(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_flags_every_kind_of_remote_load(tmp_path, capsys):
    site = _site(
        tmp_path,
        {
            "page/index.html": FETCHED,
            "assets/extra.css": "@font-face { src: url(https://fonts.example.com/r.woff2) }",
            "assets/app.js": 'importScripts("https://cdn.example.com/worker-lib.js")',
        },
    )
    assert check.main([str(site)]) == 1
    out = capsys.readouterr().out
    for url in [
        "https://fonts.example.com/css?family=Roboto",
        "//fonts.example.com",
        "https://cdn.example.com/mathjax/tex-chtml.js",
        "https://cdn.example.com/theme.css",
        "http://img.example.com/a.png",
        "https://cdn.example.com/mermaid.mjs",
        "https://img.example.com/b.png",
        "https://img.example.com/b2.png",
        "https://video.example.com/embed/1",
        "https://img.example.com/c.png",
        "https://icons.example.com/sprite.svg#i",
        "https://fonts.example.com/r.woff2",
        "https://cdn.example.com/worker-lib.js",
    ]:
        assert url in out, url
    assert "page/index.html:5: <script src=https://cdn.example.com/mathjax/tex-chtml.js>" in out
    assert "13 reference(s) to other hosts" in out


def test_passes_hyperlinks_and_local_files(tmp_path, capsys):
    site = _site(tmp_path, {"page/index.html": LOCAL, "assets/main.css": ".z { color: red }"})
    assert check.main([str(site)]) == 0
    assert "nothing loaded from another host" in capsys.readouterr().out


def test_an_empty_site_fails(tmp_path, capsys):
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "main.css").write_text(".z { color: red }")
    assert check.main([str(tmp_path)]) == 1
    assert "nothing was checked" in capsys.readouterr().out
