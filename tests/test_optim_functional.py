"""lucid.optim.functional against torch's functional optimizers.

torch 2.15's ``torch.optim.functional`` re-exports, under one module, the functions
torch 2.13 already has in each optimizer's module (``torch.optim.adam.adam``, ...,
``torch.optim._functional.sparse_adam``, ``torch.optim._muon.muon``) with the same
signatures. torch 2.13 is the suite's oracle, so those are the references here: the
same signature (names, kinds, defaults), and the same numbers over several calls from
the same non-trivial state (float64, to 1e-10), every list torch updates in place
compared with the list lucid returns, for option sets that switch every branch.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.optim._muon as torch_muon
from jax.experimental import sparse
from test_muon import TORCH_NS_F64

import lucid
import lucid.optim.functional as F
from lucid.functional.muon import _with_ns_dtype

# torch 2.13's functional forms, one per optimizer module (torch 2.15 re-exports these)
TORCH = {
    name: getattr(importlib.import_module(f"torch.optim.{module}"), name)
    for name, module in {
        "adadelta": "adadelta",
        "adafactor": "_adafactor",
        "adagrad": "adagrad",
        "adam": "adam",
        "adamax": "adamax",
        "adamw": "adamw",
        "asgd": "asgd",
        "muon": "_muon",
        "nadam": "nadam",
        "radam": "radam",
        "rmsprop": "rmsprop",
        "rprop": "rprop",
        "sgd": "sgd",
        "sparse_adam": "_functional",
    }.items()
}

SHAPES = [(3, 4), (5,)]
MATRICES = [(3, 4), (5, 2)]
STEPS = 3

# each list's starting entries for a parameter of `shape` (the state a few steps in:
# positive where torch's state is, steps past the first)
_POSITIVE = ("exp_avg_sqs", "max_exp_avg_sqs", "exp_infs", "square_avgs", "acc_deltas")


def _entry(name, shape, rng):
    if name == "state_steps":
        return np.array(3.0, np.float32)
    if name in _POSITIVE or name == "state_sums":
        return rng.uniform(0.1, 1.0, size=shape)
    if name == "step_sizes":
        return rng.uniform(0.01, 0.1, size=shape)
    if name == "mu_products":
        # the parameters' dtype, as lucid's NAdam keeps it (and torch's under float64 as
        # the default dtype): the rule computes this step with the product unrounded
        return np.array(0.7)
    if name == "etas":
        return np.array(0.09, np.float32)
    if name == "mus":
        return np.array(0.5, np.float32)
    if name == "row_vars":
        return rng.uniform(0.1, 1.0, size=(*shape[:-1], 1)) if len(shape) > 1 else None
    if name == "col_vars":
        return rng.uniform(0.1, 1.0, size=(*shape[:-2], 1, shape[-1])) if len(shape) > 1 else None
    if name == "variances":
        return rng.uniform(0.1, 1.0, size=shape) if len(shape) <= 1 else None
    return rng.normal(size=shape)  # exp_avgs, axs, prevs, grad_avgs, momentum buffers


LISTS = {
    "adadelta": ["square_avgs", "acc_deltas", "state_steps"],
    "adafactor": ["row_vars", "col_vars", "variances", "state_steps"],
    "adagrad": ["state_sums", "state_steps"],
    "adam": ["exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps"],
    "adamw": ["exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps"],
    "adamax": ["exp_avgs", "exp_infs", "state_steps"],
    "asgd": ["axs", "mus", "etas", "state_steps"],
    "muon": ["muon_momentum_bufs"],
    "nadam": ["exp_avgs", "exp_avg_sqs", "mu_products", "state_steps"],
    "radam": ["exp_avgs", "exp_avg_sqs", "state_steps"],
    "rmsprop": ["square_avgs", "grad_avgs", "momentum_buffer_list", "state_steps"],
    "rprop": ["prevs", "step_sizes", "state_steps"],
    "sgd": ["momentum_buffer_list"],
    "sparse_adam": ["exp_avgs", "exp_avg_sqs", "state_steps"],
}

ADAM = {"amsgrad": False, "beta1": 0.9, "beta2": 0.99, "lr": 0.01, "weight_decay": 0.0}
CASES = {
    "adadelta": [
        {"lr": 1.0, "rho": 0.9, "eps": 1e-6, "weight_decay": 0.0, "maximize": False},
        {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1, "maximize": True},
    ],
    "adafactor": [
        {
            "d": 1.0,
            "lr": 1e-2,
            "beta2_decay": -0.8,
            "weight_decay": 0.0,
            "eps1": None,
            "eps2": 1e-3,
            "maximize": False,
        },
        {
            "d": 1.5,
            "lr": 0.3,
            "beta2_decay": -0.5,
            "weight_decay": 0.1,
            "eps1": 1e-20,
            "eps2": 1e-2,
            "maximize": True,
        },
    ],
    "adagrad": [
        {"lr": 0.1, "weight_decay": 0.0, "lr_decay": 0.0, "eps": 1e-10, "maximize": False},
        {"lr": 0.1, "weight_decay": 0.1, "lr_decay": 0.01, "eps": 1e-6, "maximize": True},
    ],
    "adam": [
        {**ADAM, "eps": 1e-8, "maximize": False},
        {**ADAM, "amsgrad": True, "weight_decay": 0.1, "eps": 1e-6, "maximize": True},
        {
            **ADAM,
            "weight_decay": 0.1,
            "eps": 1e-8,
            "maximize": False,
            "decoupled_weight_decay": True,
        },
    ],
    "adamw": [
        {**ADAM, "weight_decay": 1e-2, "eps": 1e-8, "maximize": False},
        {**ADAM, "amsgrad": True, "weight_decay": 0.1, "eps": 1e-6, "maximize": True},
    ],
    "adamax": [
        {"eps": 1e-8, "beta1": 0.9, "beta2": 0.999, "lr": 2e-3, "weight_decay": 0.0},
        {"eps": 1e-6, "beta1": 0.8, "beta2": 0.9, "lr": 0.1, "weight_decay": 0.1, "maximize": True},
    ],
    "asgd": [
        {"lambd": 1e-4, "lr": 0.1, "t0": 1e6, "alpha": 0.75, "weight_decay": 0.0},
        {"lambd": 1e-2, "lr": 0.05, "t0": 2.0, "alpha": 0.5, "weight_decay": 0.1, "maximize": True},
    ],
    "muon": [
        {
            "lr": 0.02,
            "weight_decay": 0.1,
            "momentum": 0.95,
            "nesterov": True,
            "ns_coefficients": (3.4445, -4.775, 2.0315),
            "ns_steps": 5,
            "eps": 1e-7,
            "adjust_lr_fn": None,
            "has_complex": False,
        },
        {
            "lr": 0.02,
            "weight_decay": 0.0,
            "momentum": 0.5,
            "nesterov": False,
            "ns_coefficients": (2.0, -1.5, 0.5),
            "ns_steps": 3,
            "eps": 1e-5,
            "adjust_lr_fn": "match_rms_adamw",
            "has_complex": False,
        },
    ],
    "nadam": [
        {
            "beta1": 0.9,
            "beta2": 0.999,
            "lr": 2e-3,
            "weight_decay": 0.0,
            "momentum_decay": 4e-3,
            "eps": 1e-8,
        },
        {
            "beta1": 0.8,
            "beta2": 0.9,
            "lr": 0.1,
            "weight_decay": 0.1,
            "momentum_decay": 0.1,
            "eps": 1e-6,
            "decoupled_weight_decay": True,
            "maximize": True,
        },
    ],
    "radam": [
        {"beta1": 0.9, "beta2": 0.999, "lr": 1e-3, "weight_decay": 0.0, "eps": 1e-8},
        {
            "beta1": 0.8,
            "beta2": 0.9,
            "lr": 0.1,
            "weight_decay": 0.1,
            "eps": 1e-6,
            "decoupled_weight_decay": True,
            "maximize": True,
        },
    ],
    "rmsprop": [
        {
            "lr": 0.01,
            "alpha": 0.99,
            "eps": 1e-8,
            "weight_decay": 0.0,
            "momentum": 0.0,
            "centered": False,
        },
        {
            "lr": 0.01,
            "alpha": 0.9,
            "eps": 1e-6,
            "weight_decay": 0.1,
            "momentum": 0.5,
            "centered": True,
            "maximize": True,
        },
    ],
    "rprop": [
        {"step_size_min": 1e-6, "step_size_max": 50.0, "etaminus": 0.5, "etaplus": 1.2},
        {
            "step_size_min": 0.02,
            "step_size_max": 0.09,
            "etaminus": 0.3,
            "etaplus": 1.5,
            "maximize": True,
        },
    ],
    "sgd": [
        {
            "weight_decay": 0.0,
            "momentum": 0.0,
            "lr": 0.1,
            "dampening": 0.0,
            "nesterov": False,
            "maximize": False,
        },
        {
            "weight_decay": 0.1,
            "momentum": 0.9,
            "lr": 0.1,
            "dampening": 0.0,
            "nesterov": True,
            "maximize": True,
        },
        {
            "weight_decay": 0.0,
            "momentum": 0.9,
            "lr": 0.1,
            "dampening": 0.3,
            "nesterov": False,
            "maximize": False,
        },
    ],
    "sparse_adam": [
        {"eps": 1e-8, "beta1": 0.9, "beta2": 0.999, "lr": 0.01, "maximize": False},
        {"eps": 1e-6, "beta1": 0.8, "beta2": 0.9, "lr": 0.1, "maximize": True},
    ],
}


def _unused(name, kwargs, list_name):
    """A list torch's class passes empty under these options (and torch never reads)."""
    return (
        (list_name == "max_exp_avg_sqs" and not kwargs.get("amsgrad"))
        or (list_name == "grad_avgs" and not kwargs.get("centered"))
        or (list_name == "momentum_buffer_list" and not kwargs.get("momentum"))
    )


def _start(name, kwargs, shapes, rng):
    lists = {}
    for list_name in LISTS[name]:
        if _unused(name, kwargs, list_name):
            lists[list_name] = []
        elif name == "sgd":  # torch's class: None until the first step with momentum
            lists[list_name] = [None, _entry(list_name, shapes[1], rng)]
        elif name == "sparse_adam" and list_name == "state_steps":
            lists[list_name] = [3, 3]  # ints, counted by the caller
        else:
            lists[list_name] = [_entry(list_name, shape, rng) for shape in shapes]
    return lists


def _to_torch(value):
    if value is None or isinstance(value, int):
        return value
    return torch.tensor(value)


def _to_jax(value):
    if value is None or isinstance(value, int):
        return value
    return jnp.asarray(value)


def _numpy(value):
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def _sparse_grads(rng, shapes):
    """Gradients with some rows absent, as torch's sparse COO and jax's BCOO (the same
    entries) and dense (for the present values)."""
    out = []
    for shape in shapes:
        dense = rng.normal(size=shape)
        dense[1] = 0.0  # an absent row
        out.append(dense)
    return out


def _run(name, kwargs, shapes, monkeypatch=None):
    """``STEPS`` calls of torch's function and of lucid's from the same start; every
    list after every call, compared."""
    rng = np.random.default_rng(sorted(TORCH).index(name) + 10 * len(kwargs))
    params = [rng.normal(size=shape) for shape in shapes]
    lists = _start(name, kwargs, shapes, rng)
    t_params = [torch.tensor(p) for p in params]
    t_lists = {k: [_to_torch(v) for v in vs] for k, vs in lists.items()}
    j_params = [jnp.asarray(p) for p in params]
    j_lists = {k: [_to_jax(v) for v in vs] for k, vs in lists.items()}
    for step in range(STEPS):
        grads = (
            _sparse_grads(rng, shapes)
            if name == "sparse_adam"
            else [rng.normal(size=s) for s in shapes]
        )
        if name == "sparse_adam":
            t_grads = [torch.tensor(g).to_sparse() for g in grads]
            j_grads = [sparse.BCOO.fromdense(jnp.asarray(g)) for g in grads]
            t_lists["state_steps"] = j_lists["state_steps"] = [4 + step] * len(shapes)
        else:
            t_grads = [torch.tensor(g) for g in grads]
            j_grads = [jnp.asarray(g) for g in grads]
        with torch.no_grad():
            TORCH[name](t_params, t_grads, *t_lists.values(), **kwargs)
        out = getattr(F, name)(j_params, j_grads, *j_lists.values(), **kwargs)
        assert len(out) == 1 + len(j_lists)
        j_params, new_lists = out[0], out[1:]
        j_lists = dict(zip(j_lists, new_lists))
        _assert_same(name, step, "params", t_params, j_params)
        for list_name in t_lists:
            _assert_same(name, step, list_name, t_lists[list_name], j_lists[list_name])


def _assert_same(name, step, list_name, theirs, ours):
    assert len(ours) == len(theirs), (name, list_name)
    for i, (t, o) in enumerate(zip(theirs, ours)):
        where = f"{name} call {step + 1}: {list_name}[{i}]"
        if t is None or isinstance(t, int):
            assert o == t, where
            continue
        t, o = _numpy(t), _numpy(o)
        assert o.shape == t.shape and o.dtype == t.dtype, (where, o.shape, t.shape, o.dtype)
        np.testing.assert_allclose(o, t, rtol=1e-10, atol=1e-13, err_msg=where)


@pytest.fixture
def float64_muon(monkeypatch):
    """Both Muons with the Newton-Schulz iteration in float64 (tests/test_muon.py's
    oracle, the one token of torch's source changed), so the rest compares exactly."""
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", TORCH_NS_F64)
    monkeypatch.setattr(F, "_MUON", dataclasses.replace(F._MUON, rule=_with_ns_dtype(jnp.float64)))


def _cases():
    for name in sorted(CASES):
        for i, kwargs in enumerate(CASES[name]):
            yield pytest.param(name, kwargs, id=f"{name}-{i}")


@pytest.mark.parametrize(("name", "kwargs"), list(_cases()))
def test_every_function_is_torchs_over_several_calls(name, kwargs, request):
    if name == "muon":
        request.getfixturevalue("float64_muon")
    _run(name, kwargs, MATRICES if name == "muon" else SHAPES)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_every_function_has_torchs_signature(name):
    ours = inspect.signature(getattr(F, name)).parameters
    theirs = inspect.signature(TORCH[name]).parameters
    assert list(ours) == list(theirs)
    for key, parameter in theirs.items():
        assert (ours[key].kind, ours[key].default) == (parameter.kind, parameter.default), key


def test_the_module_holds_torch_215s_fourteen_functions():
    assert sorted(F.__all__) == sorted(TORCH) and len(F.__all__) == 14
    assert lucid.optim.functional is F


def test_complex_parameters_run_on_their_real_view_as_torchs_has_complex():
    rng = np.random.default_rng(5)
    param = rng.normal(size=3) + 1j * rng.normal(size=3)
    t_params, t_steps = [torch.tensor(param)], [torch.tensor(0.0)]
    t_lists = [[torch.zeros(3, dtype=torch.complex128)] for _ in range(2)]
    j_params, j_steps = [jnp.asarray(param)], [jnp.zeros(())]
    j_lists = [[jnp.zeros(3, jnp.complex128)] for _ in range(2)]
    kwargs = {**ADAM, "eps": 1e-8, "maximize": False}
    for _ in range(2):
        grad = rng.normal(size=3) + 1j * rng.normal(size=3)
        TORCH["adam"](
            t_params, [torch.tensor(grad)], *t_lists, [], t_steps, has_complex=True, **kwargs
        )
        j_params, *j_lists, _, j_steps = F.adam(
            j_params, [jnp.asarray(grad)], *j_lists, [], j_steps, **kwargs
        )
    np.testing.assert_allclose(np.asarray(j_params[0]), t_params[0].numpy(), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(j_lists[1][0]), t_lists[1][0].numpy(), rtol=1e-10)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sparse_gradients_as_torchs(name):
    kwargs = CASES[name][0]
    rng = np.random.default_rng(2)
    param, grad = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    grad[2] = 0.0
    lists = [[None]] if name == "sgd" else [[np.full((4, 3), 0.1)], [np.array(0.0, np.float32)]]
    t_params = [torch.tensor(param)]
    t_lists = [[_to_torch(v) for v in vs] for vs in lists]
    with torch.no_grad():
        TORCH[name](
            t_params, [torch.tensor(grad).to_sparse()], *t_lists, has_sparse_grad=True, **kwargs
        )
    out = getattr(F, name)(
        [jnp.asarray(param)],
        [sparse.BCOO.fromdense(jnp.asarray(grad))],
        *[[_to_jax(v) for v in vs] for vs in lists],
        has_sparse_grad=True,
        **kwargs,
    )
    np.testing.assert_allclose(np.asarray(out[0][0]), t_params[0].numpy(), rtol=1e-12)
    if name == "adagrad":
        np.testing.assert_allclose(np.asarray(out[1][0]), t_lists[0][0].numpy(), rtol=1e-12)


def test_the_functions_are_pure_and_jit():
    """Nothing given is changed; under jax.jit (hyper-parameters traced) the same numbers."""
    params, grads = [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])]
    exp_avgs, exp_avg_sqs, steps = [jnp.full(2, 0.1)], [jnp.full(2, 0.2)], [jnp.ones(())]
    kwargs = {**ADAM, "eps": 1e-8, "maximize": False}

    def call(params, grads, exp_avgs, exp_avg_sqs, steps, lr):
        return F.adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, **{**kwargs, "lr": lr})

    eager = call(params, grads, exp_avgs, exp_avg_sqs, steps, 0.01)
    jitted = jax.jit(call)(params, grads, exp_avgs, exp_avg_sqs, steps, 0.01)
    for e, j in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_allclose(np.asarray(j), np.asarray(e), rtol=1e-6)
    assert float(steps[0]) == 1.0 and float(exp_avgs[0][0]) == np.float32(0.1)
    assert float(eager[4][0]) == 2.0


def test_torchs_knobs_and_bad_lists_are_refused_in_words():
    p, g = [jnp.ones(2)], [jnp.ones(2)]
    base = {"weight_decay": 0.0, "momentum": 0.9, "lr": 0.1, "dampening": 0.0}
    base |= {"nesterov": False, "maximize": False}
    with pytest.raises(ValueError, match="grad_scale"):
        F.sgd(p, g, [None], grad_scale=jnp.ones(()), **base)
    with pytest.raises(ValueError, match="found_inf"):
        F.sgd(p, g, [None], found_inf=jnp.zeros(()), **base)
    with pytest.raises(ValueError, match="momentum_buffer_list has 0 entries for 1"):
        F.sgd(p, g, [], **base)
    F.sgd(p, g, [], **{**base, "momentum": 0.0})  # unused: may be empty, as torch's
    with pytest.raises(ValueError, match=r"exp_avgs\[0\] has shape \(3,\)"):
        F.adam(
            p,
            g,
            [jnp.ones(3)],
            [jnp.ones(2)],
            [],
            [jnp.zeros(())],
            **ADAM,
            eps=1e-8,
            maximize=False,
        )
    with pytest.raises(ValueError, match="differentiable"):
        F.adam(
            p,
            g,
            [jnp.ones(2)],
            [jnp.ones(2)],
            [],
            [jnp.zeros(())],
            differentiable=True,
            **ADAM,
            eps=1e-8,
            maximize=False,
        )
    with pytest.raises(TypeError, match="lr"):
        F.sgd(p, g, [None], **{**base, "lr": "0.1"})
    with pytest.raises(TypeError):
        F.sgd(p, g, [None], **base, not_an_option=1)
    with pytest.raises(RuntimeError, match="does not support sparse"):
        F.adam(
            p,
            [sparse.BCOO.fromdense(jnp.ones(2))],
            [jnp.ones(2)],
            [jnp.ones(2)],
            [],
            [jnp.zeros(())],
            **ADAM,
            eps=1e-8,
            maximize=False,
        )
    muon = dict(CASES["muon"][0])
    w = [jnp.ones((2, 2))]
    with pytest.raises(ValueError, match="Adjust learning rate function rms"):
        F.muon(w, w, [jnp.zeros((2, 2))], **{**muon, "adjust_lr_fn": "rms"})
    # torch's own errors, the same type and words
    for change, error in [({"foreach": True}, RuntimeError), ({"has_complex": True}, ValueError)]:
        t = [torch.ones(2, 2)]
        with pytest.raises(error) as theirs:
            TORCH["muon"](t, t, [torch.zeros(2, 2)], **{**muon, **change})
        with pytest.raises(error, match=str(theirs.value)):
            F.muon(w, w, [jnp.zeros((2, 2))], **{**muon, **change})
    with pytest.raises(ValueError, match=r"row_vars\[0\] is None"):
        F.adafactor(w, w, [None], [None], [None], [jnp.zeros(())], **CASES["adafactor"][0])
