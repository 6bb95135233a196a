"""The optimizer is the one door into a step: eager, compiled and fused steps follow
every edit of ``param_groups`` torch follows, run torch's hooks, and give torch's
numbers (issue: one door into the optimizer)."""

from __future__ import annotations

import inspect

import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import lucid

RNG = np.random.default_rng(0)
SHAPES = [(3,), (2, 2), (4,), (3,)]
START = [RNG.normal(size=s) for s in SHAPES]
GRADS = [[RNG.normal(size=s) for s in SHAPES] for _ in range(6)]
MODES = ["eager", "compiled", "fused"]


class Pair:
    """The same parameters and optimizer in torch and in lucid (float64)."""

    def __init__(self, mode: str, groups: list[list[int]], **options):
        self.mode = mode
        self.torch_params = [torch.tensor(v, requires_grad=True) for v in START]
        self.params = [lucid.Parameter(jnp.asarray(v)) for v in START]
        self.topt = torch.optim.Adam(
            [{"params": [self.torch_params[i] for i in g]} for g in groups], **options
        )
        self.opt = lucid.optim.Adam(
            [{"params": [self.params[i] for i in g]} for g in groups], **options
        )
        if mode == "compiled":
            lucid.compile_optimizer(self.opt)
        self.fused = lucid.fused_step(self._loss, self.opt) if mode == "fused" else None
        self.count = 0

    def _loss(self, params, grads):
        # a loss whose gradient with respect to params[i] is grads[i]
        return sum(jnp.vdot(p, g) for p, g in zip(params, grads))

    def step(self) -> None:
        grads = GRADS[self.count % len(GRADS)]
        self.count += 1
        for p, g in zip(self.torch_params, grads):
            p.grad = torch.tensor(g)
        self.topt.step()
        in_groups = {id(p) for group in self.opt.param_groups for p in group["params"]}
        if self.fused is not None:
            used = [p for p in self.params if id(p) in in_groups]
            self.fused(used, [jnp.asarray(grads[self.params.index(p)]) for p in used])
        else:
            for p, g in zip(self.params, grads):
                p.grad = jnp.asarray(g)
            self.opt.step()

    def check(self) -> None:
        for ours, theirs in zip(self.params, self.torch_params):
            chex.assert_trees_all_close(
                np.asarray(ours.data), theirs.detach().numpy(), rtol=1e-10, atol=1e-12
            )


def _append(pair):
    pair.topt.param_groups[0]["params"].append(pair.torch_params[3])
    pair.opt.param_groups[0]["params"].append(pair.params[3])


def _remove(pair):
    pair.topt.param_groups[0]["params"].pop(0)
    pair.opt.param_groups[0]["params"].pop(0)


def _replace(pair):
    pair.topt.param_groups[0]["params"][1] = pair.torch_params[3]
    pair.opt.param_groups[0]["params"][1] = pair.params[3]


def _reorder(pair):
    pair.topt.param_groups[0]["params"].reverse()
    pair.opt.param_groups[0]["params"].reverse()


def _delete_group(pair):
    del pair.topt.param_groups[1]
    del pair.opt.param_groups[1]


def _reorder_groups(pair):
    pair.topt.param_groups.reverse()
    pair.opt.param_groups.reverse()


def _group_by_hand(pair):
    pair.topt.param_groups.append(
        {**pair.topt.defaults, "params": [pair.torch_params[3]], "lr": 0.3}
    )
    pair.opt.param_groups.append({**pair.opt.defaults, "params": [pair.params[3]], "lr": 0.3})


def _new_flag(pair):
    pair.topt.param_groups[1]["maximize"] = True
    pair.opt.param_groups[1]["maximize"] = True


EDITS = [
    _append,
    _remove,
    _replace,
    _reorder,
    _delete_group,
    _reorder_groups,
    _group_by_hand,
    _new_flag,
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("edit", EDITS, ids=lambda f: f.__name__.strip("_"))
def test_every_edit_of_param_groups_reaches_the_next_step_as_in_torch(mode, edit):
    pair = Pair(mode, [[0, 1], [2]], lr=0.1)
    for _ in range(2):
        pair.step()
    edit(pair)
    for _ in range(3):
        pair.step()
        pair.check()


def test_a_value_edit_never_recompiles_and_a_layout_edit_compiles_once():
    from oracle import count_compiles

    pair = Pair("compiled", [[0, 1], [2]], lr=0.1)
    pair.step()
    with count_compiles() as compiles:
        pair.opt.param_groups[0]["lr"] = 0.05
        pair.topt.param_groups[0]["lr"] = 0.05
        pair.step()
    assert compiles == []
    _append(pair)
    pair.step()
    with count_compiles() as compiles:
        pair.step()
    assert compiles == []
    pair.check()


def test_add_param_group_keeps_the_callers_dict_as_torch():
    pair = Pair("eager", [[0, 1]], lr=0.1)
    group, tgroup = {"params": [pair.params[2]]}, {"params": [pair.torch_params[2]]}
    pair.opt.add_param_group(group)
    pair.topt.add_param_group(tgroup)
    assert pair.opt.param_groups[1] is group
    group["lr"], tgroup["lr"] = 0.0, 0.0  # an edit of the caller's dict reaches the steps
    for _ in range(2):
        pair.step()
    pair.check()
    chex.assert_trees_all_close(np.asarray(pair.params[2].data), START[2])


def _hook_log(opt, log):
    opt.register_step_pre_hook(lambda o, a, k: log.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: log.append("post"))


def test_a_fused_step_runs_the_step_hooks_as_backward_and_step_do():
    from lucid.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    w = lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.SGD([w], lr=0.1)
    fused = lucid.fused_step(lambda w: (w**2).sum(), opt)
    log: list[str] = []
    _hook_log(opt, log)
    with (
        register_optimizer_step_pre_hook(lambda o, a, k: log.append("global pre")),
        register_optimizer_step_post_hook(lambda o, a, k: log.append("global post")),
    ):
        fused(w)
        fused_log, log[:] = list(log), []
        opt.zero_grad()
        lucid.backward(lambda w: (w**2).sum(), w)
        opt.step()
    assert fused_log == log == ["global pre", "pre", "post", "global post"]
    tw = torch.ones(2, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tlog: list[str] = []
    _hook_log(topt, tlog)
    (tw**2).sum().backward()
    topt.step()
    assert tlog == ["pre", "post"]


def test_a_pre_hook_edit_of_lr_reaches_the_fused_step():
    w = lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.SGD([w], lr=0.1)
    fused = lucid.fused_step(lambda w: (w**2).sum(), opt)

    def halve(o, args, kwargs):
        o.param_groups[0]["lr"] = 0.05

    opt.register_step_pre_hook(halve)
    fused(w)
    chex.assert_trees_all_close(w.data, jnp.full(2, 1.0 - 0.05 * 2.0))


@pytest.mark.parametrize("bad", ["fewer", "reshaped", "not a list"])
def test_a_grad_transform_of_the_wrong_structure_is_an_error_and_nothing_moves(bad):
    a, b = lucid.Parameter(jnp.ones(2)), lucid.Parameter(jnp.ones(3))
    opt = lucid.optim.Adam([a, b], lr=0.1)
    transform = {
        "fewer": lambda grads: grads[:1],
        "reshaped": lambda grads: [grads[0].reshape(2, 1), grads[1]],
        "not a list": lambda grads: grads[0],
    }[bad]
    fused = lucid.fused_step(lambda m: (m[0] ** 2).sum() + (m[1] ** 2).sum(), opt, transform)
    with pytest.raises(ValueError, match="grad_transform"):
        fused([a, b])
    chex.assert_trees_all_close(a.data, jnp.ones(2))
    assert opt.state_dict()["state"] == {}


def test_a_plain_function_and_an_optax_transform_are_both_grad_transforms():
    def run(transform):
        w = lucid.Parameter(jnp.asarray([1.0, -2.0, 3.0]))
        fused = lucid.fused_step(lambda w: (w**3).sum(), lucid.optim.Adam([w], lr=0.1), transform)
        for _ in range(3):
            fused(w)
        return w.data

    halved = run(lambda grads: [0.5 * g for g in grads])
    scaled = run(optax.scale(0.5))
    w = lucid.Parameter(jnp.asarray([1.0, -2.0, 3.0]))  # the meaning: backward, transform, step
    opt = lucid.optim.Adam([w], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        lucid.backward(lambda w: (w**3).sum(), w)
        w.grad = 0.5 * w.grad
        opt.step()
    chex.assert_trees_all_close(halved, scaled, w.data, rtol=1e-12)
    with pytest.raises(TypeError, match="grad_transform must be"):
        lucid.fused_step(lambda w: w.sum(), lucid.optim.SGD([w], lr=0.1), grad_transform=3)


def test_a_fused_step_follows_add_param_group_and_equals_backward_transform_step():
    clip = lucid.functional.clip_grad_norm(max_norm=0.5)

    def loss(params):
        return sum((p**2).sum() * (i + 1) for i, p in enumerate(params))

    def make():
        params = [lucid.Parameter(jnp.asarray(v)) for v in START]
        return params, lucid.optim.AdamW(params[:2], lr=0.1)

    params, opt = make()
    fused = lucid.fused_step(loss, opt, grad_transform=clip)
    ref_params, ref = make()
    for step in range(4):
        if step == 2:
            opt.add_param_group({"params": params[2:], "lr": 0.05})
            ref.add_param_group({"params": ref_params[2:], "lr": 0.05})
        fused(params)
        ref.zero_grad()
        lucid.backward(loss, ref_params)
        lucid.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref.step()
        for ours, theirs in zip(params, ref_params):
            chex.assert_trees_all_close(ours.data, theirs.data, rtol=1e-12)


def test_a_parameter_the_loss_does_not_take_is_skipped_as_backward_and_step_skip_it():
    a, b = lucid.Parameter(jnp.ones(2)), lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.Adam([a, b], lr=0.1)
    fused = lucid.fused_step(lambda a: (a**2).sum(), opt)
    fused(a)
    chex.assert_trees_all_close(b.data, jnp.ones(2))
    assert list(opt.state_dict()["state"]) == [0]  # b got no state, as torch's step skips it
    assert a.data[0] < 1.0


def _public(cls) -> dict[str, object]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize("ours", ["Optimizer", "CompiledOptimizer"])
def test_every_public_attribute_of_torchs_optimizer_exists_with_a_compatible_signature(ours):
    cls = getattr(lucid.optim, ours)
    theirs = _public(torch.optim.Optimizer)
    instance = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
    if ours == "CompiledOptimizer":
        instance = lucid.compile_optimizer(instance)
    for name in ("param_groups", "state", "defaults"):  # torch's instance attributes
        assert hasattr(instance, name), name
    for name, attribute in theirs.items():
        assert hasattr(cls, name), f"{ours} lacks torch's {name}"
        if not inspect.isfunction(attribute):
            continue
        torch_params = list(inspect.signature(attribute).parameters)
        lucid_params = list(inspect.signature(getattr(cls, name)).parameters)
        assert lucid_params[: len(torch_params)] == torch_params, name


def test_state_for_a_parameter_in_no_group_is_torchs_key_error():
    class Counting(lucid.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["n"] = self.state[p].get("n", 0) + 1

    class TorchCounting(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["n"] = self.state[p].get("n", 0) + 1

    stray, tstray = lucid.Parameter(jnp.ones(1)), torch.ones(1)
    opt, topt = Counting([lucid.Parameter(jnp.ones(1))]), TorchCounting([torch.ones(1)])
    opt.step()
    topt.step()
    opt.state[stray]["n"] = 1
    topt.state[tstray]["n"] = 1
    with pytest.raises(KeyError):
        topt.state_dict()
    with pytest.raises(KeyError, match="in no parameter group"):
        opt.state_dict()


def test_a_compiled_step_passes_the_hooks_the_arguments_torchs_step_does():
    def seen(log):
        return lambda o, args, kwargs: log.append((len(args), args[0] is o, dict(kwargs)))

    w, tw = lucid.Parameter(jnp.ones(2)), torch.ones(2, requires_grad=True)
    compiled = lucid.compile_optimizer(lucid.optim.SGD([w], lr=0.1))
    topt = torch.optim.SGD([tw], lr=0.1)
    log: list[tuple] = []
    tlog: list[tuple] = []
    compiled.register_step_pre_hook(seen(log))
    topt.register_step_pre_hook(seen(tlog))
    w.grad, tw.grad = jnp.ones(2), torch.ones(2)
    compiled.step()
    topt.step()
    compiled.step(lambda: 0.0)
    topt.step(lambda: 0.0)
    assert log == tlog == [(1, True, {}), (2, True, {})]
