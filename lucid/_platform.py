"""What differs by platform and jax version, in one place.

`lucid.functional` states rules as math and hints (`lucid.functional.rule.Execution`);
which hint holds on this platform and this jax is decided here, for every layer that
runs steps (the transforms' `lucid.functional._apply` and `lucid.optim`'s engine).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from .functional.rule import Execution

JAX = jax.__version_info__[:2]
"""The jax this process runs, ``(major, minor)``."""

FLAT_EXACT = JAX >= (0, 10)
"""Whether XLA compiles an update over parameters laid end to end to the per-parameter
numbers bit for bit. With jax 0.4.35's XLA a few rules differ in the last bit there
(Adam, Adadelta, RAdam, NAdam in the eager step's flat calls; a fused torchao step over a
flat buffer drifted 1e-4 from the eager one in 3 steps), so the engine keeps parameters
apart on it (and `Execution.fusion_sensitive` rules' blocks everywhere but here)."""

CUT_AT_RUN_TIME = JAX >= (0, 10)
"""Whether programs cut a flat buffer into its parameters' views at offsets given at run
time (`lucid._storage.run_time_offsets`). XLA:CPU of jax 0.10 compiles every cut at a
constant offset as a kernel of its own (about 30 ms each), and cuts at run-time offsets
as one kernel per distinct shape (a 100-tensor GPT's backward and clipping compiled in
10.7-13.2 s instead of 18.4-18.9 s on 2 cores); jax 0.4.35's XLA compiled them in the
same time either way, so there each offset would only be one more input per call."""

KERNEL_PLATFORMS = frozenset({"gpu"})
"""The platforms (``jax.default_backend()`` names) where a rule's own fused kernels run
(`Execution.own_kernel`: bitsandbytes' 8-bit step, torchao's low-bit steps as one Pallas
kernel per tensor or flat buffer)."""

TRITON_DEPRECATED_FROM = (0, 11)
"""The first jax whose Pallas Triton backend warns that it is deprecated. The fused
kernels look codes up in tables (a gather per element), which Mosaic GPU, the backend jax
keeps, does not lower (jax 0.11)."""

TRITON_OPT_IN = "LUCID_PALLAS_TRITON"
"""Set to ``1`` to run the fused kernels on a jax whose Triton backend is deprecated (it
then warns once per compilation, as jax does for every user of that backend)."""


@functools.cache
def triton_backend() -> bool:
    """Whether the fused kernels may run: the installed jax has Pallas' Triton backend, and
    either does not deprecate it (jax < 0.11) or `TRITON_OPT_IN` is set.

    Examples:
      >>> isinstance(triton_backend(), bool)
      True
    """
    try:
        from jax.experimental.pallas import triton  # noqa: F401
    except ImportError:  # pragma: no cover - a jax without it
        return False
    if JAX < TRITON_DEPRECATED_FROM:
        return True
    return os.environ.get(TRITON_OPT_IN, "") == "1"


def has_kernels() -> bool:
    """Whether this process's default platform runs rules' own fused kernels (elsewhere a
    rule's update is XLA's graph of the same operations)."""
    return jax.default_backend() in KERNEL_PLATFORMS and triton_backend()


def batches(execution: Execution) -> bool:
    """Whether a rule with these hints updates same-shaped parameters in one batched call
    here: ``batched``, unless its own per-tensor kernel runs on this platform (a stacked
    batch would only be copied into it)."""
    return execution.batched and not (execution.own_kernel and has_kernels())


def flat_blocks(execution: Execution) -> bool:
    """Whether a rule's ``blocks`` may lay parameters end to end here."""
    return execution.blocks is not None and (FLAT_EXACT or not execution.fusion_sensitive)


def shard_map(fn: Callable, mesh: Any, in_specs: Any, out_specs: Any) -> Callable:
    """``fn`` run on each device of ``mesh`` over its own block of every input
    (``jax.shard_map``; ``jax.experimental.shard_map`` on a jax without it), with no
    check of which outputs are replicated (the callers' outputs are all sharded)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map as experimental

    return experimental(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)
