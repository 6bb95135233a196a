"""Errors that name the user's mistake and the fix, and change nothing.

Each mistake here used to surface as an internal error (numpy's, Python's or jax's
words about lucid's own code) or not at all. Where torch has the same mistake, its
exception type (and, where it has them, its words) is the reference, taken from torch
on the same input. Where a failed call could change something, the test checks that the
parameters, their gradients and the optimizer's state are as they were. Parameters on
several device domains run in a subprocess with 8 host devices
(tests/_placement_script.py).
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from _distributed import HOST_DEVICES, rendezvous_flags, run_host_program

import lucid
import lucid.functional as LF
from lucid.optim import lr_scheduler, swa_utils
from lucid.optim._registry import REFERENCES, registered

HERE = Path(__file__).parent


def _error_type(run):
    try:
        run()
    except Exception as error:  # the type is what is compared
        return type(error)
    return None


def _snapshot(opt):
    """Parameters, gradients and state_dict of ``opt``, as NumPy copies."""
    params = [p for group in opt.param_groups for p in group["params"]]
    state = opt.state_dict()
    return (
        [np.array(p.data) for p in params],
        [None if p.grad is None else np.array(p.grad) for p in params],
        {i: {k: np.array(v) for k, v in s.items()} for i, s in state["state"].items()},
        [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]],
    )


def _assert_same(before, after):
    values, grads, state, groups = before
    values2, grads2, state2, groups2 = after
    for a, b in zip(values, values2):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(grads, grads2):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)
    assert state.keys() == state2.keys()
    for i in state:
        assert state[i].keys() == state2[i].keys()
        for k in state[i]:
            np.testing.assert_array_equal(state[i][k], state2[i][k])
    assert repr(groups) == repr(groups2)


# ------------------------------------------------------------ Adafactor's eps

PAIR = (
    r"eps must be a pair \(eps1, eps2\).*"
    r"None for the parameter dtype's machine epsilon.*\(None, 1e-3\)"
)


@pytest.mark.parametrize("eps", [None, 1e-3, "ab"], ids=["None", "float", "str"])
def test_adafactor_eps_that_is_not_a_pair_says_what_the_pair_is(eps):
    """torch 2.13: TypeError ('NoneType' object is not subscriptable...); lucid: the
    same type, naming the pair and torch's default."""
    expected = _error_type(
        lambda: torch.optim.Adafactor([torch.nn.Parameter(torch.ones(2, 3))], eps=eps)
    )
    assert expected is TypeError
    w = lucid.Parameter(jnp.ones((2, 3)))
    with pytest.raises(TypeError, match=PAIR):
        lucid.optim.Adafactor([w], eps=eps)
    with pytest.raises(TypeError, match=PAIR):
        LF.adafactor(eps=eps)


@pytest.mark.parametrize("compiled", [False, True])
def test_adafactor_eps_none_in_a_group_is_refused_and_changes_nothing(compiled):
    w, v = lucid.Parameter(jnp.ones((2, 3))), lucid.Parameter(jnp.ones(4))
    opt = lucid.optim.Adafactor([w], lr=0.1)
    if compiled:
        lucid.compile_optimizer(opt)
    w.grad = jnp.full((2, 3), 0.5)
    opt.step()
    w.grad = jnp.full((2, 3), 0.25)
    before = _snapshot(opt)
    with pytest.raises(TypeError, match=PAIR):
        opt.add_param_group({"params": [v], "eps": None})
    opt.param_groups[0]["eps"] = None  # a hand edit, refused at the step
    with pytest.raises(TypeError, match=PAIR):
        opt.step()
    opt.param_groups[0]["eps"] = (None, 1e-3)
    _assert_same(before, _snapshot(opt))
    assert len(opt.param_groups) == 1


# ------------------------------------------------- total norm of an empty tensor

NORM_TYPES = [-math.inf, math.inf, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0]
SHAPES = [[(0,)], [(0,), (2,)], [(3,), (0, 4)]]


def _values(shapes):
    return [np.arange(1.0, 1.0 + math.prod(s)).reshape(s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_total_norm_with_an_empty_tensor_is_torchs_value_or_torchs_error(norm_type, shapes):
    values = _values(shapes)
    tensors = [torch.tensor(v) for v in values]
    try:
        expected = float(torch.nn.utils.get_total_norm(tensors, norm_type, foreach=False))
    except RuntimeError as error:
        torchs = str(error)
    else:
        got = lucid.nn.utils.get_total_norm([jnp.asarray(v) for v in values], norm_type)
        np.testing.assert_allclose(float(got), expected, rtol=1e-6)
        return
    with pytest.raises(RuntimeError) as info:
        lucid.nn.utils.get_total_norm([jnp.asarray(v) for v in values], norm_type)
    message = str(info.value)
    assert message.startswith(torchs), (message, torchs)
    assert "leave the empty arrays out, or use a finite norm_type >= 0" in message


@pytest.mark.parametrize("compiled", [False, True])
def test_clipping_an_empty_gradient_by_an_infinite_norm_changes_nothing(compiled):
    a, b = lucid.Parameter(jnp.ones(3)), lucid.Parameter(jnp.ones(0))
    opt = lucid.optim.SGD([a, b], lr=0.1)
    if compiled:
        lucid.compile_optimizer(opt)
    a.grad, b.grad = jnp.array([3.0, -4.0, 12.0]), jnp.zeros(0)
    before = _snapshot(opt)
    for norm_type in (-math.inf, math.inf):
        with pytest.raises(RuntimeError, match=r"cannot compute the -?inf norm on an empty"):
            lucid.nn.utils.clip_grad_norm_([a, b], 1.0, norm_type)
    _assert_same(before, _snapshot(opt))
    with pytest.raises(RuntimeError, match="on an empty tensor"):
        LF.clip_grad_norm(1.0, -math.inf).update([a.grad, b.grad], optax.EmptyState())


# --------------------------------------------------- a loss with more than the loss


def _logits_loss(w, x):
    logits = w * x
    return logits, jnp.sum(logits**2)


def _loss_aux(w, x):
    logits = w * x
    return jnp.sum(logits**2), logits


def _named(w, x):
    return {"loss": jnp.sum((w * x) ** 2)}


@pytest.mark.parametrize(
    "loss_fn, fix",
    [
        (_logits_loss, r"return \(loss, logits\) instead.*has_aux=True"),
        (_loss_aux, r"if it is \(loss, aux\), pass has_aux=True"),
        (_named, r"return the pair \(loss, aux\), the loss first.*has_aux=True"),
    ],
    ids=["(logits, loss)", "(loss, aux)", "dict"],
)
@pytest.mark.parametrize("how", ["backward", "fused", "fused_compiled", "fused_accumulate"])
def test_a_loss_returning_more_than_the_loss_says_has_aux(loss_fn, fix, how):
    w = lucid.Parameter(jnp.array([1.0, -2.0]))
    opt = lucid.optim.Adam([w], lr=0.1)
    w.grad = jnp.array([0.5, 0.5])
    opt.step()  # state to keep
    w.grad = jnp.array([0.25, 0.25])
    x = jnp.array([1.0, 3.0])
    if how == "fused_compiled":
        lucid.compile_optimizer(opt)
    before = _snapshot(opt)
    with pytest.raises(TypeError, match=fix) as info:
        if how == "backward":
            lucid.backward(loss_fn, w, x)
        elif how == "fused_accumulate":
            lucid.fused_step(loss_fn, opt, accumulate=2)(w, jnp.stack([x, x]))
        else:
            lucid.fused_step(loss_fn, opt)(w, x)
    assert "loss_fn returned a" in str(info.value)
    _assert_same(before, _snapshot(opt))
    # with has_aux=True (and the loss first) the same loss function works
    pair = (lambda w, x: _logits_loss(w, x)[::-1]) if loss_fn is _logits_loss else None
    if pair is not None:
        opt.zero_grad()
        _, logits = lucid.backward(pair, w, x, has_aux=True)
        assert logits.shape == (2,) and w.grad is not None


# -------------------------------------------------- compile_optimizer's refusal


def test_compile_optimizer_lists_each_supported_class_once_by_family():
    with pytest.raises(TypeError) as info:
        lucid.compile_optimizer(object())
    message = str(info.value)
    assert "got builtins.object" in message
    families = {}
    for line in message.splitlines()[1:]:
        found = re.fullmatch(r"  (\S+) \((\S+)\): (.*)", line)
        assert found, line
        reference, namespace, names = found.groups()
        names = names.split(", ")
        assert len(names) == len(set(names)), f"{reference} lists a class twice: {names}"
        module = importlib.import_module(namespace)
        for name in names:  # each is the class of that name where the family lives
            assert registered(reference) and getattr(module, name) in {
                entry.cls for entry in registered(reference)
            }
        families[reference] = set(names)
    assert list(families) == list(REFERENCES)
    for entry in registered():
        assert entry.name in families[entry.reference]
    assert sum(map(len, families.values())) == len(registered())


def test_compile_optimizer_tells_a_subclass_and_a_torch_optimizer_what_to_do():
    class MyAdam(lucid.optim.Adam):
        pass

    with pytest.raises(TypeError, match=r"subclass of lucid\.optim\.Adam.*compile a lucid"):
        lucid.compile_optimizer(MyAdam([lucid.Parameter(jnp.ones(2))]))
    torch_sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(TypeError, match=r"a torch optimizer: build lucid's counterpart"):
        lucid.compile_optimizer(torch_sgd)


# ------------------------------------------------------ Parameter is not an array


def _with_array(p):
    return jnp.ones(3) * p


OPERATIONS = [
    (lambda p: p * 2, "`p.data * x`"),
    (lambda p: 2 * p, "`x * p.data`"),
    (lambda p: p + jnp.ones(3), "`p.data + x`"),
    (_with_array, "`x * p.data`"),
    (lambda p: np.ones(3) - p, "`x - p.data`"),
    (lambda p: np.float32(2) / p, "`x / p.data`"),
    (lambda p: p @ p, "`p.data @ x`"),
    (lambda p: p**2, "`p.data ** x`"),
    (lambda p: -p, "`-p.data`"),
    (lambda p: abs(p), "`abs(p.data)`"),
    (lambda p: p[0], "`p.data[...]`"),
    (lambda p: len(p), "`len(p.data)`"),
]


@pytest.mark.parametrize("operation, fix", OPERATIONS, ids=[fix for _, fix in OPERATIONS])
def test_arithmetic_on_a_parameter_points_at_its_data(operation, fix):
    p = lucid.Parameter(jnp.arange(3.0))
    with pytest.raises(TypeError, match=r"a lucid\.Parameter is a box around an array") as info:
        operation(p)
    assert fix in str(info.value)
    np.testing.assert_array_equal(p.data, [0.0, 1.0, 2.0])
    assert p.grad is None


def test_in_place_arithmetic_on_a_parameter_points_at_assigning_data():
    p = lucid.Parameter(jnp.arange(3.0))
    q = p
    with pytest.raises(TypeError, match=re.escape("assign `.data`: `p.data = p.data - x`")):
        q -= 1.0
    assert q is p
    np.testing.assert_array_equal(p.data, [0.0, 1.0, 2.0])
    # what still works: identity, hashing, truth, NumPy conversion
    assert p == p and {p: 1}[p] == 1 and bool(p)
    np.testing.assert_array_equal(np.asarray(p), [0.0, 1.0, 2.0])


def test_nnx_update_given_parameters_fails_at_the_first_use_pointing_at_values():
    """flax takes Parameters in place of arrays silently; the model's first use of one
    names the fix (older flax reads a Linear's kernel through NumPy and fails at the
    LayerNorm instead)."""
    nnx = pytest.importorskip("flax.nnx")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(3, 4, rngs=rngs)
            self.norm = nnx.LayerNorm(4, rngs=rngs)

        def __call__(self, x):
            return self.norm(self.fc(x))

    model = Model(nnx.Rngs(0))
    x = jnp.ones((2, 3))
    expected = np.asarray(model(x))
    _, state = nnx.split(model)
    boxed = lucid.parameters(state)
    nnx.update(model, boxed)
    with pytest.raises(TypeError, match=re.escape("nnx.update(model, lucid.values(boxed))")):
        model(x)
    nnx.update(model, lucid.values(boxed))  # the fix
    np.testing.assert_array_equal(np.asarray(model(x)), expected)


# ------------------------------------------------- a scheduler given a transform


def _one(epoch):
    return 1.0


SCHEDULERS = [
    ("StepLR", {"step_size": 2}),
    ("MultiStepLR", {"milestones": [1]}),
    ("ExponentialLR", {"gamma": 0.9}),
    ("CosineAnnealingLR", {"T_max": 3}),
    ("CosineAnnealingWarmRestarts", {"T_0": 3}),
    ("LambdaLR", {"lr_lambda": _one}),
    ("MultiplicativeLR", {"lr_lambda": _one}),
    ("LinearLR", {}),
    ("ConstantLR", {}),
    ("PolynomialLR", {}),
    ("CyclicLR", {"base_lr": 0.1, "max_lr": 1.0}),
    ("OneCycleLR", {"max_lr": 1.0, "total_steps": 10}),
    ("ReduceLROnPlateau", {}),
    ("SWALR", {"swa_lr": 0.1}),
    ("NoamScheduler", {"d_model": 4, "warmup_steps": 2}),
]
TRANSFORMS = {
    "optax.adam(1e-3)": lambda: optax.adam(1e-3),
    "LF.adam(lr=1e-3)": lambda: LF.adam(lr=1e-3),
    "optax.adam": lambda: optax.adam,
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("name, kwargs", SCHEDULERS, ids=[name for name, _ in SCHEDULERS])
def test_a_scheduler_given_an_optax_transform_points_to_functional_schedules(
    name, kwargs, transform
):
    made = TRANSFORMS[transform]()
    ours = swa_utils.SWALR if name == "SWALR" else getattr(lr_scheduler, name)
    if name == "NoamScheduler":  # lucid's own: the base class's TypeError, as the others'
        expected = TypeError
    else:
        theirs = (
            torch.optim.swa_utils.SWALR
            if name == "SWALR"
            else getattr(torch.optim.lr_scheduler, name)
        )
        expected = _error_type(lambda: theirs(made, **kwargs))
    assert expected in (TypeError, AttributeError)
    with pytest.raises(expected, match=r"lucid\.functional\.schedules") as info:
        ours(made, **kwargs)
    if name == "ReduceLROnPlateau":
        assert "state machine" in str(info.value)
    else:
        assert re.search(
            r"lucid\.functional\.adam\(lr=lucid\.functional\.schedules\.", str(info.value)
        )


def test_a_scheduler_given_something_else_keeps_torchs_words():
    with pytest.raises(TypeError) as info:
        lr_scheduler.StepLR(object(), 2)
    assert str(info.value) == "object is not an Optimizer"


# ------------------------------------------------- parameters on several devices


@HOST_DEVICES
def test_parameters_on_several_devices_step_clip_and_refuse_a_misplaced_gradient():
    """Sharded, replicated, 2-D-mesh and single-device parameters in one optimizer:
    eager, compiled and fused steps with clipping give the one-device numbers and keep
    every placement; the clipping functions work across devices (torch's per-device
    norms); a gradient on other devices than its parameter is torch's RuntimeError at
    the assignment, naming both placements and `jax.device_put`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = " ".join(["--xla_force_host_platform_device_count=8", *rendezvous_flags()])
    run_host_program([str(HERE / "_placement_script.py")], env, 400)
