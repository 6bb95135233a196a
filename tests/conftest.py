import fcntl

import jax
import pytest

# float64 parity needs x64; float32 runs pass explicit dtypes, so they are unaffected.
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def one_host_devices_job_at_a_time(tmp_path_factory):
    """Holds a lock shared by every pytest-xdist worker of this run while the test runs
    (tests/_distributed.py's ``HOST_DEVICES`` marks the tests that take it)."""
    # each worker's basetemp lies in one directory of the run (the run's own without xdist)
    lock_path = tmp_path_factory.getbasetemp().parent / "host_devices.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
