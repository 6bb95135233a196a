"""Shared timing: warm-up, timed repeats with a device sync, median, effective bandwidth.

Bytes model. An elementwise optimizer step over float32 parameters must at
least read the parameter, the gradient and each param-sized state buffer, and
write the parameter and each state buffer back. With ``n_state`` such buffers
(Adam: ``exp_avg`` and ``exp_avg_sq``, so 2) that is

.. math::

    \\text{bytes per param} = 4\\,(3 + 2\\,n_\\text{state})

i.e. 28 bytes per parameter for Adam (read p, g, m, v; write p, m, v), 12 for
plain SGD. Per-parameter 0-d state (``step``, ``eta``, ``mu_product``) is not
counted. Effective GB/s = that minimum traffic / median step time; it is a
lower bound on the traffic an implementation actually generates.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Timing:
    """The result of :func:`measure`: all timings in milliseconds."""

    first_ms: float  # the first call: compilation/tracing plus one step
    times_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)


def measure(
    step: Callable[[], Any], sync: Callable[[Any], Any], *, warmup: int, repeats: int
) -> Timing:
    """Run ``step`` once (timed as ``first_ms``), ``warmup - 1`` more untimed, then
    ``repeats`` timed times; ``sync(step())`` waits for the device each time."""
    start = time.perf_counter()
    sync(step())
    first_ms = 1e3 * (time.perf_counter() - start)
    for _ in range(max(warmup - 1, 0)):
        sync(step())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(step())
        times.append(1e3 * (time.perf_counter() - start))
    return Timing(first_ms, times)


def jax_sync(outputs: Any) -> None:
    """Wait for every array in ``outputs`` (jax dispatches asynchronously)."""
    import jax

    jax.block_until_ready(outputs)


def parameter_buffers(params: Any) -> list[Any]:
    """The arrays lucid Parameters live in now, each once: their own arrays, or the
    flat buffers of a compiled optimizer (what to wait for after a step)."""
    return list(
        {id(storage): storage.buffer for storage, _ in (p.location for p in params)}.values()
    )


def torch_sync(device: str) -> Callable[[Any], None]:
    """A sync for torch on ``device``: ``torch.cuda.synchronize`` on CUDA, nothing on CPU."""
    import torch

    def sync(_: Any) -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    return sync


def bytes_per_step(n_params: int, n_state: float, itemsize: int = 4) -> float:
    """Minimum bytes one step moves: ``itemsize * (3 + 2 * n_state)`` per parameter."""
    return itemsize * (3 + 2 * n_state) * n_params


def gb_per_s(n_bytes: float, ms: float) -> float:
    """Effective bandwidth in GB/s (1e9 bytes) for ``n_bytes`` moved in ``ms`` milliseconds."""
    return n_bytes / (ms * 1e-3) / 1e9


def measure_pipelined(
    step: Callable[[], Any], sync: Callable[[Any], Any], *, repeats: int
) -> float:
    """Steady-state ms per step: ``repeats`` steps back to back, one sync at the end.

    A training loop never waits for the device between steps, so host work
    (Python, dispatch, a small host-to-device copy) overlaps the previous
    step's kernels; this is the throughput such a loop sees. Call after
    :func:`measure` (which warms up)."""
    sync(step())
    start = time.perf_counter()
    out = None
    for _ in range(repeats):
        out = step()
    sync(out)
    return 1e3 * (time.perf_counter() - start) / repeats
