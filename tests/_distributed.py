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

import jax


def rendezvous_flags() -> list[str]:
    """XLA_FLAGS entries that raise XLA's CPU collective timeouts (none on jax 0.4)."""
    if jax.__version_info__ < (0, 10):
        return []
    return [
        "--xla_cpu_collective_call_terminate_timeout_seconds=600",
        "--xla_cpu_collective_timeout_seconds=600",
    ]
