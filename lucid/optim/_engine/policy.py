"""The engine's tuning constants and version gates, in one place.

Everything the eager backend decides by a number measured on a platform, or by the jax
it runs on, is a field of `Policy`; it reads the module's `EAGER` instance and nothing
else (a test that crosses a threshold replaces it with ``dataclasses.replace``). The
compiled step lays every bucket end to end whatever its size: none of these thresholds
applies to it (its gates are `lucid._platform`'s, read by
`lucid.optim._engine.buckets`). The numbers never depend on a policy: every layout it
chooses is tested against the per-parameter program (`tests/test_eager_plan.py`,
`tests/test_thresholds.py`).
"""

from __future__ import annotations

import dataclasses

from ..._platform import FLAT_EXACT


@dataclasses.dataclass(frozen=True)
class Policy:
    """How the eager backend lays parameters out and calls its programs.

    Attributes:
      flat: an elementwise rule's small parameters may run laid end to end in one flat
        call (their numbers are the per-parameter program's bit for bit only where
        `lucid._platform.FLAT_EXACT` says so: jax 0.10 or later).
      small: the most elements a parameter laid end to end may have (larger ones run
        through the group's program, one array each).
      chunk: the most parameters one flat call holds: XLA compiles every output of a
        program (a cut of the flat buffer) as a kernel of its own, so a call's compile
        time grows with its parameters, while calls of the same shapes share one
        executable.
      piece_bytes: the most bytes of one piece of a flat state field. XLA:CPU runs a
        program's kernels one after another (not through its thread pool, about 1.6 us
        more per kernel) only when none of its buffers exceeds 512 bytes.
      inline_flops: XLA:CPU runs a whole program on the calling thread only when its
        cost analysis counts fewer floating-point operations than this (1000); a flat
        call under it keeps each member's state fields apart (the analysis counts each
        cut of a flat buffer as the whole buffer's work).
    """

    flat: bool
    small: int
    chunk: int
    piece_bytes: int
    inline_flops: int


EAGER = Policy(flat=FLAT_EXACT, small=1 << 14, chunk=128, piece_bytes=512, inline_flops=1000)
"""The eager step's: small parameters laid end to end on XLA:CPU's thresholds."""
