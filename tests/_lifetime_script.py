"""Run by tests/test_lifetime.py in a fresh process: optimizers, fused steps and LR
schedulers created, stepped once and dropped in a loop, as a sweep or a test suite
does in one long-lived process.

For each case: a warm-up (every structure the loop makes compiled once), then the
loop; printed as one JSON line: the resident memory's growth over the loop (after
``gc.collect()``), how many of the weak references taken to what each iteration
made (warm-up included) are still alive, and the loop's duration.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
import weakref
from collections.abc import Callable

import jax.numpy as jnp

import lucid
from lucid.optim import lr_scheduler


def resident_mb() -> float:
    """The process's resident memory now (its peak where the OS tells no more)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        pass
    try:
        import psutil
    except ImportError:  # the peak: growth of the peak bounds growth of the current
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**20 if sys.platform == "darwin" else 2**10)
    return psutil.Process().memory_info().rss / 2**20


def loss(params: list, x: jnp.ndarray) -> jnp.ndarray:
    w, b = params
    return ((w * x).sum() + b.sum()) ** 2


def halve(grads: list) -> list:
    return [g / 2 for g in grads]


def new_params() -> list:
    return [lucid.Parameter(jnp.ones(3, jnp.float32)), lucid.Parameter(jnp.zeros(2, jnp.float32))]


def give_grads(params: list) -> None:
    for p in params:
        p.grad = jnp.ones(p.shape, p.dtype)


def new_optimizer(i: int, params: list) -> lucid.optim.Optimizer:
    if i % 2:
        return lucid.optim.SGD(params, lr=0.1, momentum=0.9)
    return lucid.optim.Adam(params, lr=0.1)


def compiled(i: int, refs: list) -> None:
    params = new_params()
    opt = new_optimizer(i, params)
    wrapper = lucid.compile_optimizer(opt)
    give_grads(params)
    wrapper.step()
    refs += [weakref.ref(x) for x in (wrapper, opt, opt.backend, *params)]


SHARED = new_params()  # a model whose parameters outlive every optimizer over them


def compiled_shared_params(i: int, refs: list) -> None:
    opt = new_optimizer(i, SHARED)
    wrapper = lucid.compile_optimizer(opt)
    give_grads(SHARED)
    wrapper.step()
    refs += [weakref.ref(x) for x in (wrapper, opt, opt.backend)]


def fused(i: int, refs: list) -> None:
    params = new_params()
    opt = new_optimizer(i, params)
    step = lucid.fused_step(loss, opt, grad_transform=halve if i % 4 < 2 else None)
    step(params, jnp.ones(3, jnp.float32))
    refs += [weakref.ref(x) for x in (step, step.compiled, opt, opt.backend, *params)]


def eager(i: int, refs: list) -> None:
    params = new_params()
    opt = new_optimizer(i, params)
    give_grads(params)
    opt.step()
    refs += [weakref.ref(x) for x in (opt, opt.backend, *params)]


SCHEDULERS: list[Callable] = [
    lambda opt: lr_scheduler.StepLR(opt, step_size=2),
    lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10),
    lambda opt: lr_scheduler.ReduceLROnPlateau(opt),
    lambda opt: lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1),
    lambda opt: lr_scheduler.SequentialLR(
        opt,
        [lr_scheduler.LinearLR(opt), lr_scheduler.ExponentialLR(opt, 0.9)],
        milestones=[2],
    ),
    lambda opt: lr_scheduler.LambdaLR(opt, lambda epoch: 0.5**epoch),
]


def schedulers(i: int, refs: list) -> None:
    params = new_params()
    opt = new_optimizer(i, params)
    scheduler = SCHEDULERS[i % len(SCHEDULERS)](opt)
    give_grads(params)
    opt.step()
    if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        scheduler.step(1.0)
    else:
        scheduler.step()
    refs += [weakref.ref(x) for x in (scheduler, opt, *params)]


CASES = {
    "compiled": compiled,
    "compiled_shared_params": compiled_shared_params,
    "fused": fused,
    "eager": eager,
    "schedulers": schedulers,
}
WARM_UP = 12  # iterations before the baseline: every structure of a loop compiled


def run(make: Callable[[int, list], None], count: int) -> dict:
    refs: list = []
    for i in range(WARM_UP):
        make(i, refs)
    gc.collect()
    before = resident_mb()
    start = time.perf_counter()
    for i in range(count):
        make(i, refs)
        if i % 50 == 49:
            gc.collect()
    seconds = time.perf_counter() - start
    gc.collect()
    return {
        "growth_mb": resident_mb() - before,
        "alive": sum(ref() is not None for ref in refs),
        "refs": len(refs),
        "seconds": seconds,
    }


if __name__ == "__main__":
    for name, count in zip(sys.argv[1::2], sys.argv[2::2]):
        print(json.dumps({"case": name, "count": int(count), **run(CASES[name], int(count))}))
