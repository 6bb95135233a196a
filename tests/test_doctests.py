"""Every docstring example in lucid runs and prints what it shows (doctest), with jax's
default configuration (x64 off), as a user pasting it would see it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import doctest, importlib, pkgutil
    import lucid

    attempted = failed = 0
    for info in pkgutil.walk_packages(lucid.__path__, "lucid."):
        module = importlib.import_module(info.name)
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        attempted += result.attempted
        failed += result.failed
    print(f"{attempted} examples, {failed} failed")
    assert attempted > 50 and failed == 0
    """
)


def test_every_docstring_example_runs_as_shown():
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
