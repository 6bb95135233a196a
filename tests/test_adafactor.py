"""Adafactor beyond the shared parity matrix (tests/cases.py runs its option sets through
the functional, eager and compiled paths): torch's signature and checks, parameters of
every rank (3-D factored over the last two axes, vectors, 0-d), state of its own shapes
in the compiled step and in checkpoints that move both ways."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import F64_RTOL, error_of, relative_error, to_numpy

import lucid
from lucid.functional import adafactor
from lucid.functional.adafactor import ADAFACTOR
from lucid.optim._engine import CompiledBackend


@pytest.mark.parametrize(
    "options",
    [
        {"lr": -1.0},
        {"lr": float("nan")},
        {"beta2_decay": 0.1},
        {"beta2_decay": 0.0},
        {"eps": (-1e-3, 1e-3)},
        {"eps": (None, -1e-3)},
        {"eps": (0.0, 0.0)},
        {"d": 0.5},
        {"d": 1.0},
        {"weight_decay": -0.1},
        {"lr": -1.0, "d": 0.0},  # the first failing check speaks
        {"maximize": True, "foreach": True},
    ],
    ids=str,
)
def test_construction_refuses_what_torch_refuses(options):
    expected = error_of(
        lambda: torch.optim.Adafactor([torch.zeros(2, requires_grad=True)], **options)
    )
    shell = error_of(lambda: lucid.optim.Adafactor([lucid.Parameter(jnp.zeros(2))], **options))
    assert shell == expected
    assert error_of(lambda: adafactor(**options)) == expected


# -------------------------------------------- parameters of every rank

SHAPES = {"cube": (2, 3, 4), "matrix": (1, 5), "scalar": (), "vector": (4,)}
_DATA = {k: np.random.default_rng(i).normal(size=s) for i, (k, s) in enumerate(SHAPES.items())}


def _grad(key, step):
    """A gradient sequence that changes direction and scale from step to step."""
    rng = np.random.default_rng(100 * step + len(key))
    return rng.normal(size=SHAPES[key]) * (1 + 0.5 * np.sin(step))


def _torch_run(options, steps):
    params = {k: torch.tensor(v, requires_grad=True) for k, v in _DATA.items()}
    opt = torch.optim.Adafactor(list(params.values()), **options)
    for step in range(steps):
        for key, p in params.items():
            p.grad = torch.tensor(_grad(key, step))
        opt.step()
    return params, opt


def _lucid_run(options, steps, compile_at=None):
    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in _DATA.items()}
    opt = lucid.optim.Adafactor(list(params.values()), **options)
    for step in range(steps):
        if step == compile_at:
            lucid.compile_optimizer(opt)
        for key, p in params.items():
            p.grad = jnp.asarray(_grad(key, step))
        opt.step()
    return params, opt


def _assert_matches(params, opt, tparams, topt):
    for key in tparams:
        err = relative_error(np.asarray(params[key].data), to_numpy(tparams[key]))
        assert err <= F64_RTOL, (key, err)
    ours, theirs = opt.state_dict(), topt.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for index, expected in theirs["state"].items():
        assert set(ours["state"][index]) == set(expected)
        for name, value in expected.items():
            actual = np.asarray(ours["state"][index][name])
            assert actual.shape == tuple(value.shape), (index, name)
            assert relative_error(actual, to_numpy(value)) <= 1e-9, (index, name)


@pytest.mark.parametrize("compile_at", [None, 0, 3], ids=["eager", "compiled", "adopting"])
def test_every_rank_matches_torch(compile_at):
    options = {"lr": 0.05, "weight_decay": 0.1, "eps": (None, 1e-2)}
    tparams, topt = _torch_run(options, 8)
    params, opt = _lucid_run(options, 8, compile_at)
    _assert_matches(params, opt, tparams, topt)
    state = opt.state[params["cube"]]
    assert state["row_var"].shape == (2, 3, 1) and state["col_var"].shape == (2, 1, 4)
    assert set(opt.state[params["scalar"]]) == {"step", "variance"}
    if compile_at is not None:
        buckets = opt.backend._buckets
        assert isinstance(opt.backend, CompiledBackend)
        assert len(buckets) == len(SHAPES) and not any(b.store.flat for b in buckets)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_checkpoints_move_both_ways(compiled):
    options = {"lr": 0.05, "beta2_decay": -0.6}
    tparams, topt = _torch_run(options, 5)
    # a copy: on the CPU, jax may share a NumPy view's memory, which torch keeps updating
    params = {k: lucid.Parameter(jnp.array(v.detach().numpy())) for k, v in tparams.items()}
    opt = lucid.optim.Adafactor(list(params.values()), **options)
    if compiled:
        lucid.compile_optimizer(opt)
    opt.load_state_dict(topt.state_dict())  # torch -> lucid: row_var/col_var keepdim shapes
    for step in range(5, 9):
        for key in params:
            params[key].grad = jnp.asarray(_grad(key, step))
            tparams[key].grad = torch.tensor(_grad(key, step))
        opt.step()
        topt.step()
    _assert_matches(params, opt, tparams, topt)
    sd = opt.state_dict()  # lucid -> torch
    tparams2 = {k: torch.tensor(np.asarray(p.data), requires_grad=True) for k, p in params.items()}
    topt2 = torch.optim.Adafactor(list(tparams2.values()), **options)
    as_torch = {
        i: {n: torch.as_tensor(np.array(v)) for n, v in s.items()} for i, s in sd["state"].items()
    }
    topt2.load_state_dict({"state": as_torch, "param_groups": sd["param_groups"]})
    for step in range(9, 12):
        for key in params:
            params[key].grad = jnp.asarray(_grad(key, step))
            tparams2[key].grad = torch.tensor(_grad(key, step))
        opt.step()
        topt2.step()
    _assert_matches(params, opt, tparams2, topt2)


def test_a_state_of_the_wrong_shape_is_refused_and_nothing_changes():
    _, opt = _lucid_run({}, 2)
    saved = opt.state_dict()
    bad = {**saved, "state": {**saved["state"], 0: dict(saved["state"][0])}}
    bad["state"][0]["row_var"] = np.zeros((2, 3, 4))  # the parameter's shape, not (2, 3, 1)
    with pytest.raises(ValueError, match=r"keeps it as \(2, 3, 1\)"):
        opt.load_state_dict(bad)
    missing = {**saved, "state": {**saved["state"], 0: {"step": saved["state"][0]["step"]}}}
    with pytest.raises(ValueError, match="missing"):
        opt.load_state_dict(missing)
    after = opt.state_dict()
    for index, entry in saved["state"].items():
        for name, value in entry.items():
            np.testing.assert_array_equal(np.asarray(after["state"][index][name]), value)


def test_the_rule_declares_what_the_compiled_step_needs():
    assert ADAFACTOR.execution.elementwise is False and ADAFACTOR.storage_dtype is True
