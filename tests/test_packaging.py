"""The wheel is ready to publish: one version (``lucid.__version__``), the license file and
its SPDX expression, the README as the long description, ``py.typed`` and every stub, and a
changelog entry for the version.

The wheel is built once, with the environment's setuptools (``--no-build-isolation``:
offline), from a copy of the files the build reads, so the build leaves nothing in the
working tree. CI also builds the sdist and wheel with ``python -m build``, runs
``twine check --strict`` on them and the fast tests against the installed wheel
(``.ci/run``).
"""

from __future__ import annotations

import email
import email.message
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lucid

ROOT = Path(__file__).resolve().parents[1]
BUILT_FROM = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "CHANGELOG.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT / "lucid", source / "lucid", ignore=shutil.ignore_patterns("__pycache__"))
    for name in BUILT_FROM:
        shutil.copy(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*command, "-q", "-w", str(tmp / "dist"), str(source)], check=True, capture_output=True
    )
    (path,) = (tmp / "dist").glob("lucid-*.whl")
    return zipfile.ZipFile(path)


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_string(wheel.read(name).decode("utf-8"))


def test_the_version_is_written_once_and_the_wheel_carries_it(wheel):
    project = (ROOT / "pyproject.toml").read_text().split("[project]")[1].split("\n[")[0]
    assert not re.search(r"^version\s*=", project, flags=re.M), "pyproject.toml hard-codes it"
    assert 'dynamic = ["version"]' in project
    assert _metadata(wheel)["Version"] == lucid.__version__


def test_the_wheel_carries_the_license_file_and_its_expression(wheel):
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(name) == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in wheel.read(name) and b"Version 2.0" in wheel.read(name)


def test_the_long_description_is_the_readme_as_markdown(wheel):
    metadata = _metadata(wheel)
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and len(classifiers) >= 5


def test_the_wheel_ships_py_typed_and_every_stub(wheel):
    """setuptools' package-data puts ``py.typed`` and the stubs (tools/stubs.py) in it."""
    names = set(wheel.namelist())
    assert "lucid/py.typed" in names
    stubs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lucid").rglob("*.pyi")}
    assert stubs and stubs <= names


def test_the_changelog_has_an_entry_for_the_version_and_an_unreleased_section():
    """Keep a Changelog's form: an Unreleased section first, then each version with its
    date (ISO 8601)."""
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[0] == "[Unreleased]"
    dated = re.compile(r"\[(?P<version>[^\]]+)\] - \d{4}-\d{2}-\d{2}")
    versions = [m["version"] for m in map(dated.fullmatch, headings[1:]) if m]
    assert len(versions) == len(headings) - 1, headings
    assert lucid.__version__ in versions
