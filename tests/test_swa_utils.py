"""lucid.optim.swa_utils and lucid.functional.averaging against torch.optim.swa_utils:
the averaged weights (SWA, EMA, custom avg_fn, buffers) and SWALR's learning rates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import torch_default_dtype

import lucid
import lucid.functional as LF
from lucid.optim import swa_utils

TORCH = torch.optim.swa_utils


def _trajectory(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))} for _ in range(n)]


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3, 2))
        self.b = torch.nn.Parameter(torch.zeros(2))
        self.register_buffer("stat", torch.zeros(2))


def _torch_average(make_averaged, steps):
    with torch_default_dtype(torch.float64):
        model = TorchModel()
        averaged = make_averaged(model)
        for k, values in enumerate(steps):
            with torch.no_grad():
                model.w.copy_(torch.tensor(values["w"]))
                model.b.copy_(torch.tensor(values["b"]))
                model.stat.copy_(torch.tensor(values["b"]) * (k + 1))
            averaged.update_parameters(model)
        module = averaged.module
        return {
            "w": module.w.detach().numpy().copy(),
            "b": module.b.detach().numpy().copy(),
            "stat": module.stat.numpy().copy(),
            "n": int(averaged.n_averaged),
        }


def _lucid_average(make_averaged, steps):
    model = {
        "w": lucid.Parameter(jnp.zeros((3, 2))),
        "b": lucid.Parameter(jnp.zeros(2)),
        "stat": jnp.zeros(2),
    }
    averaged = make_averaged(model)
    for k, values in enumerate(steps):
        model["w"].data = jnp.asarray(values["w"])
        model["b"].data = jnp.asarray(values["b"])
        model["stat"] = jnp.asarray(values["b"]) * (k + 1)
        averaged.update_parameters(model)
    module = averaged.module
    return {
        "w": np.asarray(module["w"].data),
        "b": np.asarray(module["b"].data),
        "stat": np.asarray(module["stat"]),
        "n": int(averaged.n_averaged),
    }


AVERAGERS = {
    "swa": ({}, {}),
    "ema-multi": (
        {"multi_avg_fn": TORCH.get_ema_multi_avg_fn(0.7)},
        {"multi_avg_fn": swa_utils.get_ema_multi_avg_fn(0.7)},
    ),
    "ema-single": (
        {"avg_fn": TORCH.get_ema_avg_fn(0.8)},
        {"avg_fn": swa_utils.get_ema_avg_fn(0.8)},
    ),
    "swa-single": ({"avg_fn": TORCH.get_swa_avg_fn()}, {"avg_fn": swa_utils.get_swa_avg_fn()}),
    "swa-multi": (
        {"multi_avg_fn": TORCH.get_swa_multi_avg_fn()},
        {"multi_avg_fn": swa_utils.get_swa_multi_avg_fn()},
    ),
}


@pytest.mark.parametrize("use_buffers", [False, True])
@pytest.mark.parametrize("kind", list(AVERAGERS))
def test_averaged_model_matches_torch(kind, use_buffers):
    theirs_kw, ours_kw = AVERAGERS[kind]
    steps = _trajectory()
    expected = _torch_average(
        lambda m: TORCH.AveragedModel(m, use_buffers=use_buffers, **theirs_kw), steps
    )
    actual = _lucid_average(
        lambda m: swa_utils.AveragedModel(m, use_buffers=use_buffers, **ours_kw), steps
    )
    assert actual["n"] == expected["n"] == len(steps)
    for key in ("w", "b", "stat"):
        np.testing.assert_allclose(actual[key], expected[key], rtol=1e-12, atol=1e-14, err_msg=key)


@pytest.mark.parametrize("kind", ["swa", "ema"])
def test_functional_averagers_match_torch_and_jit(kind):
    steps = _trajectory()
    if kind == "swa":
        expected = _torch_average(lambda m: TORCH.AveragedModel(m), steps)
        averager = LF.averaging.swa()
    else:
        fn = TORCH.get_ema_multi_avg_fn(0.9)
        expected = _torch_average(lambda m: TORCH.AveragedModel(m, multi_avg_fn=fn), steps)
        averager = LF.averaging.ema(0.9)
    params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
    state = averager.init(params)
    update = jax.jit(averager.update)
    for values in steps:
        state = update({k: jnp.asarray(v) for k, v in values.items()}, state)
    assert int(state.n_averaged) == expected["n"]
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(state.averaged[key]), expected[key], rtol=1e-12)


def test_invalid_decays_raise_torchs_error():
    with pytest.raises(ValueError, match="Invalid decay") as theirs:
        TORCH.get_ema_multi_avg_fn(1.5)
    for make in (swa_utils.get_ema_multi_avg_fn, swa_utils.get_ema_avg_fn, LF.averaging.ema):
        with pytest.raises(ValueError, match=str(theirs.value).replace("[", r"\[")):
            make(1.5)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("anneal_epochs", [0, 1, 4])
def test_swalr_gives_torchs_learning_rates(strategy, anneal_epochs):
    w, tw = lucid.Parameter(jnp.ones(2)), torch.ones(2, requires_grad=True)
    tv = torch.ones(2, requires_grad=True)
    v = lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.SGD([{"params": [w]}, {"params": [v], "lr": 0.3}], lr=0.5)
    topt = torch.optim.SGD([{"params": [tw]}, {"params": [tv], "lr": 0.3}], lr=0.5)
    sched = swa_utils.SWALR(
        opt, swa_lr=[0.05, 0.01], anneal_epochs=anneal_epochs, anneal_strategy=strategy
    )
    tsched = TORCH.SWALR(
        topt, swa_lr=[0.05, 0.01], anneal_epochs=anneal_epochs, anneal_strategy=strategy
    )
    for _ in range(7):
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-14)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(
            [g["lr"] for g in topt.param_groups], rel=1e-14
        )
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
    assert opt.param_groups[0]["swa_lr"] == topt.param_groups[0]["swa_lr"]


def test_swalr_refuses_what_torch_refuses():
    opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.5)
    topt = torch.optim.SGD([torch.ones(2, requires_grad=True)], lr=0.5)
    for kwargs in (
        {"swa_lr": 0.1, "anneal_strategy": "exp"},
        {"swa_lr": 0.1, "anneal_epochs": -1},
        {"swa_lr": 0.1, "anneal_epochs": 2.5},
        {"swa_lr": [0.1, 0.2]},
    ):
        with pytest.raises(ValueError) as theirs:
            TORCH.SWALR(topt, **kwargs)
        with pytest.raises(ValueError) as ours:
            swa_utils.SWALR(opt, **kwargs)
        assert str(ours.value).split()[:3] == str(theirs.value).split()[:3], kwargs
