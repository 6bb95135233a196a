"""torch.optim 2.13's API around the optimizers: hooks, named parameters, your own
optimizer as a subclass. Each test runs the same program through torch and lucid and
compares what torch shows (call order, arguments, state_dicts, trajectories)."""

from __future__ import annotations

import importlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import problem
from test_shell import (
    _assert_params_close,
    _lucid_params,
    _lucid_step,
    _torch_params,
    _torch_step,
)

import lucid
import lucid.optim.optimizer as lucid_optimizer_module

# torch.optim's namespace hides its submodule; the global hooks live there
torch_optimizer_module = importlib.import_module("torch.optim.optimizer")

MODES = ["eager", "compiled"]


def _hooks_log(module, opt, log):
    """Register one hook of every kind on ``opt`` (and the global step hooks), logging calls."""

    def tag(name):
        def hook(*args):
            kinds = [type(a).__name__ for a in args[1:]]
            log.append((name, *kinds))

        return hook

    def replacing_pre(optimizer, args, kwargs):
        log.append(("pre-replacing", len(args), sorted(kwargs)))
        return args, {**kwargs}

    def state_dict_post(optimizer, state_dict):
        log.append(("sd-post",))
        return {**state_dict, "extra": 1}

    def load_pre(optimizer, state_dict):
        log.append(("load-pre", "extra" in state_dict))
        return {k: v for k, v in state_dict.items() if k != "extra"}

    handles = [
        module.register_optimizer_step_pre_hook(tag("global-pre")),
        module.register_optimizer_step_post_hook(tag("global-post")),
        opt.register_step_pre_hook(tag("pre")),
        opt.register_step_pre_hook(replacing_pre),
        opt.register_step_post_hook(tag("post")),
        opt.register_state_dict_pre_hook(tag("sd-pre")),
        opt.register_state_dict_pre_hook(tag("sd-pre-first"), prepend=True),
        opt.register_state_dict_post_hook(state_dict_post),
        opt.register_load_state_dict_pre_hook(load_pre),
        opt.register_load_state_dict_post_hook(tag("load-post")),
        opt.register_load_state_dict_post_hook(tag("load-post-first"), prepend=True),
    ]
    return handles


@pytest.mark.parametrize("mode", MODES)
def test_hooks_fire_in_torchs_order_with_torchs_arguments(mode):
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    topt = torch.optim.Adam(list(tparams.values()), lr=0.01)
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    ours, theirs = [], []
    handles = _hooks_log(lucid_optimizer_module, opt, ours)
    handles += _hooks_log(torch_optimizer_module, topt, theirs)
    try:
        for _ in range(2):
            _lucid_step(opt, params)
            _torch_step(topt, tparams)
        sd, tsd = opt.state_dict(), topt.state_dict()
        assert sd["extra"] == tsd["extra"] == 1  # the post-hook's dict replaced the result
        opt.load_state_dict(sd)
        topt.load_state_dict(tsd)
    finally:
        for handle in handles:
            handle.remove()
    assert ours == theirs
    assert ours[:5] == [
        ("global-pre", "tuple", "dict"),
        ("pre", "tuple", "dict"),
        ("pre-replacing", 1, []),
        ("post", "tuple", "dict"),
        ("global-post", "tuple", "dict"),
    ]
    _lucid_step(opt, params)  # removed: nothing more is logged
    _torch_step(topt, tparams)
    assert ours == theirs
    _assert_params_close(params, tparams)


def test_a_step_pre_hook_can_replace_the_closure():
    w = lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.SGD([w], lr=0.1)

    def closure():
        w.grad = jnp.ones(2)
        return 1.0

    def other_closure():
        w.grad = jnp.full(2, 10.0)
        return 2.0

    # as in torch, args start with the optimizer itself
    handle = opt.register_step_pre_hook(lambda o, args, kwargs: ((o, other_closure), kwargs))
    assert opt.step(closure) == 2.0
    np.testing.assert_allclose(np.asarray(w.data), [0.0, 0.0], atol=1e-12)  # 1 - 0.1 * 10
    handle.remove()
    with (
        opt.register_step_pre_hook(lambda o, args, kwargs: 3),
        pytest.raises(RuntimeError, match="must return None or a tuple"),
    ):
        opt.step(closure)


@pytest.mark.parametrize("mode", MODES)
def test_named_parameters_carry_param_names_both_ways(mode):
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.AdamW(
        [{"params": [("b", params["b"])]}, {"params": [("w", params["w"])], "lr": 0.02}], lr=0.01
    )
    topt = torch.optim.AdamW(
        [{"params": [("b", tparams["b"])]}, {"params": [("w", tparams["w"])], "lr": 0.02}],
        lr=0.01,
    )
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    for _ in range(3):
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
    ours, theirs = opt.state_dict(), topt.state_dict()
    assert [g["param_names"] for g in ours["param_groups"]] == [["b"], ["w"]]
    assert ours["param_groups"] == theirs["param_groups"]
    # torch's checkpoint (with names) into a fresh lucid optimizer built from named_parameters
    fresh_params = {k: lucid.Parameter(p.data) for k, p in params.items()}
    fresh = lucid.optim.AdamW(
        [{"params": [("b", fresh_params["b"])]}, {"params": [("w", fresh_params["w"])]}],
        lr=0.5,
    )
    fresh.load_state_dict(theirs)
    assert fresh.state_dict()["param_groups"] == theirs["param_groups"]
    for _ in range(2):
        _lucid_step(fresh, fresh_params)
        _torch_step(topt, tparams)
    _assert_params_close(fresh_params, tparams)


def test_named_and_unnamed_parameters_do_not_mix_as_in_torch():
    w, b = lucid.Parameter(jnp.ones(2)), lucid.Parameter(jnp.ones(3))
    tw, tb = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match="with/without names") as theirs:
        torch.optim.SGD([("w", tw), tb])
    with pytest.raises(ValueError, match=str(theirs.value)):
        lucid.optim.SGD([("w", w), b])
    opt = lucid.optim.SGD([("w", w)])
    topt = torch.optim.SGD([("w", tw)])
    with pytest.raises(ValueError, match="with/without names") as theirs:
        topt.add_param_group({"params": [tb]})
    with pytest.raises(ValueError, match=str(theirs.value)):
        opt.add_param_group({"params": [b]})
    assert len(opt.param_groups) == 1


class LucidSignMomentum(lucid.optim.Optimizer):
    """Sign descent with a momentum buffer, written as torch users write optimizers."""

    def __init__(self, params, lr=0.01, beta=0.9):
        if lr < 0:
            raise ValueError(f"Invalid learning rate: {lr}")
        super().__init__(params, dict(lr=lr, beta=beta))

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = jnp.zeros_like(p.data)
                state["buf"] = group["beta"] * state["buf"] + p.grad
                p.data = p.data - group["lr"] * jnp.sign(state["buf"])
        return loss


class TorchSignMomentum(torch.optim.Optimizer):
    def __init__(self, params, lr=0.01, beta=0.9):
        super().__init__(params, dict(lr=lr, beta=beta))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "buf" not in state:
                    state["buf"] = torch.zeros_like(p)
                state["buf"] = group["beta"] * state["buf"] + p.grad
                p.sub_(group["lr"] * torch.sign(state["buf"]))
        return loss


def test_your_own_optimizer_works_with_schedulers_hooks_and_checkpoints():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = LucidSignMomentum(list(params.values()), lr=0.05)
    topt = TorchSignMomentum(list(tparams.values()), lr=0.05)
    sched = lucid.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.5)
    calls = []
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    for _ in range(5):
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
        sched.step()
        tsched.step()
    assert calls == ["post"] * 5
    _assert_params_close(params, tparams)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["param_groups"] == tsd["param_groups"]
    for index, entry in tsd["state"].items():
        np.testing.assert_allclose(np.asarray(sd["state"][index]["buf"]), entry["buf"].numpy())
    fresh_params = {k: lucid.Parameter(p.data) for k, p in params.items()}
    fresh = LucidSignMomentum(list(fresh_params.values()))
    fresh.load_state_dict(tsd)  # torch's checkpoint of torch's version of the optimizer
    _lucid_step(fresh, fresh_params)
    _torch_step(topt, tparams)
    _assert_params_close(fresh_params, tparams)
    opt.zero_grad()
    assert all(p.grad is None for p in params.values())
    with pytest.raises(TypeError, match="LucidSignMomentum"):
        lucid.compile_optimizer(opt)


def test_an_optimizer_without_a_step_raises_as_torchs_base_class():
    class NoStep(lucid.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

    opt = NoStep([lucid.Parameter(jnp.ones(2))])
    with pytest.raises(NotImplementedError):
        opt.step()


def test_old_one_cycle_checkpoints_with_anneal_func_load_as_in_torch():
    """torch's older OneCycleLR state_dicts saved the annealing function itself; torch
    2.13 loads them and keeps the constructed scheduler's own strategy."""
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.SGD(list(params.values()), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(list(tparams.values()), lr=0.1, momentum=0.9)
    options = {"max_lr": 0.2, "total_steps": 12, "anneal_strategy": "linear"}
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, **options)
    for _ in range(4):
        _torch_step(topt, tparams)
        tsched.step()
    old = tsched.state_dict()
    old["anneal_func"] = tsched._annealing_linear
    del old["_anneal_func_type"]
    sched = lucid.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=12)  # cos
    sched.load_state_dict(old)
    resumed = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.2, total_steps=12)
    resumed.load_state_dict(old)  # torch itself still reads this format
    for _ in range(6):
        sched.step()
        resumed.step()
        assert sched.get_last_lr() == pytest.approx(resumed.get_last_lr(), rel=1e-12)
        assert opt.param_groups[0]["momentum"] == pytest.approx(topt.param_groups[0]["momentum"])


def test_scheduler_warnings_are_torchs():
    w, tw = lucid.Parameter(jnp.ones(2)), torch.ones(2, requires_grad=True)
    opt, topt = lucid.optim.SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
    sched = lucid.optim.lr_scheduler.StepLR(opt, step_size=1)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=1)
    with pytest.warns(UserWarning) as theirs:
        tsched.step()
    with pytest.warns(UserWarning) as ours:
        sched.step()
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert "before `optimizer.step()`" in str(ours[0].message)
    with pytest.warns(UserWarning) as theirs:
        tsched.step(5)
    with pytest.warns(UserWarning) as ours:
        sched.step(5)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    # stepped in the right order: no warning from either
    opt2, topt2 = lucid.optim.SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
    sched2 = lucid.optim.lr_scheduler.StepLR(opt2, step_size=1)
    tsched2 = torch.optim.lr_scheduler.StepLR(topt2, step_size=1)
    w.grad, tw.grad = jnp.ones(2), torch.ones(2)
    opt2.step()
    topt2.step()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched2.step()
        tsched2.step()
