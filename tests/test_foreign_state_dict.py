"""A state_dict that another optimizer saved is refused when it is loaded, in words,
and changes nothing; every state_dict of the optimizer itself still loads.

torch 2.13 is the oracle of what "another optimizer's" means: for every ordered pair
of torch.optim classes, torch's own optimizer is given the other's state_dict and
stepped. Where torch fails (at the load or at the step: `KeyError: 'step'`, ...),
lucid refuses at the load; where torch steps, lucid either refuses (the groups hold
options only the other optimizer has) or loads and steps to torch's numbers.
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # torchao's optimizers run eagerly on CPU

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import F64_RTOL, torch_default_dtype

import lucid
from lucid.optim._registry import registered

TORCH_CLASSES = [entry.name for entry in registered("torch.optim")]
OPTIONS = {"SGD": {"lr": 0.1, "momentum": 0.9}}
GRAD = np.linspace(-0.7, 0.8, 16).reshape(4, 4)


def _torch_step(opt: torch.optim.Optimizer, params: list, name: str, n: int = 2) -> None:
    """One torch step with a gradient for the first ``n`` parameters."""
    for p in params[:n]:
        grad = torch.tensor(GRAD)
        p.grad = grad.to_sparse() if name == "SparseAdam" else grad
    if name == "LBFGS":
        opt.step(lambda: sum((p * torch.tensor(GRAD)).sum() for p in params[:n]))
    else:
        opt.step()


def _lucid_step(opt: lucid.optim.Optimizer, params: list, n: int = 2) -> None:
    for w in params[:n]:
        w.grad = jnp.asarray(GRAD)
    if type(opt).__name__ == "LBFGS":
        opt.step(lambda: float(sum(jnp.sum(w.data * GRAD) for w in params[:n])))
    else:
        opt.step()


def _torch_params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(4, 4, dtype=torch.float64)) for _ in range(2)]


def _lucid(name: str) -> tuple[lucid.optim.Optimizer, list[lucid.Parameter]]:
    params = [lucid.Parameter(jnp.ones((4, 4), jnp.float64)) for _ in range(2)]
    return getattr(lucid.optim, name)(params, **OPTIONS.get(name, {})), params


def _torch_saved(name: str) -> tuple[dict, dict]:
    """A torch optimizer's state_dict after one step in which only its first parameter
    had a gradient (the second has no state: a load then steps both paths, a state
    resumed and one made), and lucid's state_dict of the same."""
    params = _torch_params()
    with torch_default_dtype(torch.float64):  # torch's 0-d state (ASGD's eta) in float64
        opt = getattr(torch.optim, name)(params, **OPTIONS.get(name, {}))
        _torch_step(opt, params, name, n=1)
    mine, ours = _lucid(name)
    _lucid_step(mine, ours, n=1)
    return opt.state_dict(), mine.state_dict()


def _torch_runs(name: str, state_dict: dict) -> tuple[bool, list[np.ndarray] | None]:
    """Whether torch's `name` loads ``state_dict`` and steps (both parameters), and its
    parameters after."""
    params = _torch_params()
    opt = getattr(torch.optim, name)(params, **OPTIONS.get(name, {}))
    try:
        with torch_default_dtype(torch.float64):
            opt.load_state_dict(copy.deepcopy(state_dict))
            _torch_step(opt, params, name)
    except Exception:  # torch fails late: KeyError, TypeError, ... at the load or step
        return False, None
    return True, [p.detach().numpy().copy() for p in params]


def _snapshot(opt: lucid.optim.Optimizer) -> tuple:
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    state = {
        i: {k: np.asarray(v).tolist() for k, v in entry.items()}
        for i, entry in opt.state_dict()["state"].items()
    }
    return groups, state


def _same(params: list[lucid.Parameter], torch_values: list[np.ndarray], what: str) -> None:
    for w, value in zip(params, torch_values):
        np.testing.assert_allclose(np.asarray(w.data), value, rtol=F64_RTOL, err_msg=what)


@pytest.mark.parametrize("saver", TORCH_CLASSES)
def test_another_torch_optimizers_state_dict_is_refused_where_torch_fails(saver):
    torch_sd, lucid_sd = _torch_saved(saver)
    for loader in TORCH_CLASSES:
        if loader == saver:
            continue
        torch_ok, torch_value = _torch_runs(loader, torch_sd)
        for given in (torch_sd, lucid_sd):
            opt, params = _lucid(loader)
            before = _snapshot(opt)
            try:
                opt.load_state_dict(copy.deepcopy(given))
            except ValueError as error:
                message = str(error)
                assert loader in message and "saved by" in message, message
                assert "Nothing was changed" in message, message
                assert _snapshot(opt) == before, f"{saver} -> {loader} changed the optimizer"
                continue
            assert torch_ok, f"{saver}'s state_dict loaded into {loader}, where torch fails"
            _lucid_step(opt, params)
            _same(params, torch_value, f"{saver} -> {loader}")


def test_adams_load_of_an_sgd_state_dict_names_both_and_changes_nothing():
    """The issue's case: torch's Adam takes it and fails with `KeyError: 'step'`."""
    w = lucid.Parameter(jnp.ones(3))
    sgd = lucid.optim.SGD([w], lr=0.5, momentum=0.9)
    w.grad = jnp.ones(3)
    sgd.step()
    for adam in (
        lucid.optim.Adam([w], lr=0.1),
        lucid.compile_optimizer(lucid.optim.Adam([w], lr=0.1)),
    ):
        with pytest.raises(ValueError) as caught:
            adam.load_state_dict(sgd.state_dict())
        message = str(caught.value)
        for word in ("Adam", "saved by SGD", "'betas'", "'eps'", "'momentum'", "'nesterov'"):
            assert word in message, message
        assert "'momentum_buffer'" in message, message
        assert set(adam.param_groups[0]) == set(lucid.optim.Adam([w]).param_groups[0])
        assert adam.param_groups[0]["lr"] == 0.1 and dict(adam.state) == {}
    p = torch.nn.Parameter(torch.ones(3))
    torch_sgd = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    p.grad = torch.ones(3)
    torch_sgd.step()
    with pytest.raises(KeyError, match="step"):  # torch: late, and in other words
        torch_adam = torch.optim.Adam([p], lr=0.1)
        torch_adam.load_state_dict(torch_sgd.state_dict())
        torch_adam.step()


def test_an_adam_checkpoint_restored_into_sgd_is_refused_and_changes_nothing(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    from lucid.optim import checkpoint

    w = lucid.Parameter(jnp.ones(3))
    adam = lucid.optim.Adam([w], lr=0.1)
    w.grad = jnp.ones(3)
    adam.step()
    checkpoint.save(tmp_path / "adam", adam)
    for sgd in (
        lucid.optim.SGD([w], lr=0.5, momentum=0.9),
        lucid.compile_optimizer(lucid.optim.SGD([w], lr=0.5, momentum=0.9)),
    ):
        with pytest.raises(ValueError, match="saved by Adam,") as caught:
            checkpoint.restore(tmp_path / "adam", sgd)
        assert "'dampening'" in str(caught.value) and "'exp_avg'" in str(caught.value)
        assert sgd.param_groups[0]["lr"] == 0.5 and "betas" not in sgd.param_groups[0]
        assert dict(sgd.state) == {}


@pytest.mark.parametrize("name", TORCH_CLASSES)
def test_the_saved_options_are_those_torchs_step_cannot_do_without(name):
    """Each option lucid requires in a loaded group is one whose absence makes torch's
    own optimizer fail (at the load or the step); each one torch does without (its
    `__setstate__` fills it in: `nesterov`, `maximize`, ...) loads in lucid, and the
    step gives torch's numbers."""
    entry = next(e for e in registered("torch.optim") if e.name == name)
    torch_sd, _ = _torch_saved(name)
    for key in torch_sd["param_groups"][0]:
        if key == "params":
            continue
        cut = copy.deepcopy(torch_sd)
        del cut["param_groups"][0][key]
        torch_ok, torch_value = _torch_runs(name, cut)
        opt, params = _lucid(name)
        if key in entry.saved:
            assert not torch_ok, f"torch's {name} steps without {key!r}"
            with pytest.raises(ValueError, match=f"lacks '{key}'"):
                opt.load_state_dict(cut)
            continue
        opt.load_state_dict(cut)
        if not torch_ok:  # torch needs it; lucid takes it from the defaults (none here)
            continue
        _lucid_step(opt, params)
        _same(params, torch_value, f"{name} without {key!r}")


def test_state_dicts_of_the_optimizer_itself_load():
    """Group keys of your own, a scheduler's, named parameters, your subclass's defaults,
    and a state_dict made before an option was turned on."""
    w, b = lucid.Parameter(jnp.ones((2, 2))), lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.AdamW([("w", w), ("b", b)], lr=0.1)
    opt.param_groups[0]["name"] = "all"  # a key of your own
    lucid.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=10)
    w.grad, b.grad = jnp.ones((2, 2)), jnp.ones(2)
    opt.step()
    again = lucid.optim.AdamW([("w", w), ("b", b)], lr=0.1, amsgrad=False)
    again.load_state_dict(opt.state_dict())
    assert again.param_groups[0]["name"] == "all" and "max_lr" in again.param_groups[0]

    class Tagged(lucid.optim.SGD):  # your subclass, with an option of its own
        def __init__(self, params, lr=0.1, momentum=0.0, tag="x"):
            super().__init__(params, lr=lr, momentum=momentum)
            self.defaults["tag"] = tag
            for group in self.param_groups:
                group.setdefault("tag", tag)

    plain = lucid.optim.SGD([w], lr=0.1, momentum=0.9)  # plain SGD's, into your subclass
    plain.step()
    Tagged([w]).load_state_dict(plain.state_dict())
    tagged = Tagged([w], momentum=0.9)
    tagged.step()
    lucid.optim.SGD([w], lr=0.1).load_state_dict(tagged.state_dict())


def test_your_own_optimizer_loads_any_state_dict_as_torchs_does():
    """An `Optimizer` subclass that writes its own step keeps torch's rule: any
    state_dict loads, its groups and state as saved."""

    class Mine(lucid.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["count"] = self.state[p].get("count", 0) + 1

    class TorchMine(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

    w = lucid.Parameter(jnp.ones(3))
    sgd = lucid.optim.SGD([w], lr=0.5, momentum=0.9)
    w.grad = jnp.ones(3)
    sgd.step()
    mine = Mine([w])
    mine.load_state_dict(sgd.state_dict())
    p = torch.nn.Parameter(torch.ones(3))
    torch_sgd = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    p.grad = torch.ones(3)
    torch_sgd.step()
    theirs = TorchMine([p])
    theirs.load_state_dict(torch_sgd.state_dict())
    assert set(mine.param_groups[0]) == set(theirs.param_groups[0])
    assert mine.param_groups[0]["momentum"] == theirs.param_groups[0]["momentum"] == 0.9
    assert list(mine.state[w]) == list(theirs.state[p]) == ["momentum_buffer"]


PACKAGES = {"bitsandbytes": "bitsandbytes.optim", "torchao": "torchao.optim"}
PACKAGES["schedulefree"] = "schedulefree"
PACKAGES["kron-torch"] = "kron_torch"


def _package_step(opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    """One step (a Schedule-Free optimizer in train mode, with a closure where it needs one)."""
    if hasattr(opt, "train"):
        opt.train()
    p.grad = torch.ones(4, 4)
    if "Closure" in type(opt).__name__:
        opt.step(lambda: p.sum())
    else:
        opt.step()


def _steps(opt: torch.optim.Optimizer, p: torch.nn.Parameter, state_dict: dict) -> bool:
    """Whether ``opt`` loads ``state_dict`` and steps."""
    try:
        opt.load_state_dict(copy.deepcopy(state_dict))
        _package_step(opt, p)
    except Exception:  # the package fails late, in its own words
        return False
    return True


@pytest.mark.parametrize("reference", sorted(PACKAGES))
def test_the_packages_own_state_dicts_load_and_another_is_refused_where_they_fail(reference):
    """Every class of bitsandbytes, torchao, schedulefree and kron-torch: the package's own
    state_dict holds the options lucid requires and loads. torch's Adam's state_dict,
    where the package's class loads it and fails, is refused at the load (torchao keeps
    a small parameter's moments in full precision, as torch's Adam does: it takes them);
    so is the package's state_dict given to Adam, where torch's Adam fails on it."""
    package = pytest.importorskip(PACKAGES[reference])
    p = torch.nn.Parameter(torch.ones(4, 4))
    torch_adam = torch.optim.Adam([p])
    p.grad = torch.ones(4, 4)
    torch_adam.step()
    adams_own = torch_adam.state_dict()
    for entry in registered(reference):
        options = {"lr": 0.1, "momentum": 0.9} if entry.name[:3] in ("SGD", "LAR") else {}
        q = torch.nn.Parameter(torch.ones(4, 4))
        theirs = getattr(package, entry.name)([q], **options)
        try:
            _package_step(theirs, q)
        except RuntimeError:  # bitsandbytes' CPU AdEMAMix32bit fails on its own: no state
            theirs = getattr(package, entry.name)([q], **options)
        saved = theirs.state_dict()
        assert entry.saved <= set(saved["param_groups"][0]), entry.name
        mine = entry.cls([lucid.Parameter(jnp.ones((4, 4)))], **options)
        mine.load_state_dict(copy.deepcopy(saved))
        q = torch.nn.Parameter(torch.ones(4, 4))
        if _steps(getattr(package, entry.name)([q], **options), q, adams_own):
            mine.load_state_dict(copy.deepcopy(adams_own))
        else:
            with pytest.raises(ValueError, match="Nothing was changed") as caught:
                mine.load_state_dict(copy.deepcopy(adams_own))
            assert f"not by {reference}" in str(caught.value), str(caught.value)
        p = torch.nn.Parameter(torch.ones(4, 4))
        if not _steps(torch.optim.Adam([p]), p, saved):
            adam = lucid.optim.Adam([lucid.Parameter(jnp.ones((4, 4)))])
            with pytest.raises(ValueError, match="not by Adam"):
                adam.load_state_dict(copy.deepcopy(saved))
