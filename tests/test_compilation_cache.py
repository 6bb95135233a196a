"""`lucid.enable_compilation_cache`: a second process loads the first one's compiled
programs instead of compiling them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    import lucid

    lucid.enable_compilation_cache(sys.argv[1])
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    w = lucid.Parameter(jnp.ones((8, 4)))
    opt = lucid.optim.AdamW([w], lr=0.1)
    lucid.compile_optimizer(opt)
    fused = lucid.fused_step(lambda w, x: ((x @ w) ** 2).mean(), opt)
    loss = fused(w, jnp.ones((3, 8)))
    print(json.dumps({"hits": events.count("/jax/compilation_cache/cache_hits"),
                      "loss": float(loss), "w": w.data.tolist()}))
    """
)


def _run(cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, cache], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_first_ones_compilations(tmp_path):
    cache = str(tmp_path / "cache")
    cold = _run(cache)
    assert cold["hits"] == 0
    assert any(os.scandir(cache)), "nothing was written to the cache"
    warm = _run(cache)
    assert warm["hits"] > 0
    assert warm["loss"] == cold["loss"] and warm["w"] == cold["w"]  # the same programs


def test_without_a_path_the_cache_is_lucid_jax_in_the_users_cache_directory(tmp_path):
    """No path: ``$XDG_CACHE_HOME/lucid/jax`` (made), and JAX's cache directory is set
    to it (in a child process: the setting is process-wide)."""
    script = textwrap.dedent(
        """
        import json, jax, lucid
        before = jax.config.jax_compilation_cache_dir
        import lucid.optim  # importing lucid turns nothing on
        assert jax.config.jax_compilation_cache_dir == before, before
        path = lucid.enable_compilation_cache()
        print(json.dumps({"path": str(path), "before": before,
                          "config": jax.config.jax_compilation_cache_dir,
                          "min": jax.config.jax_persistent_cache_min_compile_time_secs}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env |= {"PYTHONPATH": os.pathsep.join(sys.path), "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    expected = tmp_path / "lucid" / "jax"
    assert out["before"] is None  # not on by default
    assert out["path"] == out["config"] == str(expected.resolve())
    assert expected.is_dir()
    assert out["min"] == 0.0
