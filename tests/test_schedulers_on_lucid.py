"""The scheduler classes driving real lucid optimizers (eager and compiled)
give torch's lr/momentum sequences and torch's parameter trajectories."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import loss_jax, loss_torch, problem
from schedule_cases import CASES, case_id, quiet, run, torch_rows

import lucid
import lucid.optim.lr_scheduler as LL

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)


def _lucid_optimizer(kind: str, lrs: tuple[float, ...]):
    params = [lucid.Parameter(jnp.zeros(1, jnp.float64)) for _ in lrs]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, lrs)]
    if kind == "sgd":
        return lucid.optim.SGD(groups, lr=lrs[0], momentum=0.9)
    return lucid.optim.Adam(groups, lr=lrs[0], betas=(0.9, 0.999))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_scheduler_on_a_lucid_optimizer_shows_torchs_sequence(case):
    expected, _ = torch_rows(case)
    actual, _ = run(case.build, LL, _lucid_optimizer(case.optimizer, case.lrs), case.steps)
    np.testing.assert_allclose(
        np.array(actual, dtype=float), np.array(expected, dtype=float), rtol=1e-12, atol=0
    )


TRAJECTORIES = {
    "one-cycle-adam-betas": (
        "Adam",
        {"lr": 0.01},
        lambda lib, opt: lib.OneCycleLR(opt, max_lr=0.05, total_steps=31),
    ),
    "cyclic-sgd-momentum": (
        "SGD",
        {"lr": 0.01, "momentum": 0.9},
        lambda lib, opt: lib.CyclicLR(opt, 0.001, 0.05, step_size_up=4, mode="triangular2"),
    ),
    "sequential-warmup-cosine": (
        "AdamW",
        {"lr": 0.02},
        lambda lib, opt: lib.SequentialLR(
            opt, [lib.LinearLR(opt, 0.1, total_iters=5), lib.CosineAnnealingLR(opt, 10)], [5]
        ),
    ),
    "plateau": ("RMSprop", {"lr": 0.01}, lambda lib, opt: lib.ReduceLROnPlateau(opt, patience=2)),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(TRAJECTORIES))
def test_parameters_follow_torch_under_a_scheduler(name, compiled):
    cls, options, build = TRAJECTORIES[name]
    init = problem()
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in sorted(init.items())}
    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in sorted(init.items())}
    topt = getattr(torch.optim, cls)(list(tparams.values()), **options)
    opt = getattr(lucid.optim, cls)(list(params.values()), **options)
    with quiet():
        tsched = build(torch.optim.lr_scheduler, topt)
    sched = build(LL, opt)
    if compiled:
        lucid.compile_optimizer(opt)
    for _ in range(30):
        topt.zero_grad()
        tloss = loss_torch(tparams)
        tloss.backward()
        topt.step()
        opt.zero_grad()
        loss = lucid.backward(loss_jax, params)
        opt.step()
        with quiet():
            tsched.step(float(tloss)) if name == "plateau" else tsched.step()
        sched.step(float(loss)) if name == "plateau" else sched.step()
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
    for k in tparams:
        np.testing.assert_allclose(
            np.asarray(params[k].data), tparams[k].detach().numpy(), rtol=1e-10, atol=1e-13
        )
