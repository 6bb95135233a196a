"""`opt.state` is torch's live mapping: reads see the current state, writes reach the
next step (checked there), and keys torch keeps travel in the state_dict; eager and
compiled alike, against torch 2.13."""

from __future__ import annotations

from copy import deepcopy

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

START = [np.linspace(-1.0, 1.0, 4), np.arange(6.0).reshape(2, 3) / 7]
GRADS = [np.array([0.3, -0.1, 0.2, 0.5]), np.ones((2, 3)) * 0.25]
OPTIMIZERS = [
    ("Adam", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("RMSprop", {"lr": 0.01}),
]
MODES = ["eager", "compiled"]


def _pair(name, options, mode):
    tparams = [torch.tensor(v, requires_grad=True) for v in START]
    params = [lucid.Parameter(jnp.asarray(v)) for v in START]
    topt = getattr(torch.optim, name)(tparams, **options)
    opt = getattr(lucid.optim, name)(params, **options)
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    return params, opt, tparams, topt


def _step(params, opt, tparams, topt, scale=1.0):
    for p, tp, g in zip(params, tparams, GRADS):
        p.grad = jnp.asarray(g * scale)
        tp.grad = torch.tensor(g * scale)
    opt.step()
    topt.step()


def _same(params, tparams):
    for p, tp in zip(params, tparams):
        chex.assert_trees_all_close(np.asarray(p.data), tp.detach().numpy(), rtol=1e-12)


def _first_tensor_entry(topt, tp):
    return next(k for k, v in topt.state[tp].items() if torch.is_tensor(v) and v.ndim > 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "options"), OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_a_written_entry_reaches_the_next_step_as_in_torch(name, options, mode):
    params, opt, tparams, topt = _pair(name, options, mode)
    _step(params, opt, tparams, topt)
    entry = _first_tensor_entry(topt, tparams[0])
    topt.state[tparams[0]][entry].zero_()  # torch code resets a buffer in place
    opt.state[params[0]][entry] = jnp.zeros_like(params[0].data)
    chex.assert_trees_all_close(opt.state[params[0]][entry], jnp.zeros(4))  # read back
    for scale in (1.0, -2.0):
        _step(params, opt, tparams, topt, scale)
        _same(params, tparams)


@pytest.mark.parametrize("mode", MODES)
def test_deleting_a_parameters_state_starts_it_again_as_in_torch(mode):
    params, opt, tparams, topt = _pair("Adam", {"lr": 0.1}, mode)
    _step(params, opt, tparams, topt)
    del topt.state[tparams[1]]
    del opt.state[params[1]]
    assert params[1] not in opt.state
    _step(params, opt, tparams, topt, 0.5)
    _same(params, tparams)
    assert float(opt.state[params[1]]["step"]) == float(topt.state[tparams[1]]["step"]) == 1.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_a_write_that_does_not_fit_is_an_error_at_the_next_step_and_nothing_moves(mode, bad):
    params, opt, tparams, topt = _pair("Adam", {"lr": 0.1}, mode)
    _step(params, opt, tparams, topt)
    before = [np.asarray(p.data) for p in params], opt.state_dict()
    wrong = jnp.zeros((5,)) if bad == "shape" else jnp.zeros(4, jnp.int32)
    opt.state[params[0]]["exp_avg"] = wrong  # accepted now, as torch accepts it
    assert opt.state_dict()["state"][0]["exp_avg"].shape == wrong.shape  # shown as written
    for p, g in zip(params, GRADS):
        p.grad = jnp.asarray(g)
    with pytest.raises(ValueError, match="exp_avg"):
        opt.step()
    for p, value in zip(params, before[0]):
        np.testing.assert_array_equal(np.asarray(p.data), value)
    assert float(opt.state[params[1]]["step"]) == 1.0  # no state moved either
    opt.state[params[0]]["exp_avg"] = before[1]["state"][0]["exp_avg"]  # mended
    opt.step()
    topt.step()
    _same(params, tparams)


@pytest.mark.parametrize("mode", MODES)
def test_new_names_and_non_parameter_keys_travel_in_the_state_dict_as_in_torch(mode):
    params, opt, tparams, topt = _pair("SGD", {"lr": 0.1, "momentum": 0.9}, mode)
    _step(params, opt, tparams, topt)
    for state, p in ((opt.state, params[0]), (topt.state, tparams[0])):
        state[p]["note"] = 7
        state["epoch"] = 3
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["state"]["epoch"] == tsd["state"]["epoch"] == 3
    assert sd["state"][0]["note"] == tsd["state"][0]["note"] == 7
    assert "epoch" in opt.state and opt.state["epoch"] == 3
    fresh_params = [lucid.Parameter(jnp.asarray(v)) for v in START]
    fresh = lucid.optim.SGD(fresh_params, lr=0.1, momentum=0.9)
    fresh.load_state_dict(lucid.optim.to_torch(tsd))  # torch's, with its extra keys
    assert fresh.state["epoch"] == 3 and fresh.state[fresh_params[0]]["note"] == 7
    _step(params, opt, tparams, topt)
    _same(params, tparams)


# torch's own state_dict hook tests (test/optim/test_optim.py's hooks), replayed
def _state_dict_pre_hook(optimizer):
    optimizer.state["test"] = 1


def _state_dict_post_hook(optimizer, state_dict):
    if "test" in state_dict["state"]:
        state_dict["state"].pop("test")
        state_dict["ran_state_dict_pre_hook"] = True
    else:
        state_dict["ran_state_dict_pre_hook"] = False
    return state_dict


def _load_state_dict_pre_hook1(optimizer, state_dict):
    state_dict["param_groups"][0]["lr"] = 0.002


def _load_state_dict_pre_hook2(optimizer, state_dict):
    my_state_dict = deepcopy(state_dict)
    my_state_dict["param_groups"][0]["lr"] = 0.003
    return my_state_dict


def _load_state_dict_post_hook(optimizer):
    optimizer.state["ran_load_state_dict_pre_hook2"] = optimizer.param_groups[0]["lr"] == 0.003
    optimizer.state["ran_load_state_dict_post_hook"] = True


def _hooked(opt):
    opt.register_state_dict_pre_hook(_state_dict_pre_hook)
    opt.register_state_dict_post_hook(_state_dict_post_hook)
    opt.register_load_state_dict_pre_hook(_load_state_dict_pre_hook1)
    opt.register_load_state_dict_pre_hook(_load_state_dict_pre_hook2)
    opt.register_load_state_dict_post_hook(_load_state_dict_post_hook)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "options"), OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_torchs_state_dict_hook_tests_pass(name, options, mode):
    params, opt, tparams, topt = _pair(name, options, mode)
    _step(params, opt, tparams, topt)
    results = []
    for optimizer in (topt, opt):
        _hooked(optimizer)
        state_dict = optimizer.state_dict()
        ran_pre = state_dict["ran_state_dict_pre_hook"]
        assert "test" not in state_dict["state"]
        optimizer.load_state_dict(state_dict)
        results.append(
            (
                ran_pre,
                optimizer.state["ran_load_state_dict_pre_hook2"],
                optimizer.state["ran_load_state_dict_post_hook"],
                optimizer.param_groups[0]["lr"],
            )
        )
    assert results[0] == results[1] == (True, True, True, 0.003)
