"""Resolve lucid's Apple-GPU extras for macOS on Apple silicon and check the versions.

No Mac needed: ``uv pip compile`` resolves ``pyproject.toml`` against PyPI for
another platform (markers and wheel tags evaluated for that platform; pip's
``--platform`` cannot do this, it evaluates markers for the machine it runs on).
Exits non-zero, loudly, when a resolution fails or a version is wrong, and when
PyPI cannot be reached: a check that did not run has not passed.

    python .ci/check_extras.py [path/to/uv]
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAC = "aarch64-apple-darwin"


def resolve(uv: str, extra: str, platform: str, python: str) -> dict[str, str]:
    """``{name: version}`` of everything ``lucid[extra]`` installs there (wheels only)."""
    command = [
        uv, "pip", "compile", str(ROOT / "pyproject.toml"), "--extra", extra,
        "--python-platform", platform, "--python-version", python,
        "--only-binary", ":all:", "--no-header", "--no-annotate", "--quiet",
    ]  # fmt: skip
    # jax-mps ships macOS 14 wheels only; uv assumes macOS 13 unless told
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": "14.0"}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if run.returncode:
        raise SystemExit(f"FAILED: lucid[{extra}] on {platform}, Python {python}:\n{run.stderr}")
    pins = {}
    for line in run.stdout.splitlines():
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.split(";")[0].strip()
    return pins


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def main() -> None:
    uv = sys.argv[1] if len(sys.argv) > 1 else "uv"
    failures = []

    def expect(label: str, condition: bool, pins: dict[str, str]) -> None:
        shown = {k: pins.get(k) for k in ("jax", "jaxlib", "jax-metal", "jax-mps")}
        print(f"{'ok  ' if condition else 'FAIL'} {label}: {shown}")
        if not condition:
            failures.append(label)

    # Apple's jax-metal 0.1.1 starts only with jax/jaxlib 0.4.34-0.5.0 (jax-ml/jax#27062)
    for python in ("3.10", "3.12", "3.13"):
        pins = resolve(uv, "metal", MAC, python)
        expect(
            f"lucid[metal], macOS arm64, Python {python}: jax-metal 0.1.1 with jax/jaxlib "
            "0.4.35 (in jax-metal's 0.4.34-0.5.0, and lucid's oldest CI lane)",
            pins.get("jax-metal") == "0.1.1"
            and pins.get("jax") == pins.get("jaxlib") == "0.4.35"
            and (0, 4, 34) <= release(pins["jax"]) <= (0, 5, 0),
            pins,
        )
    # jax-mps 0.11.x is built for jax/jaxlib 0.11.x and needs Python >= 3.12
    for python in ("3.12", "3.13"):
        pins = resolve(uv, "mps", MAC, python)
        expect(
            f"lucid[mps], macOS arm64, Python {python}: jax-mps 0.11.x with jax/jaxlib 0.11.x",
            minor(pins.get("jax-mps", "0.0")) == (0, 11)
            and minor(pins.get("jax", "0.0")) == minor(pins.get("jaxlib", "0.0")) == (0, 11),
            pins,
        )
    pins = resolve(uv, "mps", MAC, "3.11")
    expect(
        "lucid[mps], macOS arm64, Python 3.11: no plugin (jax-mps needs Python >= 3.12)",
        "jax-mps" not in pins,
        pins,
    )
    # elsewhere both extras install nothing more than lucid itself
    for extra in ("metal", "mps"):
        for platform in ("x86_64-unknown-linux-gnu", "x86_64-apple-darwin"):
            pins = resolve(uv, extra, platform, "3.12")
            expect(
                f"lucid[{extra}] on {platform}: no Apple plugin",
                "jax-metal" not in pins and "jax-mps" not in pins,
                pins,
            )
    if failures:
        raise SystemExit(f"{len(failures)} extras check(s) failed")
    print("extras resolve as documented in docs/backends.md")


if __name__ == "__main__":
    main()
