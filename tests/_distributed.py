"""Shared by the tests that run many host CPU devices in a subprocess.

XLA's CPU backend runs a collective by making every device's thread meet at a
rendezvous, and aborts the process when one has not arrived after 40 s. On a
loaded 2-core machine that happened (tests/test_sharding.py under ``pytest -n
2``: "Termination timeout ... of 40 seconds exceeded ... only 2 of them arrived
on time"). The subprocesses therefore run one program at a time
(``jax_cpu_enable_async_dispatch`` off, set in each script) and, where jax's
XLA knows the flags (jax >= 0.10; jax 0.4's has none), wait far longer than 40
s at a rendezvous. Every subprocess has a wall-clock bound of its own, so a
real hang fails the test rather than stalling CI.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

EIGHT_HOST_DEVICES = """
import os
flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_enable_async_dispatch", False)
"""
"""The opening of a subprocess script (`run_script`) that runs on 8 host CPU devices, one
program at a time (see the module docstring)."""

HOST_DEVICES = pytest.mark.machine_alone
"""Marks a test that runs several host devices or processes in subprocesses: under
``pytest -n`` it holds the machine alone (conftest.py's ``a_share_of_the_machine``).
Two such jobs at once on a 2-core machine oversubscribe it many times over (8 device
threads each, or two processes each); once, in CI, a collective of the two-process test
failed inside gloo while the docs test's two-process program ran beside it."""


RENDEZVOUS_SECONDS = 100
"""How long a device thread waits for the others at a collective before XLA aborts the
process: far above the ~20 s a late thread took on a loaded 2-core machine, and well
inside a test's bound, so that a rendezvous that never completes aborts and is retried
(`run_host_program`)."""


def rendezvous_flags() -> list[str]:
    """XLA_FLAGS entries that set XLA's CPU collective timeouts (none on jax 0.4)."""
    if jax.__version_info__ < (0, 10):
        return []
    return [
        f"--xla_cpu_collective_call_terminate_timeout_seconds={RENDEZVOUS_SECONDS}",
        f"--xla_cpu_collective_timeout_seconds={RENDEZVOUS_SECONDS}",
    ]


STUCK_RENDEZVOUS = re.compile(r"Termination timeout for `.*` of \d+ seconds exceeded")
"""XLA:CPU's abort when a device thread never reached a collective. With 8 host devices
on 2 idle cores, about one run in ten of tests/_sharded_numbers_script.py had one of 8
threads never arrive at a collective permute (7 of 8 arrived; no load, no progress): an
XLA:CPU scheduling hang, not lucid's numbers."""


def run_host_program(
    argv: list[str], env: Mapping[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python *argv`` and fail unless it exits cleanly having printed ``OK`` last;
    a run that XLA aborted at a stuck rendezvous (`STUCK_RENDEZVOUS`) runs once more,
    and the second run must pass."""
    import sys

    for attempt in range(2):
        result = subprocess.run(
            [sys.executable, *argv],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
        )
        if attempt == 0 and result.returncode and STUCK_RENDEZVOUS.search(result.stderr):
            print(f"XLA:CPU aborted at a stuck rendezvous; running {argv[0]} once more")
            continue
        break
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("OK"), result.stdout[-2000:]
    return result


def sharded_bound(scale: float, dtype: np.dtype, steps: int, terms: int = 0) -> float:
    """How far docs/distributed.md lets ``steps`` steps past one device (state sharded,
    parameters sharded, an eager step on a mesh) move an array of ``dtype`` from the
    one-device steps' numbers, ``scale`` the largest magnitude the array takes over those
    steps (its start included): ``6 * eps * scale`` a step; ``4 * terms * eps * scale``
    more for a rule whose sums over ``terms`` elements the devices add in another order
    (Adafactor). An array that is not floating point (counts, codes) must be equal: 0."""
    if not np.issubdtype(dtype, np.floating):
        return 0.0
    return steps * (6 + 4 * terms) * float(np.finfo(dtype).eps) * scale


def run_script(path: Path, source: str, timeout: float = 240) -> None:
    """Write ``source`` (a program that sets up its own host devices) to ``path``, run it
    in a fresh interpreter with this one's import path and the rendezvous flags, and
    fail unless it exits cleanly having printed ``OK`` last."""
    import os
    import sys

    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env["XLA_FLAGS"] = " ".join(rendezvous_flags())
    run_host_program([str(path)], env, timeout)


def record_step_programs(record: Callable[[Any], Any]) -> list:
    """Make the compiled backend pass every step program it runs, lowered for that call's
    arguments, through ``record`` (``record(lowered)``: its HLO text, its compiled form),
    and return the list its results are appended to. For a subprocess script that reads
    the programs' HLO; call it before any optimizer is compiled."""
    from lucid.optim._engine import compiled

    seen: list = []
    real = compiled.step_program

    def spy(rule: Any, plans: Any) -> Callable:
        program = real(rule, plans)

        def call(*args: Any) -> Any:
            seen.append(record(program.lower(*args)))
            return program(*args)

        return call

    compiled.step_program = spy
    return seen


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(
    argv: Callable[[int], list[str]],
    count: int,
    env: Mapping[str, str],
    timeout: float,
    cwd: Path | None = None,
) -> list[tuple[int, str, str]]:
    """Start ``count`` processes (``argv(i)`` for the i-th) together, as peers of one
    ``jax.distributed`` job, and wait for all of them within one ``timeout``.

    Returns:
      ``(returncode, stdout, stderr)`` of each, in order. A process still running at
      the deadline, or after a peer failed to finish, is killed: none is left waiting
      for its peer.
    """
    workers = [
        subprocess.Popen(
            argv(i),
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for worker in workers:
            outputs.append(worker.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    return [(worker.returncode, out, err) for worker, (out, err) in zip(workers, outputs)]
