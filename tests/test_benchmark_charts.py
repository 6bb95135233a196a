"""The charts of the benchmarks page and the per-scheduler plots are drawn by scripts that run.

docs/benchmarks.md shows SVGs that ``benchmarks/plot_results.py`` draws from the raw results
in ``benchmarks/results/``; the API reference shows, on each scheduler's entry, a PNG that
``examples/schedules_gallery.py --each`` draws; the matrix optimizers' page shows sharded
Muon's layout, which ``docs/assets/matrix/plot_sharded_muon.py`` draws. The scripts run here
into a temporary folder: a results file whose format changed, or a scheduler renamed, fails
here rather than leaving the site with a stale chart. Every chart the scripts draw is one
the docs show, and every chart the docs show is committed.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shown(folder: str) -> set[str]:
    """Names of the images under docs/assets/<folder>/ that some page shows."""
    names = set()
    for page in DOCS.rglob("*.md"):
        names |= set(re.findall(rf"assets/{folder}/([\w.-]+)\)", page.read_text()))
    return names


def test_the_benchmark_charts_draw_from_the_results(tmp_path):
    plot_results = _load(ROOT / "benchmarks" / "plot_results.py")
    paths = plot_results.main(["--out", str(tmp_path)])
    drawn = {p.name for p in paths}
    assert drawn and all(p.stat().st_size > 5000 for p in paths)
    assert "<svg" in paths[0].read_text()[:500]
    assert drawn == _shown("benchmarks"), "a chart drawn but not shown, or shown but not drawn"
    for name in drawn:
        assert (DOCS / "assets" / "benchmarks" / name).is_file(), f"{name} is not committed"


def test_every_scheduler_has_its_plot(tmp_path):
    pytest.importorskip("torch")
    import lucid.optim.lr_scheduler as LL

    gallery = _load(ROOT / "examples" / "schedules_gallery.py")
    written = gallery.draw_each(gallery.panels(), tmp_path)
    drawn = {p.name for p in written}
    schedulers = {
        f"{name}.png"
        for name in LL.__all__
        if isinstance(getattr(LL, name), type)
        and issubclass(getattr(LL, name), LL.LRScheduler)
        and getattr(LL, name) is not LL.LRScheduler
    }
    assert schedulers <= drawn, f"schedulers without a plot: {sorted(schedulers - drawn)}"
    assert drawn == _shown("schedules") == {p.name for p in (DOCS / "assets/schedules").iterdir()}


def test_the_sharded_muon_figure_draws_from_its_script(tmp_path):
    """docs/optimizers/matrix.md's layout figure is its script's drawing, committed: the
    script draws it again pixel for pixel (nothing in it is measured, random or dated; the
    pixels, not the bytes, so that another PNG encoder's compression does not count)."""
    from matplotlib.image import imread

    folder = DOCS / "assets" / "matrix"
    script = _load(folder / "plot_sharded_muon.py")
    drawn = script.draw(tmp_path / "sharded_muon.png")
    assert {drawn.name} == _shown("matrix"), "a figure drawn but not shown, or shown but not drawn"
    committed = folder / drawn.name
    assert committed.is_file(), f"{drawn.name} is not committed"
    assert committed.stat().st_size < 150_000
    assert (imread(drawn) == imread(committed)).all(), (
        "the committed figure is not what the script draws: run "
        "python docs/assets/matrix/plot_sharded_muon.py"
    )
