"""`enable_compilation_cache`: JAX's persistent compilation cache, turned on in one call."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax


def default_cache_dir() -> Path:
    """Where `enable_compilation_cache()` keeps its files without a path: ``lucid/jax``
    in the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``; on Windows
    ``%LOCALAPPDATA%``; on macOS ``~/Library/Caches``).

    Examples:
      >>> from lucid._compilation_cache import default_cache_dir
      >>> default_cache_dir().parts[-2:]
      ('lucid', 'jax')
    """
    if os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"])
    elif sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        root = Path(os.environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        root = Path.home() / "Library" / "Caches"
    else:
        root = Path.home() / ".cache"
    return root / "lucid" / "jax"


def enable_compilation_cache(
    path: str | os.PathLike[str] | None = None, *, min_compile_time_secs: float = 0.0
) -> Path:
    """Keep every XLA compilation of this process on disk, for the next process to reuse.

    A lucid training loop compiles its forward and backward pass and one step
    program per structure on its first iteration (seconds on a CPU, tens of
    seconds for a large model); torch runs its first iteration eagerly. JAX's
    persistent compilation cache stores each compiled executable on disk under
    a key made of the program, the compile options, the jax/jaxlib versions and
    the device, so a second run of the same script loads them instead of
    compiling, and a changed program simply misses. This sets
    `jax_compilation_cache_dir` (and the thresholds that would keep small
    programs out of the cache); it is the whole of what it does, so `jax.config`
    can undo it, and it applies to every JAX program of the process, lucid's or
    not.

    lucid does not turn the cache on by itself: importing a library should not
    change JAX's configuration for the rest of the program nor write to disk.
    JAX reads the same settings from the environment too
    (``JAX_COMPILATION_CACHE_DIR=...`` and
    ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``), for turning it on
    without changing the script.

    Call it at the start of the program, before the first compilation (a
    program compiled before is not written to the cache).

    Args:
      path: the cache directory (made if missing; one per machine is fine,
        shared by every script). Without one, `lucid/jax` in the user's cache
        directory (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux).
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
    directory = Path(default_cache_dir() if path is None else path).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    if hasattr(jax.config, "jax_persistent_cache_min_entry_size_bytes"):
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
