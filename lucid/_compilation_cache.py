"""`enable_compilation_cache`: JAX's persistent compilation cache, turned on in one call."""

from __future__ import annotations

import os
from pathlib import Path

import jax


def enable_compilation_cache(
    path: str | os.PathLike[str], *, min_compile_time_secs: float = 0.0
) -> Path:
    """Keep every XLA compilation of this process in `path`, for the next process to reuse.

    A lucid training loop compiles its forward and backward pass and one step
    program per structure on its first iteration (seconds on a CPU); torch runs
    its first iteration eagerly. JAX's persistent compilation cache stores each
    compiled executable on disk under a key made of the program, the compile
    options, the jax/jaxlib versions and the device, so a second run of the same
    script loads them instead of compiling, and a changed program simply
    misses. This sets `jax_compilation_cache_dir` (and the thresholds that
    would keep small programs out of the cache); it is the whole of what it
    does, so `jax.config` can undo it.

    Call it at the start of the program, before the first compilation (a
    program compiled before is not written to the cache).

    Args:
      path: the cache directory (made if missing; one per machine is fine,
        shared by every script).
      min_compile_time_secs: cache only compilations that took at least this
        long (JAX's default is 1 s; 0 caches the many small programs of an
        optimizer step too).

    Returns:
      The cache directory, as an absolute `Path`.

    Examples:
      >>> import tempfile, lucid
      >>> cache = lucid.enable_compilation_cache(tempfile.mkdtemp())
      >>> cache.is_dir()
      True
    """
    directory = Path(path).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    if hasattr(jax.config, "jax_persistent_cache_min_entry_size_bytes"):
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
