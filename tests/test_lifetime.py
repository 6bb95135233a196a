"""Nothing outlives its optimizer: compiled optimizers, fused steps, eager optimizers
and LR schedulers created, stepped and dropped in a loop keep the process's memory
flat and are collected; parameters that outlive their optimizer are taken over by
the next one (not borrowed from a dead one), with torch's numbers.

The loops run in a fresh process (tests/_lifetime_script.py), so the memory measured
is theirs alone and no other test's compiled programs or jax state count in it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid
from lucid.optim._engine import programs

HERE = Path(__file__).parent
TIMEOUT = 300  # seconds for the whole loop process: far above the ~20 s it takes
GROWTH_MB = 20  # the resident memory a loop may add after its warm-up
COUNTS = {
    "compiled": 500,
    "compiled_shared_params": 200,
    "fused": 100,
    "eager": 500,
    "schedulers": 500,
}


def _loops() -> dict[str, dict]:
    """Every loop of tests/_lifetime_script.py, run in one fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    env["JAX_PLATFORMS"] = "cpu"
    args = [str(x) for case in COUNTS.items() for x in case]
    result = subprocess.run(
        [sys.executable, str(HERE / "_lifetime_script.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return {row["case"]: row for row in rows}


def test_optimizers_fused_steps_and_schedulers_dropped_in_a_loop_are_collected_and_keep_no_memory():
    """500 compiled optimizers, 200 compiled optimizers one after another over one
    model's long-lived parameters (a sweep), 100 fused steps (half with a plain
    grad_transform), 500 eager optimizers and 500 LR schedulers (six kinds), each
    created, stepped and dropped: every one collected, and at most 20 MB of resident
    memory added after the warm-up. One process for all (one test, so that pytest-xdist
    runs it once)."""
    loops = _loops()
    assert sorted(loops) == sorted(COUNTS)
    failures = []
    for case, row in loops.items():
        assert row["count"] == COUNTS[case]
        assert row["refs"] > row["count"]  # something was watched
        if row["alive"]:
            failures.append(f"{case}: {row['alive']} of {row['refs']} objects outlived the loop")
        if row["growth_mb"] > GROWTH_MB:
            failures.append(f"{case}: {row['growth_mb']:.1f} MB kept")
    assert not failures, failures


# ------------------------------------------------------------------ in process
def _torch_params(values: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.tensor(v, requires_grad=True) for v in values]


def test_identical_structures_share_one_compiled_program():
    """A second compiled optimizer of the same structure (rule, options, shapes, dtypes,
    placement) builds no program: it runs the one the first built."""

    def run() -> None:
        params = [lucid.Parameter(jnp.ones(5, jnp.float32)), lucid.Parameter(jnp.ones(2))]
        compiled = lucid.compile_optimizer(lucid.optim.Adam(params, lr=0.1, amsgrad=True))
        for p in params:
            p.grad = jnp.ones(p.shape, p.dtype)
        compiled.step()

    run()
    built = programs.step_program.cache_info().misses
    run()
    assert programs.step_program.cache_info().misses == built


def test_a_new_optimizer_takes_over_parameters_whose_compiled_optimizer_is_gone():
    """torch: Adam steps, is dropped, then SGD steps the same tensors. lucid's first
    (compiled) optimizer and its state are collected while the parameters live, and
    the second compiled optimizer holds the parameters itself: the same numbers."""
    rng = np.random.default_rng(0)
    values = [rng.normal(size=(4,)), rng.normal(size=(2, 3))]
    grads = [[rng.normal(size=v.shape) for v in values] for _ in range(2)]

    tparams = _torch_params(values)
    for cls, kwargs, grad in (
        (torch.optim.Adam, {"lr": 0.1}, grads[0]),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, grads[1]),
    ):
        opt = cls(tparams, **kwargs)
        for p, g in zip(tparams, grad):
            p.grad = torch.tensor(g)
        opt.step()

    params = [lucid.Parameter(jnp.asarray(v)) for v in values]
    first = lucid.optim.Adam(params, lr=0.1)
    lucid.compile_optimizer(first)
    for p, g in zip(params, grads[0]):
        p.grad = jnp.asarray(g)
    first.step()
    gone = [weakref.ref(first), weakref.ref(first.backend)]
    del first
    gc.collect()
    assert [ref() for ref in gone] == [None, None]

    second = lucid.optim.SGD(params, lr=0.1, momentum=0.9)
    lucid.compile_optimizer(second)
    for p, g in zip(params, grads[1]):
        p.grad = jnp.asarray(g)
    second.step()
    for p, t in zip(params, tparams):
        chex.assert_trees_all_close(np.asarray(p.data), t.detach().numpy(), rtol=1e-12)
    # the second optimizer holds every parameter itself: both share its buffer
    assert params[0].location[0] is params[1].location[0]


def test_a_parameter_outliving_its_compiled_optimizer_takes_a_value_of_a_new_shape():
    """torch lets ``p.data`` take a tensor of another shape; a parameter whose compiled
    optimizer is gone does too (its gradient, of the old shape, is dropped)."""
    params = [lucid.Parameter(jnp.ones(3, jnp.float32)), lucid.Parameter(jnp.ones(2))]
    compiled = lucid.compile_optimizer(lucid.optim.SGD(params, lr=0.5))
    for p in params:
        p.grad = jnp.ones(p.shape, p.dtype)
    compiled.step()
    del compiled
    gc.collect()
    params[0].data = jnp.arange(4.0, dtype=jnp.float32)
    assert params[0].shape == (4,)
    assert params[0].grad is None
    chex.assert_trees_all_equal(np.asarray(params[0].data), np.arange(4.0, dtype=np.float32))
    chex.assert_trees_all_equal(np.asarray(params[1].data), np.full(2, 0.5, np.float32))


def test_dropped_optimizers_fused_steps_and_schedulers_need_no_cyclic_gc():
    """No reference cycle through what lucid makes: with the cyclic collector off,
    dropping the last reference frees a compiled optimizer, a fused step, an eager
    optimizer, a scheduler, their backends and the parameters (whose values a
    compiled optimizer's flat buffer holds) at once."""

    def loss(params, x):
        return ((params[0] * x).sum() + params[1].sum()) ** 2

    def made(kind: str) -> list[weakref.ref]:
        params = [lucid.Parameter(jnp.ones(3)), lucid.Parameter(jnp.zeros(2))]
        opt = lucid.optim.Adam(params, lr=0.1)
        extra: list = []
        for p in params:
            p.grad = jnp.ones(p.shape, p.dtype)
        if kind == "compiled":
            extra.append(lucid.compile_optimizer(opt))
            extra[0].step()
        elif kind == "fused":
            extra.append(lucid.fused_step(loss, opt))
            extra[0](params, jnp.ones(3))
        elif kind == "scheduler":
            extra.append(lucid.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4))
            opt.step()
            extra[0].step()
        else:
            opt.step()
        return [weakref.ref(x) for x in (opt, opt.backend, *extra, *params)]

    for kind in ("compiled", "fused", "eager", "scheduler"):
        made(kind)  # compiled once, so the measured call below builds nothing new
        gc.collect()
        gc.disable()
        try:
            refs = made(kind)
            alive = [ref() for ref in refs if ref() is not None]
        finally:
            gc.enable()
        assert alive == [], f"{kind}: {alive} outlived their last reference"


def test_loss_functions_are_held_only_by_the_bounded_program_caches():
    """`backward` and fused steps keep a loss function (and a plain grad_transform) only
    as a key of their bounded program caches: cleared, nothing holds it any more (a
    ``jax.jit`` with the loss as a static argument kept it, and its executable, for
    thousands of calls)."""
    from lucid import _backward

    def make_loss():
        return lambda w: (w**2).sum()

    def make_transform():
        return lambda grads: grads

    w = lucid.Parameter(jnp.ones(3))
    loss, transform = make_loss(), make_transform()
    lucid.backward(loss, w)
    fused = lucid.fused_step(loss, lucid.optim.SGD([w], lr=0.1), grad_transform=transform)
    fused(w)
    held = [weakref.ref(loss), weakref.ref(transform)]
    del loss, transform, fused
    gc.collect()
    assert all(ref() is not None for ref in held)  # cached: the next call compiles nothing
    _backward.loss_program.cache_clear()
    programs.fused_program.cache_clear()
    programs.transformed_step_program.cache_clear()
    gc.collect()
    assert [ref() for ref in held] == [None, None]


def test_a_dropped_compiled_handle_leaves_the_compiled_form_to_its_optimizer():
    """The registry of compiled handles is weak; the compiled step and its state belong
    to the optimizer: after the handle is dropped, compiling again (or a fused step)
    finds them, with the ``shard_state_over`` they were made with, and an L-BFGS keeps its
    Barzilai-Borwein step's state. Each goes with its optimizer."""
    w = lucid.Parameter(jnp.ones(4))
    opt = lucid.optim.SGD([w], lr=0.1, momentum=0.9)
    lucid.compile_optimizer(opt, shard_state_over="data")  # the handle dropped at once
    fused = lucid.fused_step(lambda w: (w**2).sum(), opt)
    assert fused.compiled.shard_state_over == "data"
    fused(w)
    with pytest.raises(ValueError, match="shard_state_over='data'"):
        lucid.compile_optimizer(opt)

    x = lucid.Parameter(jnp.array([1.0, -2.0]))
    lbfgs = lucid.optim.LBFGS([x], lr=0.5)
    handle = lucid.compile_optimizer(lbfgs)
    x.grad = jnp.array([1.0, 1.0])
    handle.step()
    before = handle.state_dict()["state"]
    runner = weakref.ref(handle.optimizer)
    del handle
    gc.collect()
    again = lucid.compile_optimizer(lbfgs)
    assert again.optimizer is runner()
    chex.assert_trees_all_equal(again.state_dict()["state"], before)
    assert again.state_dict()["state"][0]["step"] == 1

    gone = [weakref.ref(o) for o in (opt, fused, lbfgs, again)] + [runner]
    del opt, fused, lbfgs, again
    gc.collect()
    assert [ref() for ref in gone] == [None] * len(gone)
