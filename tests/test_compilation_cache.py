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
