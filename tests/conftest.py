import fcntl
from pathlib import Path

import jax
import pytest

# float64 parity needs x64; float32 runs pass explicit dtypes, so they are unaffected.
jax.config.update("jax_enable_x64", True)


def _locks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The run's two lock files, shared by every pytest-xdist worker (each worker's
    basetemp lies in one directory of the run; the run's own without xdist)."""
    root = tmp_path_factory.getbasetemp().parent
    return root / "machine.lock", root / "machine_turnstile.lock"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "machine_alone: the test holds the machine alone (see a_share_of_the_machine)"
    )
    # registered here rather than in pyproject.toml, so that it holds where the tests run
    # without the source tree (CI runs a copy of them against the installed wheel)
    config.addinivalue_line(
        "markers",
        "fast: the README's fast subset (`pytest -m fast`): torch's numbers for every "
        "optimizer and scheduler, functional, eager and compiled; the stateful API; "
        "state_dict round trips",
    )


@pytest.fixture(autouse=True)
def a_share_of_the_machine(request: pytest.FixtureRequest, tmp_path_factory):
    """Every test holds a shared lock on the machine while it runs; a test marked
    ``machine_alone`` (tests/_distributed.py's ``HOST_DEVICES``: host devices or
    processes in subprocesses) holds it alone, so no other test of the run, on any
    pytest-xdist worker, runs beside it.

    Why: XLA:CPU runs a collective by making all of a program's device threads meet,
    and on a 2-core machine with another worker's test beside it, 8 device threads
    waited minutes for each other (CI: a script of 25 s passed its 240 s limit). A
    turnstile keeps the one that wants the machine alone from starving: while it
    waits it holds the turnstile, so the other worker starts no new test."""
    machine, turnstile = _locks(tmp_path_factory)
    alone = request.node.get_closest_marker("machine_alone") is not None
    with open(turnstile, "a") as gate, open(machine, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
