"""lucid's Schedule-Free optimizers against the live `schedulefree` package (1.4.1).

Both sides run the oracle's problem from the same start with their own gradients
(jax.grad and torch.autograd); parameters, per-parameter state and the groups' host
scalars (`k`, `lr_max`, `weight_sum`, `scheduled_lr`, `train_mode`) are compared after
every operation: float64 to 1e-10, float32 to rounding.
"""

from __future__ import annotations

import inspect
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import schedulefree
import torch
from _distributed import HOST_DEVICES, run_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import (
    F32_RTOL_FLOOR,
    F64_RTOL,
    count_compiles,
    loss_jax,
    loss_torch,
    problem,
    relative_error,
)

import lucid
import lucid.functional.schedulefree as LFS
from lucid.optim import schedulefree as LOS
from lucid.optim._registry import registered

# the package's other forms: the paper's AdamW, and the Reference forms keeping x and y
MORE = ["AdamWScheduleFreePaper", "SGDScheduleFreeReference", "AdamWScheduleFreeReference"]
TRAIN_EVAL = ["SGDScheduleFree", "AdamWScheduleFree", "RAdamScheduleFree", *MORE]
CLOSURE = ["SGDScheduleFreeClosure", "AdamWScheduleFreeClosure", "RAdamScheduleFreeClosure"]
ALL = TRAIN_EVAL + CLOSURE
FACTORY = {  # each train/eval class's pure transform (the closure forms have none)
    entry.name: entry.transform for entry in registered("schedulefree") if entry.transform
}
GROUP_SCALARS = ("k", "lr_max", "weight_sum", "scheduled_lr", "train_mode")
RTOL = {"float64": F64_RTOL, "float32": F32_RTOL_FLOOR}
TORCH_DTYPE = {"float64": torch.float64, "float32": torch.float32}

# every option of each family, with values that make each one matter in a few steps
OPTIONS = {
    "SGD": [
        {"lr": 0.05},
        {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1, "warmup_steps": 3},
        {"lr": 0.05, "r": 1.5, "weight_lr_power": 0.0, "foreach": False},
    ],
    "AdamW": [
        {"lr": 0.02},
        {"lr": 0.02, "betas": (0.6, 0.99), "eps": 1e-3, "weight_decay": 0.1, "warmup_steps": 4},
        {"lr": 0.02, "r": 0.5, "weight_lr_power": 1.0, "foreach": False},
    ],
    "RAdam": [
        {"lr": 0.02},
        {"lr": 0.02, "betas": (0.9, 0.9), "silent_sgd_phase": False, "weight_decay": 0.1},
        {"lr": 0.02, "betas": (0.5, 0.8), "eps": 1e-3, "r": 1.0, "weight_lr_power": 3.0},
    ],
}
CASES = [
    (name, options)
    for name in ALL
    for i, options in enumerate(OPTIONS[name.split("ScheduleFree")[0]])
    if not (name.startswith("SGD") and name.endswith("Closure") and "foreach" in options)
    # the other forms share the scalars (`r`, `weight_lr_power`) with their family, so
    # the option set that makes their own arithmetic matter is enough (small runtime)
    if name not in MORE or i == 1
] + [
    ("SGDScheduleFreeClosure", {"lr": 0.05, "r": 1.5, "weight_lr_power": 0.0}),
    ("AdamWScheduleFreeReference", {"lr": 0.02, "weight_decay": 0.2, "decay_at_z": True}),
    ("AdamWScheduleFreePaper", {"lr": 0.02, "r": 0.5, "weight_lr_power": 1.0, "foreach": False}),
]


def _id(case):
    name, options = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in options.items())


class Pair:
    """The package's optimizer and lucid's, on the same problem, driven in lockstep."""

    def __init__(self, name, options, dtype, *, groups=False, compiled=False, fused=False):
        self.name, self.options, self.dtype = name, dict(options), dtype
        self.closure_form = name.endswith("Closure")
        init = problem()
        tdtype = TORCH_DTYPE[dtype]
        self.t = {k: torch.tensor(v, dtype=tdtype, requires_grad=True) for k, v in init.items()}
        self.p = {k: lucid.Parameter(jnp.asarray(v, dtype)) for k, v in init.items()}
        self.topt = getattr(schedulefree, name)(self._params(self.t, groups), **options)
        self.lopt = getattr(LOS, name)(self._params(self.p, groups), **options)
        if compiled:
            lucid.compile_optimizer(self.lopt)
        # lucid's step as one fused executable (loss, backward, update) instead
        self.fused = lucid.fused_step(loss_jax, self.lopt) if fused else None

    @staticmethod
    def _params(params, groups):
        if not groups:
            return [params["w"], params["b"]]
        return [{"params": [params["w"]]}, {"params": [params["b"]], "lr": 0.03}]

    # -- operations
    def _torch_grads(self, skip_b):
        self.topt.zero_grad()
        b = self.t["b"].detach() if skip_b else self.t["b"]
        loss = loss_torch({"w": self.t["w"], "b": b})
        loss.backward()
        return loss

    def _lucid_grads(self, skip_b):
        self.lopt.zero_grad()
        if skip_b:
            b = self.p["b"].data
            return lucid.backward(lambda w: loss_jax({"w": w, "b": b}), self.p["w"])
        return lucid.backward(loss_jax, self.p)

    def step(self, skip_b=False):
        if self.closure_form:
            self.topt.step(lambda: self._torch_grads(skip_b))
            self.lopt.step(lambda: self._lucid_grads(skip_b))
        else:
            self._torch_grads(skip_b)
            self.topt.step()
            if self.fused is not None:
                assert not skip_b, "a fused step takes every parameter's gradient"
                self.fused(self.p)
                return
            self._lucid_grads(skip_b)
            self.lopt.step()

    def train(self):
        self.topt.train()
        self.lopt.train()

    def eval(self):
        self.topt.eval()
        self.lopt.eval()

    # -- comparison
    def check(self, rtol=None):
        rtol = RTOL[self.dtype] if rtol is None else rtol
        for k in self.p:
            got, want = np.asarray(self.p[k].data), self.t[k].detach().numpy()
            assert got.dtype == want.dtype
            assert relative_error(got, want) <= rtol, (k, relative_error(got, want))
        ours, theirs = self.lopt.state_dict(), self.topt.state_dict()
        for group, tgroup in zip(ours["param_groups"], theirs["param_groups"]):
            assert {k: v for k, v in group.items() if k != "params"} == {
                k: v for k, v in tgroup.items() if k != "params"
            }
        # the package's train()/eval() touch self.state[p], leaving {} for unstepped ones
        tstate = {index: state for index, state in theirs["state"].items() if state}
        if not self.closure_form:
            assert set(ours["state"]) == set(tstate)
        for index, state in ours["state"].items():
            assert set(state) == set(tstate[index])
            for field, value in state.items():
                want = tstate[index][field].numpy()
                assert relative_error(np.asarray(value), want) <= rtol, (index, field)
        for index in set(tstate) - set(ours["state"]):  # the closure form's eager state
            param = [self.t["w"], self.t["b"]][index].detach().numpy()
            np.testing.assert_array_equal(tstate[index]["z"].numpy(), param)


def _run(pair, steps):
    for _ in range(steps):
        pair.step()
        pair.check()


# ---------------------------------------------------------------- signatures, validation


@pytest.mark.parametrize("name", ALL)
def test_signatures_are_the_packages(name):
    ours = inspect.signature(getattr(LOS, name).__init__).parameters
    theirs = inspect.signature(getattr(schedulefree, name).__init__).parameters
    assert list(ours) == list(theirs)
    for key in theirs:
        if key not in ("self", "params"):
            assert (ours[key].kind, ours[key].default) == (theirs[key].kind, theirs[key].default)
    if not name.endswith("Closure"):
        fn = inspect.signature(FACTORY[name]).parameters
        assert list(fn) == [k for k in theirs if k not in ("self", "params")]
        for key in fn:
            assert fn[key].default == theirs[key].default


@pytest.mark.parametrize("name", ALL)
def test_defaults_and_groups_are_the_packages(name):
    w = lucid.Parameter(jnp.zeros(2))
    t = torch.zeros(2, requires_grad=True)
    ours, theirs = getattr(LOS, name)([w]), getattr(schedulefree, name)([t])
    assert ours.defaults == theirs.defaults
    group = {k: v for k, v in ours.param_groups[0].items() if k != "params"}
    assert group == {k: v for k, v in theirs.param_groups[0].items() if k != "params"}


def _error(make):
    try:
        make()
    except Exception as error:  # the package raises plain ValueErrors (or nothing)
        return type(error), str(error)
    return None


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    "options",
    [
        {"lr": -1.0},
        {"weight_decay": -0.5},
        {"momentum": 0.0},
        {"momentum": 1.0},
        {"momentum": 1.5},
        {"betas": (0.9, 1.0)},
        {"nesterov": True},
    ],
    ids=str,
)
def test_invalid_values_raise_as_the_package(name, options):
    takes = inspect.signature(getattr(schedulefree, name).__init__).parameters
    if any(k not in takes for k in options):
        with pytest.raises(TypeError, match="unexpected keyword"):
            getattr(LOS, name)([lucid.Parameter(jnp.zeros(2))], **options)
        return
    theirs = _error(lambda: getattr(schedulefree, name)([torch.zeros(2)], **options))
    ours = _error(lambda: getattr(LOS, name)([lucid.Parameter(jnp.zeros(2))], **options))
    if theirs is None and ours is not None:
        # a value the package takes and divides by zero with at the first step (RAdam's
        # beta2 = 1): lucid refuses it at construction, with a clear message
        assert ours[0] is ValueError and "must be below 1" in ours[1]
        t = torch.zeros(2, requires_grad=True)
        opt = getattr(schedulefree, name)([t], **options)
        t.grad = torch.ones(2)
        with pytest.raises(ZeroDivisionError):
            if name.endswith("Closure"):
                opt.step(lambda: None)
            else:
                opt.train()
                opt.step()
        return
    assert ours == theirs


def test_a_hyper_parameter_that_is_not_a_number_is_a_type_error():
    with pytest.raises(TypeError, match="eps"):
        LOS.AdamWScheduleFree([lucid.Parameter(jnp.zeros(2))], eps="small")
    with pytest.raises(TypeError, match="lr"):
        LFS.adamw_schedulefree(lr=None)


# ----------------------------------------------------------------------- modes


@pytest.mark.parametrize("name", TRAIN_EVAL)
def test_step_outside_train_mode_raises_and_changes_nothing(name):
    pair = Pair(name, {"lr": 0.01}, "float64")
    if pair.topt.param_groups[0]["train_mode"]:  # SGDScheduleFreeReference starts training
        pair.eval()
    with pytest.raises(Exception, match="not in train mode") as theirs:
        pair._torch_grads(False)
        pair.topt.step()
    pair._lucid_grads(False)
    with pytest.raises(RuntimeError, match="not in train mode"):
        pair.lopt.step()
    assert isinstance(theirs.value, Exception)
    pair.check()  # nothing moved, no state, k still 0
    pair.train()
    pair.step()
    pair.eval()
    with pytest.raises(RuntimeError, match=r"Please insert \.train\(\) and \.eval\(\)"):
        pair.lopt.step()
    pair.check()


@pytest.mark.parametrize("name", TRAIN_EVAL)
def test_train_and_eval_are_idempotent_and_move_only_stepped_parameters(name):
    pair = Pair(name, {"lr": 0.02}, "float64")
    pair.train()
    pair.train()
    pair.step(skip_b=True)  # b never gets state: the switches leave it where it is
    pair.step()
    for op in ("eval", "eval", "train", "eval", "train", "train"):
        getattr(pair, op)()
        pair.check()


def test_closure_forms_require_a_closure():
    opt = LOS.AdamWScheduleFreeClosure([lucid.Parameter(jnp.zeros(2))])
    with pytest.raises(TypeError, match="requires a closure"):
        opt.step()


def test_a_failing_closure_step_puts_the_parameters_back():
    w = lucid.Parameter(jnp.array([1.0, 2.0]))
    opt = LOS.SGDScheduleFreeClosure([w], lr=0.1)

    def closure():
        opt.zero_grad()
        return lucid.backward(lambda w: (w**2).sum(), w)

    opt.step(closure)
    opt.step(closure)
    before, saved = w.data, opt.state_dict()

    def bad():
        w.grad = jnp.ones(3)  # the wrong shape

    with pytest.raises(ValueError):
        opt.step(bad)
    chex.assert_trees_all_equal(w.data, before)
    chex.assert_trees_all_equal(opt.state_dict(), saved)


# ----------------------------------------------------------------------- parity


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_trajectory_matches_the_package(case, dtype):
    name, options = case
    pair = Pair(name, options, dtype)
    if not pair.closure_form:
        pair.train()
    _run(pair, 6)
    if not pair.closure_form:
        pair.eval()
        pair.check()
        pair.train()
    _run(pair, 4)


@pytest.mark.parametrize("name", ALL)
def test_groups_with_different_lrs_and_a_group_without_gradients(name):
    pair = Pair(name, OPTIONS[name.split("ScheduleFree")[0]][1], "float64", groups=True)
    if not pair.closure_form:
        pair.train()
    pair.step(skip_b=True)  # the second group has no gradient: its k still advances
    pair.check()
    _run(pair, 4)


@pytest.mark.parametrize("name", ALL)
def test_compiled_matches_the_package(name):
    pair = Pair(name, OPTIONS[name.split("ScheduleFree")[0]][1], "float32", compiled=True)
    if not pair.closure_form:
        pair.train()
    _run(pair, 3)
    if not pair.closure_form:
        pair.eval()
        pair.check()
        pair.train()
    pair.step(skip_b=True)
    pair.check()
    _run(pair, 2)


@pytest.mark.parametrize("name", TRAIN_EVAL)
def test_the_compiled_handle_switches_modes_as_the_package(name):
    """`compile_optimizer` returns a handle with the package's `train()` and `eval()`,
    sharing the optimizer's mode: switched through the handle, through the optimizer, or
    both in turn, every step and switch gives schedulefree's numbers."""
    pair = Pair(name, OPTIONS[name.split("ScheduleFree")[0]][1], "float32")
    compiled = lucid.compile_optimizer(pair.lopt)
    assert isinstance(compiled, lucid.optim.CompiledScheduleFree)
    switches = [compiled, pair.lopt, compiled]
    for round_, switch in enumerate(switches):
        pair.topt.train()
        switch.train()
        assert pair.lopt.param_groups[0]["train_mode"] is True
        pair.check()
        for _ in range(2):
            pair._torch_grads(False)
            pair.topt.step()
            pair._lucid_grads(False)
            compiled.step()
            pair.check()
        pair.topt.eval()
        (compiled if round_ != 1 else pair.lopt).eval()
        assert compiled.param_groups[0]["train_mode"] is False
        pair.check()
    with pytest.raises(RuntimeError, match="train mode"):  # eval mode: the package's error
        compiled.step()


def test_handles_without_modes_have_no_train_or_eval():
    """As the package's closure forms (and every other optimizer) have none: code that
    asks `hasattr(opt, "train")` before switching (Hugging Face's Trainer) sees none."""
    w = lucid.Parameter(jnp.ones(2))
    closure_form = lucid.compile_optimizer(LOS.SGDScheduleFreeClosure([w], lr=0.1))
    adam = lucid.compile_optimizer(lucid.optim.Adam([lucid.Parameter(jnp.ones(2))]))
    assert not hasattr(schedulefree.SGDScheduleFreeClosure, "train")
    for handle in (closure_form, adam):
        assert type(handle) is lucid.optim.CompiledOptimizer
        assert not hasattr(handle, "train") and not hasattr(handle, "eval")


def test_switching_modes_on_a_compiled_optimizer_does_not_recompile():
    pair = Pair("AdamWScheduleFree", {"lr": 0.01, "weight_decay": 0.1}, "float32", compiled=True)
    pair.train()
    _run(pair, 2)
    pair.eval()
    pair.train()
    pair.step()
    with count_compiles() as compiled:
        for _ in range(3):
            pair.eval()
            pair.train()
            pair.step()
    assert compiled == []
    pair.check()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", TRAIN_EVAL)
def test_fused_step_matches_the_package(name, dtype):
    # two groups with different lrs; fused steps, mode switches between them, and
    # every group's k, lr_max, weight_sum advanced by each fused step as by step()
    options = OPTIONS[name.split("ScheduleFree")[0]][1]
    pair = Pair(name, options, dtype, groups=True, fused=True)
    pair.train()
    _run(pair, 3)
    pair.eval()
    pair.check()
    pair.train()
    _run(pair, 2)
    assert pair.lopt.param_groups[1]["k"] == 5


def test_fused_and_eager_steps_mix_and_match_the_package():
    pair = Pair("AdamWScheduleFree", OPTIONS["AdamW"][1], "float64", fused=True)
    pair.train()
    fused, pair.fused = pair.fused, None
    for use_fused in (True, False, True, True, False):
        pair.fused = fused if use_fused else None
        pair.step()
        pair.check()


@pytest.mark.parametrize("name", TRAIN_EVAL)
def test_fused_step_outside_train_mode_raises_and_changes_nothing(name):
    w = lucid.Parameter(jnp.array([1.0, 2.0]))
    opt = getattr(LOS, name)([w], lr=0.1)
    opt.eval()  # SGDScheduleFreeReference starts in train mode; the others are in eval
    fused = lucid.fused_step(lambda w: (w**2).sum(), opt)
    with pytest.raises(RuntimeError, match="not in train mode"):
        fused(w)
    assert w.data.tolist() == [1.0, 2.0] and opt.param_groups[0]["k"] == 0 and not opt.state


@pytest.mark.parametrize("name", CLOSURE)
def test_closure_forms_refuse_a_fused_step_before_anything_moves(name):
    # the closure form's gradient is taken at y while its parameters hold x: a fused
    # step, which takes it where the parameters are, would be another algorithm
    w = lucid.Parameter(jnp.array([1.0, 2.0]))
    opt = getattr(LOS, name)([w], lr=0.1)
    fused = lucid.fused_step(lambda w: (w**2).sum(), opt)
    with pytest.raises(RuntimeError, match="fused_step is not supported"):
        fused(w)
    assert w.data.tolist() == [1.0, 2.0] and opt.param_groups[0]["k"] == 0 and not opt.state
    opt.step(lambda: lucid.backward(lambda w: (w**2).sum(), w))  # step(closure) still runs
    assert opt.param_groups[0]["k"] == 1


# ----------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_checkpoints_move_both_ways(name, mode):
    pair = Pair(name, OPTIONS[name.split("ScheduleFree")[0]][1], "float64")
    if not pair.closure_form:
        pair.train()
    _run(pair, 3)
    if mode == "eval" and not pair.closure_form:
        pair.eval()
    # the package's checkpoint into a fresh lucid optimizer
    fresh = getattr(LOS, name)([pair.p["w"], pair.p["b"]], **pair.options)
    fresh.load_state_dict(pair.topt.state_dict())
    pair.lopt = fresh
    pair.check()
    if not pair.closure_form:
        pair.train()
    _run(pair, 2)
    # lucid's checkpoint into a fresh package optimizer
    if mode == "eval" and not pair.closure_form:
        pair.eval()
    theirs = getattr(schedulefree, name)([pair.t["w"], pair.t["b"]], **pair.options)
    theirs.load_state_dict(lucid.optim.to_torch(pair.lopt.state_dict()))
    pair.topt = theirs
    pair.check()
    if not pair.closure_form:
        pair.train()
    _run(pair, 2)


# ------------------------------------------------------------ random operation sequences

OPERATIONS = [
    "step",
    "step",
    "step_skip_b",
    "fused_step",
    "train",
    "eval",
    "save_load",
    "torch_load",
    "compile",
]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    name=st.sampled_from(ALL),
    options=st.sampled_from([0, 1, 2]),
    ops=st.lists(st.sampled_from(OPERATIONS), min_size=3, max_size=10),
)
def test_random_sequences_match_the_package(name, options, ops):
    family = OPTIONS[name.split("ScheduleFree")[0]][options]
    if name == "SGDScheduleFreeClosure":
        family = {k: v for k, v in family.items() if k != "foreach"}
    pair = Pair(name, family, "float64")
    if not pair.closure_form:
        pair.train()
    for op in ops:
        if op.startswith("step"):
            if not pair.closure_form and not pair.topt.param_groups[0]["train_mode"]:
                with pytest.raises(RuntimeError):
                    pair.lopt.step()
                continue
            if op == "fused_step" and pair.closure_form:
                continue  # refused (test_closure_forms_refuse_a_fused_step...)
            if op == "fused_step":
                pair.fused = lucid.fused_step(loss_jax, pair.lopt)
            pair.step(skip_b=op == "step_skip_b")
            pair.fused = None
        elif op in ("train", "eval"):
            if pair.closure_form:
                continue
            getattr(pair, op)()
        elif op == "save_load":  # lucid -> lucid, and the package's through torch's format
            saved = pair.lopt.state_dict()
            pair.lopt = getattr(LOS, name)([pair.p["w"], pair.p["b"]], **pair.options)
            pair.lopt.load_state_dict(saved)
            theirs = getattr(schedulefree, name)([pair.t["w"], pair.t["b"]], **pair.options)
            theirs.load_state_dict(lucid.optim.to_torch(saved))
            pair.topt = theirs
        elif op == "torch_load":
            pair.lopt.load_state_dict(pair.topt.state_dict())
        elif op == "compile":
            lucid.compile_optimizer(pair.lopt)
        pair.check()


# ------------------------------------------------------------------ the pure transforms


FUNCTIONAL = list(FACTORY.items())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    "name, factory, options",
    [
        (name, factory, options)
        for name, factory in FUNCTIONAL
        for i, options in enumerate(OPTIONS[name.split("ScheduleFree")[0]])
        if name not in MORE or i == 1  # the other forms: the set where every option matters
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_transform_matches_the_package_with_eval_params(name, factory, options, dtype):
    momentum = options.get("momentum", options.get("betas", (0.9,))[0])
    pair = Pair(name, options, dtype)
    pair.train()
    tx = factory(**options)
    params = {k: jnp.asarray(v, dtype) for k, v in problem().items()}
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        updates, state = tx.update(jax.grad(loss_jax)(params), state, params)
        return optax.apply_updates(params, updates), state

    # RAdam's float32 rectification is computed in float32 in the graph (the package's
    # in Python doubles): rho_t's cancellation costs ~1e-4 of the first steps' size
    radam32 = name.startswith("RAdam") and dtype == "float32"
    rtol = RTOL[dtype] * (10 if radam32 else 1)
    scalar_rtol = 1e-3 if radam32 else rtol
    for _ in range(8):
        params, state = step(params, state)
        pair._torch_grads(False)
        pair.topt.step()
        for k in params:
            assert relative_error(params[k], pair.t[k].detach().numpy()) <= rtol
    group = pair.topt.param_groups[0]
    assert int(state.k) == group["k"]
    np.testing.assert_allclose(float(state.weight_sum), group["weight_sum"], rtol=scalar_rtol)
    np.testing.assert_allclose(float(state.lr_max), group["lr_max"], rtol=scalar_rtol)
    x = LFS.eval_params(params, state, momentum)
    pair.topt.eval()
    for k in params:
        assert x[k].dtype == params[k].dtype
        assert relative_error(x[k], pair.t[k].detach().numpy()) <= rtol
        tz = pair.topt.state[pair.t[k]]["z"].numpy()
        assert relative_error(state.z[k], tz) <= rtol
        if "Reference" in name:  # the state's x and y are the package's
            for field in ("x", "y"):
                want = pair.topt.state[pair.t[k]][field].numpy()
                assert relative_error(getattr(state, field)[k], want) <= rtol
    back = LFS.train_params(x, state, momentum)
    for k in params:
        assert relative_error(back[k], params[k]) <= 10 * RTOL[dtype]


def test_an_lr_schedule_is_evaluated_at_the_steps_done_and_composes_with_optax():
    # a schedule equal to the package's warm-up, lr * (k+1)/5 at step k, gives the same
    # trajectory as warmup_steps=5; inside optax.chain, after optax's clipping
    def warmup(count):  # float64 arithmetic, as the package's Python numbers
        return 0.02 * jnp.minimum(1.0, (jnp.asarray(count, jnp.float64) + 1) / 5)

    clip = optax.clip_by_global_norm(0.5)
    scheduled = optax.chain(clip, LFS.adamw_schedulefree(lr=warmup, weight_decay=0.1))
    fixed = optax.chain(clip, LFS.adamw_schedulefree(lr=0.02, warmup_steps=5, weight_decay=0.1))

    def run(tx):
        params = {k: jnp.asarray(v) for k, v in problem().items()}
        state = tx.init(params)

        @jax.jit
        def step(params, state):
            updates, state = tx.update(jax.grad(loss_jax)(params), state, params)
            return optax.apply_updates(params, updates), state

        for _ in range(8):
            params, state = step(params, state)
        return params, state[1]

    (p1, s1), (p2, s2) = run(scheduled), run(fixed)
    chex.assert_trees_all_close(p1, p2, rtol=1e-12)
    assert int(s1.k) == int(s2.k) == 8
    np.testing.assert_allclose(float(s1.weight_sum), float(s2.weight_sum), rtol=1e-12)


def test_transform_refuses_complex_parameters_and_mismatched_trees():
    tx = LFS.sgd_schedulefree()
    with pytest.raises(RuntimeError, match="complex"):
        tx.init({"w": jnp.zeros(2, jnp.complex64)})
    state = tx.init({"w": jnp.zeros(2)})
    with pytest.raises(ValueError, match="structures"):
        tx.update({"v": jnp.zeros(2)}, state, {"w": jnp.zeros(2)})


# ------------------------------------------------------------------ interplay


def test_an_lr_scheduler_drives_the_step_size_as_torchs_does():
    pair = Pair("AdamWScheduleFree", {"lr": 0.02}, "float64")
    tsched = torch.optim.lr_scheduler.LinearLR(pair.topt, start_factor=0.25, total_iters=4)
    lsched = lucid.optim.lr_scheduler.LinearLR(pair.lopt, start_factor=0.25, total_iters=4)
    pair.train()
    for _ in range(6):
        pair.step()
        tsched.step()
        lsched.step()
        pair.check()
        assert pair.lopt.param_groups[0]["lr"] == pytest.approx(pair.topt.param_groups[0]["lr"])


def test_clip_grad_norm_before_the_step():
    pair = Pair("SGDScheduleFree", {"lr": 0.5}, "float64")
    pair.train()
    for _ in range(4):
        pair._torch_grads(False)
        torch.nn.utils.clip_grad_norm_(list(pair.t.values()), 0.1)
        pair.topt.step()
        pair._lucid_grads(False)
        lucid.nn.utils.clip_grad_norm_(list(pair.p.values()), 0.1)
        pair.lopt.step()
        pair.check()


def test_averaged_model_of_the_eval_weights():
    pair = Pair("AdamWScheduleFree", {"lr": 0.02}, "float64")
    module = torch.nn.Module()
    module.w, module.b = torch.nn.Parameter(pair.t["w"]), torch.nn.Parameter(pair.t["b"])
    pair.t = {"w": module.w, "b": module.b}
    pair.topt = schedulefree.AdamWScheduleFree([module.w, module.b], lr=0.02)
    tavg = torch.optim.swa_utils.AveragedModel(module)
    lavg = lucid.optim.swa_utils.AveragedModel(pair.p)
    for _ in range(3):
        pair.train()
        pair.step()
        pair.eval()  # average x, the weights the package evaluates
        tavg.update_parameters(module)
        lavg.update_parameters(pair.p)
        pair.check()
    for k in ("w", "b"):
        want = getattr(tavg.module, k).detach().numpy()
        assert relative_error(np.asarray(lavg.module[k].data), want) <= F64_RTOL


def test_every_class_is_registered_and_exported():
    from lucid.optim._registry import registered

    names = {entry.name for entry in registered("schedulefree")}
    assert names == set(ALL)
    assert set(LOS.__all__) == {*ALL, "ScheduleFreeWrapper", "ScheduleFreeWrapperReference"}
    # every public class of the package (it has no __all__: its capitalised names)
    assert set(LOS.__all__) == {n for n in dir(schedulefree) if n[0].isupper()}
    assert all(
        isinstance(getattr(LOS, n)([lucid.Parameter(jnp.ones(1))]), lucid.optim.Optimizer)
        for n in ALL
    )


# ------------------------------------------------------------------ ScheduleFreeWrapper


class WrapperPair(Pair):
    """The package's wrapper around torch's SGD and lucid's around lucid's SGD (the
    package's wrapper needs a base that creates state by key, as torch's SGD does)."""

    def __init__(self, base_options, options, dtype, *, compiled=False, cls="ScheduleFreeWrapper"):
        self.name, self.options, self.dtype, self.closure_form = cls, options, dtype, False
        init = problem()
        tdtype = TORCH_DTYPE[dtype]
        self.t = {k: torch.tensor(v, dtype=tdtype, requires_grad=True) for k, v in init.items()}
        self.p = {k: lucid.Parameter(jnp.asarray(v, dtype)) for k, v in init.items()}
        self.base_options = base_options
        tbase = torch.optim.SGD([self.t["w"], self.t["b"]], **base_options)
        lbase = lucid.optim.SGD([self.p["w"], self.p["b"]], **base_options)
        if compiled:
            lucid.compile_optimizer(lbase)
        self.topt = getattr(schedulefree, cls)(tbase, **options)
        self.lopt = getattr(LOS, cls)(lbase, **options)
        self.fused = None


WRAPPER_CASES = [
    ({"lr": 0.1}, {}),
    ({"lr": 0.1, "momentum": 0.5, "weight_decay": 0.01}, {"momentum": 0.8, "r": 1.0}),
    ({"lr": 0.1, "momentum": 0.9, "nesterov": True}, {"weight_decay_at_y": 0.1}),
    ({"lr": 0.1}, {"weight_lr_power": 0.0, "momentum": 0.5}),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", WRAPPER_CASES, ids=str)
def test_wrapper_matches_the_package(case, dtype):
    pair = WrapperPair(*case, dtype)
    with pytest.raises(RuntimeError, match="not in train mode"):
        pair.lopt.step()
    pair.train()
    pair.step(skip_b=True)
    pair.check()
    _run(pair, 4)
    pair.eval()
    pair.check()
    pair.train()
    _run(pair, 2)


@pytest.mark.parametrize("compiled", [False, True])
def test_wrapper_checkpoints_move_both_ways(compiled):
    pair = WrapperPair(*WRAPPER_CASES[1], "float64", compiled=compiled)
    pair.train()
    _run(pair, 3)
    pair.eval()
    lbase = lucid.optim.SGD([pair.p["w"], pair.p["b"]], **pair.base_options)
    fresh = LOS.ScheduleFreeWrapper(lbase, **pair.options)
    fresh.load_state_dict(pair.topt.state_dict())
    fresh.train_mode = False
    pair.lopt = fresh
    pair.check()
    pair.train()
    _run(pair, 2)
    tbase = torch.optim.SGD([pair.t["w"], pair.t["b"]], **pair.base_options)
    theirs = schedulefree.ScheduleFreeWrapper(tbase, **pair.options)
    theirs.load_state_dict(lucid.optim.to_torch(pair.lopt.state_dict()))
    theirs.train_mode = True
    pair.topt = theirs
    pair.check()
    _run(pair, 2)
    with pytest.raises(ValueError):
        fresh.load_state_dict(
            {"state": {7: {"z": np.zeros(3)}}, "param_groups": [{"params": [0, 1]}]}
        )


def test_wrapper_works_with_any_lucid_base():
    # the package's wrapper raises KeyError with torch's Adam or RMSprop as the base (their
    # state is created only when empty, and the wrapper's z is in it); lucid keeps z apart
    w = lucid.Parameter(jnp.array([1.0, -2.0]))
    opt = LOS.ScheduleFreeWrapper(lucid.optim.Adam([w], lr=0.1))
    opt.train()
    for _ in range(3):
        w.grad = 2 * w.data
        opt.step()
    assert set(opt.state[w]) == {"step", "exp_avg", "exp_avg_sq", "z"}
    assert set(opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "z"}
    t = torch.tensor([1.0, -2.0], requires_grad=True)
    theirs = schedulefree.ScheduleFreeWrapper(torch.optim.Adam([t], lr=0.1))
    theirs.train()
    t.grad = 2 * t.detach()
    with pytest.raises(KeyError):
        theirs.step()


# ------------------------------------------------------- ScheduleFreeWrapperReference


def test_wrapper_signatures_are_the_packages():
    for name in ("ScheduleFreeWrapper", "ScheduleFreeWrapperReference"):
        ours = inspect.signature(getattr(LOS, name).__init__).parameters
        theirs = inspect.signature(getattr(schedulefree, name).__init__).parameters
        assert list(ours) == list(theirs)
        assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", WRAPPER_CASES[1:3], ids=str)
def test_wrapper_reference_matches_the_package(case, dtype):
    # every parameter moves at every step, a gradient or not (the package's loop): b
    # without a gradient still goes to z and back to the new y
    pair = WrapperPair(*case, dtype, cls="ScheduleFreeWrapperReference")
    with pytest.raises(RuntimeError, match="not in train mode"):
        pair.lopt.step()
    pair.train()
    pair.step(skip_b=True)
    pair.check()
    _run(pair, 3)
    pair.eval()
    pair.check()
    pair.eval()
    pair.train()
    pair.check()
    _run(pair, 2)
    assert set(pair.lopt.state[pair.p["w"]]) == set(pair.topt.state[pair.t["w"]])


def test_wrapper_reference_checkpoints_move_both_ways_and_compile():
    options = {"weight_decay_at_y": 0.05, "r": 1.0, "momentum": 0.8}
    pair = WrapperPair(WRAPPER_CASES[1][0], options, "float64", cls="ScheduleFreeWrapperReference")
    pair.train()
    _run(pair, 3)
    pair.eval()
    lbase = lucid.optim.SGD([pair.p["w"], pair.p["b"]], **pair.base_options)
    lucid.compile_optimizer(lbase)
    fresh = LOS.ScheduleFreeWrapperReference(lbase, **options)
    fresh.load_state_dict(pair.topt.state_dict())
    pair.lopt = fresh
    pair.check()
    pair.train()
    _run(pair, 2)
    tbase = torch.optim.SGD([pair.t["w"], pair.t["b"]], **pair.base_options)
    theirs = schedulefree.ScheduleFreeWrapperReference(tbase, **options)
    theirs.load_state_dict(lucid.optim.to_torch(pair.lopt.state_dict()))
    theirs.train_mode = True
    pair.topt = theirs
    pair.check()
    _run(pair, 2)
    with pytest.raises(ValueError, match="'x' of parameter 0"):
        fresh.load_state_dict(
            {"state": {0: {"x": np.zeros(3)}}, "param_groups": [{"params": [0, 1]}]}
        )


def test_wrapper_reference_group_added_later_needs_weight_decay_at_y():
    # the package's wrapper writes weight_decay_at_y into the groups present at its
    # construction; a step with a group added later raises its KeyError. lucid raises
    # it before anything moves
    pair = WrapperPair({"lr": 0.1}, {}, "float64", cls="ScheduleFreeWrapperReference")
    pair.train()
    _run(pair, 1)
    extra_t = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    extra_p = lucid.Parameter(jnp.array([1.0, 2.0], jnp.float64))
    pair.topt.add_param_group({"params": [extra_t]})
    pair.lopt.add_param_group({"params": [extra_p]})
    pair._torch_grads(False)
    with pytest.raises(KeyError, match="weight_decay_at_y"):
        pair.topt.step()
    pair._lucid_grads(False)
    before = {k: p.data for k, p in pair.p.items()}, pair.lopt.state_dict()
    with pytest.raises(KeyError, match="weight_decay_at_y"):
        pair.lopt.step()
    chex.assert_trees_all_equal(
        ({k: p.data for k, p in pair.p.items()}, pair.lopt.state_dict()), before
    )
    for opt in (pair.topt, pair.lopt):
        opt.param_groups[1]["weight_decay_at_y"] = 0.0
    extra_t.grad = torch.ones(2, dtype=torch.float64)
    extra_p.grad = jnp.ones(2, jnp.float64)
    pair.topt.step()
    pair.lopt.step()
    pair.check()
    assert relative_error(np.asarray(extra_p.data), extra_t.detach().numpy()) <= F64_RTOL


def test_sgd_reference_starts_in_train_mode_as_the_package():
    # unlike every other class, the package's SGDScheduleFreeReference is made in train
    # mode: it steps without train(), and a group added later is training too
    pair = Pair("SGDScheduleFreeReference", OPTIONS["SGD"][1], "float64")
    assert pair.lopt.param_groups[0]["train_mode"] is True
    _run(pair, 2)
    init = problem(seed=1)
    extra_t = torch.tensor(init["w"], requires_grad=True)
    extra_p = lucid.Parameter(jnp.asarray(init["w"]))
    pair.topt.add_param_group({"params": [extra_t], "lr": 0.01})
    pair.lopt.add_param_group({"params": [extra_p], "lr": 0.01})
    assert pair.lopt.param_groups[1]["train_mode"] is True
    for _ in range(2):
        extra_t.grad = torch.cos(extra_t.detach())
        extra_p.grad = jnp.cos(extra_p.data)
        pair.step()
        pair.check()
    pair.eval()
    pair.check()
    assert relative_error(np.asarray(extra_p.data), extra_t.detach().numpy()) <= F64_RTOL


def test_reference_forms_keep_y_in_the_state_and_take_the_gradient_at_the_parameter():
    # the package's Reference step takes the gradient at p and the decay at its state's
    # y: after the parameter is changed by hand in train mode, both still agree
    for name in ("SGDScheduleFreeReference", "AdamWScheduleFreeReference"):
        pair = Pair(name, {"lr": 0.02, "weight_decay": 0.3}, "float64")
        pair.train()
        _run(pair, 2)
        with torch.no_grad():
            pair.t["w"].mul_(0.5)
        pair.p["w"].data = pair.p["w"].data * 0.5
        _run(pair, 2)
        pair.eval()
        pair.check()


# ------------------------------------------------------------------ sharded

SHARDED = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np, torch, schedulefree
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    import lucid

    mesh = Mesh(np.array(jax.devices()), ("data",))
    rng = np.random.default_rng(0)
    init = {"w": rng.normal(size=(6, 4)), "b": rng.normal(size=(4,))}
    specs = {"w": P("data"), "b": P()}
    for shard_state_over in (None, "data"):
        params = {
            k: lucid.Parameter(jax.device_put(jnp.asarray(v), NamedSharding(mesh, specs[k])))
            for k, v in init.items()
        }
        tparams = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
        opt = lucid.optim.schedulefree.AdamWScheduleFree(list(params.values()), lr=0.05,
                                                         weight_decay=0.1)
        lucid.compile_optimizer(opt, shard_state_over=shard_state_over)
        topt = schedulefree.AdamWScheduleFree(list(tparams.values()), lr=0.05, weight_decay=0.1)
        opt.train(); topt.train()
        for i in range(4):
            for k in init:
                g = np.cos(init[k] * (i + 1))
                params[k].grad = jax.device_put(jnp.asarray(g), NamedSharding(mesh, specs[k]))
                tparams[k].grad = torch.tensor(g)
            opt.step(); topt.step()
            if i == 1:
                opt.eval(); topt.eval(); opt.train(); topt.train()
        opt.eval(); topt.eval()
        for k in init:
            got, want = np.asarray(params[k].data), tparams[k].detach().numpy()
            assert np.max(np.abs(got - want)) <= 1e-10 * np.max(np.abs(want)), k
            assert params[k].data.sharding.is_equivalent_to(NamedSharding(mesh, specs[k]), got.ndim)
    print("OK")
    """
)


@HOST_DEVICES
def test_sharded_parameters_and_zero1_state_match_the_package(tmp_path):
    run_script(tmp_path / "sharded.py", SHARDED)


@pytest.mark.parametrize("name", [n for n in TRAIN_EVAL if n != "SGDScheduleFreeReference"])
def test_a_group_added_later_starts_in_eval_mode_with_its_own_counters(name):
    pair = Pair(name, OPTIONS[name.split("ScheduleFree")[0]][1], "float64")
    init = problem(seed=1)
    extra_t = torch.tensor(init["w"], requires_grad=True)
    extra_p = lucid.Parameter(jnp.asarray(init["w"]))
    pair.train()
    pair.step()
    pair.topt.add_param_group({"params": [extra_t], "lr": 0.01})
    pair.lopt.add_param_group({"params": [extra_p], "lr": 0.01})
    pair.check()  # the new group: train_mode False, k 0, while the first is training
    assert pair.lopt.param_groups[1]["train_mode"] is False
    for _ in range(3):
        extra_t.grad = torch.cos(extra_t.detach())
        extra_p.grad = jnp.cos(extra_p.data)
        pair.step()
        pair.check()
        assert relative_error(np.asarray(extra_p.data), extra_t.detach().numpy()) <= F64_RTOL
    pair.eval()  # only the group in train mode moves
    pair.train()  # now both groups are
    pair.check()
    assert relative_error(np.asarray(extra_p.data), extra_t.detach().numpy()) <= F64_RTOL
