"""lucid.optim.lr_scheduler against torch.optim.lr_scheduler, step by step.

Both sides run the same construction code on their own optimizer (torch: a
real SGD/Adam; lucid: a stand-in with copies of torch's groups) and must
agree to 1e-12 relative in every group's lr and momentum after construction
and after every step, in their state_dicts, and in the errors they raise.
"""

from __future__ import annotations

import copy
import math
import re
import warnings

import numpy as np
import pytest
import torch
from schedule_cases import (
    CASES,
    Case,
    StandIn,
    case_id,
    quiet,
    run,
    snapshot,
    stand_in_like,
    torch_optimizer,
    torch_rows,
)

from lucid.optim import lr_scheduler as LL

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)

TL = torch.optim.lr_scheduler
RTOL = 1e-12


def assert_rows_close(actual: list, expected: list, rtol: float = RTOL) -> None:
    """Every (lr, momentum) of every group at every step, to ``rtol`` relative."""
    assert len(actual) == len(expected)
    for step, (ours, theirs) in enumerate(zip(actual, expected, strict=True)):
        for group, ((lr, mom), (lr_t, mom_t)) in enumerate(zip(ours, theirs, strict=True)):
            assert type(lr) is type(lr_t) or {type(lr), type(lr_t)} <= {int, float}
            np.testing.assert_allclose(lr, lr_t, rtol=rtol, atol=0, err_msg=f"lr, step {step}")
            if mom_t is None:
                assert mom is None
            else:
                np.testing.assert_allclose(
                    mom, mom_t, rtol=rtol, atol=0, err_msg=f"momentum {group}, step {step}"
                )


def lucid_rows(case: Case, **kwargs) -> tuple[list, object, StandIn]:
    optimizer = stand_in_like(torch_optimizer(case.optimizer, case.lrs))
    rows, scheduler = run(case.build, LL, optimizer, case.steps, **kwargs)
    return rows, scheduler, optimizer


def assert_state_dicts_equal(ours: dict, theirs: dict) -> None:
    """Same keys, same values (floats to 1e-12), recursively."""
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for key, value in theirs.items():
        _assert_value_equal(ours[key], value, key)


def _assert_value_equal(ours, theirs, where) -> None:
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        assert set(ours) == set(theirs), (where, set(ours) ^ set(theirs))
        for k in theirs:
            _assert_value_equal(ours[k], theirs[k], f"{where}.{k}")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _assert_value_equal(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float) and math.isfinite(theirs):
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=0, err_msg=where)
    else:
        assert ours == theirs, (where, ours, theirs)


# -- sequences --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sequence_matches_torch(case):
    expected, torch_scheduler = torch_rows(case)
    actual, scheduler, _ = lucid_rows(case)
    assert_rows_close(actual, expected)
    assert scheduler.get_last_lr() == pytest.approx(torch_scheduler.get_last_lr(), rel=RTOL)
    assert_state_dicts_equal(scheduler.state_dict(), torch_scheduler.state_dict())


@pytest.mark.parametrize("case", CASES[::2], ids=case_id)
def test_lr_edited_between_steps_carries_through(case):
    def edit(t, optimizer):
        if t in (4, 11):
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * 0.5

    expected, _ = torch_rows(case, edit=edit)
    actual, _, _ = lucid_rows(case, edit=edit)
    assert_rows_close(actual, expected)


def test_several_schedulers_on_one_optimizer_multiply():
    def build(lib, opt):
        first = lib.StepLR(opt, 4, 0.5)
        second = lib.CosineAnnealingLR(opt, 9, 0.001)
        third = lib.LinearLR(opt, 0.25, total_iters=6)

        class Both:
            def step(self):
                first.step()
                second.step()
                third.step()

        Both.schedulers = (first, second, third)
        return Both()

    expected, both_t = run(build, TL, torch_optimizer(lrs=(0.1, 0.05)), 30)
    optimizer = stand_in_like(torch_optimizer(lrs=(0.1, 0.05)))
    actual, both = run(build, LL, optimizer, 30)
    assert_rows_close(actual, expected)
    for ours, theirs in zip(both.schedulers, both_t.schedulers, strict=True):
        assert ours.base_lrs == theirs.base_lrs  # initial_lr written once, by the first
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.1, 0.05]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_state_dict_round_trip_mid_schedule(case):
    """Stop after ``k`` steps, rebuild from scratch, load both states, continue."""
    k = case.steps // 3
    expected, _ = torch_rows(case)
    rows, scheduler, optimizer = lucid_rows(dataclass_replace(case, steps=k))
    saved_groups = copy.deepcopy(optimizer.param_groups)
    saved = copy.deepcopy(scheduler.state_dict())

    fresh = stand_in_like(torch_optimizer(case.optimizer, case.lrs))
    with quiet():
        resumed = case.build(LL, fresh)
        fresh.param_groups[:] = saved_groups  # the optimizer's own load_state_dict
        resumed.load_state_dict(saved)
        for _ in range(case.steps - k):
            resumed.step()
            rows.append(snapshot(fresh))
    assert_rows_close(rows, expected)


def dataclass_replace(case: Case, **changes) -> Case:
    import dataclasses

    return dataclasses.replace(case, **changes)


@pytest.mark.parametrize("case", CASES[::3], ids=case_id)
def test_torch_state_dict_loads_into_lucid(case):
    """A torch scheduler checkpoint resumes in lucid (keys and meaning are torch's)."""
    k = case.steps // 2
    expected, _ = torch_rows(case)
    torch_opt = torch_optimizer(case.optimizer, case.lrs)
    _, torch_scheduler = run(case.build, TL, torch_opt, k)

    lucid_opt = stand_in_like(torch_optimizer(case.optimizer, case.lrs))
    rows = []
    with quiet():
        scheduler = case.build(LL, lucid_opt)
        lucid_opt.param_groups[:] = stand_in_like(torch_opt).param_groups
        scheduler.load_state_dict(copy.deepcopy(torch_scheduler.state_dict()))
        for _ in range(case.steps - k):
            scheduler.step()
            rows.append(snapshot(lucid_opt))
    assert_rows_close(rows, expected[k + 1 :])


# -- NoamScheduler (no torch counterpart: DESIGN.md's formula) -------------------------------


def noam_formula(t: int, d_model: int, warmup: int, factor: float) -> float:
    k = max(1, t)
    return factor * d_model**-0.5 * min(k**-0.5, k * warmup**-1.5)


# these tests step a scheduler over a stand-in optimizer that never steps: torch's warning
# for that order (which lucid's schedulers give as torch's do) is expected here
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")
@pytest.mark.parametrize(("d_model", "warmup", "factor"), [(512, 10, 1.0), (64, 4, 2.5)])
def test_noam_follows_its_formula(d_model, warmup, factor):
    optimizer = StandIn([{"lr": 0.1}, {"lr": 7.0}])
    scheduler = LL.NoamScheduler(optimizer, d_model, warmup, factor=factor)
    for t in range(60):
        expected = noam_formula(t, d_model, warmup, factor)
        assert scheduler.last_epoch == t
        for group in optimizer.param_groups:
            np.testing.assert_allclose(group["lr"], expected, rtol=RTOL)
        assert scheduler.get_last_lr() == [group["lr"] for group in optimizer.param_groups]
        scheduler.step()
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.1, 7.0]


# these tests step a scheduler over a stand-in optimizer that never steps: torch's warning
# for that order (which lucid's schedulers give as torch's do) is expected here
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")
def test_noam_validation_and_state_round_trip():
    with pytest.raises(ValueError, match="Expected positive d_model, but got 0"):
        LL.NoamScheduler(StandIn([{"lr": 1.0}]), 0, 10)
    with pytest.raises(ValueError, match="Expected positive warmup_steps, but got -1"):
        LL.NoamScheduler(StandIn([{"lr": 1.0}]), 16, -1)
    optimizer = StandIn([{"lr": 1.0}])
    scheduler = LL.NoamScheduler(optimizer, 16, 5)
    for _ in range(7):
        scheduler.step()
    again = LL.NoamScheduler(StandIn([{"lr": 1.0}]), 16, 5)
    again.load_state_dict(scheduler.state_dict())
    again.step()
    assert again.get_last_lr() == [noam_formula(8, 16, 5, 1.0)]


# -- ReduceLROnPlateau ------------------------------------------------------------------------

PLATEAU_METRICS = [
    1.0, 0.9, 0.95, 0.95, 0.94, 0.96, 0.97, 0.8, 0.8, 0.8,
    0.81, 0.82, 0.85, 0.7, 0.7, 0.9, 0.9, 0.9, 0.9, 0.9,
    0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9,
]  # fmt: skip
PLATEAU_CASES = [
    {},
    {"patience": 2},
    {"mode": "max", "patience": 1, "factor": 0.5},
    {"threshold_mode": "abs", "threshold": 0.05, "patience": 1},
    {"mode": "max", "threshold_mode": "abs", "threshold": 0.01, "patience": 0},
    {"patience": 1, "cooldown": 3, "factor": 0.5},
    {"patience": 0, "min_lr": [0.02, 0.001], "factor": 0.3},
    {"patience": 0, "min_lr": 0.009, "factor": 0.5},
    {"patience": 0, "factor": 0.999, "eps": 1e-4},
]


@pytest.mark.parametrize("options", PLATEAU_CASES, ids=str)
def test_reduce_lr_on_plateau_matches_torch(options):
    def build(lib, opt):
        return lib.ReduceLROnPlateau(opt, **options)

    steps, lrs = len(PLATEAU_METRICS), (0.1, 0.05)
    torch_opt = torch_optimizer(lrs=lrs)
    expected, torch_scheduler = run(build, TL, torch_opt, steps, metrics=PLATEAU_METRICS)
    optimizer = stand_in_like(torch_optimizer(lrs=lrs))
    actual, scheduler = run(build, LL, optimizer, steps, metrics=PLATEAU_METRICS)
    assert_rows_close(actual, expected)
    assert_state_dicts_equal(scheduler.state_dict(), torch_scheduler.state_dict())
    assert "initial_lr" not in optimizer.param_groups[0]  # no construction step, as torch


def test_reduce_lr_on_plateau_state_round_trip_and_array_metric():
    import jax.numpy as jnp

    def build(lib, opt):
        return lib.ReduceLROnPlateau(opt, patience=1, cooldown=2, factor=0.5)

    expected, _ = run(build, TL, torch_optimizer(), 20, metrics=PLATEAU_METRICS)
    optimizer = stand_in_like(torch_optimizer())
    rows, scheduler = run(build, LL, optimizer, 9, metrics=PLATEAU_METRICS)
    resumed = LL.ReduceLROnPlateau(optimizer, patience=7)
    resumed.load_state_dict(copy.deepcopy(scheduler.state_dict()))
    for metric in PLATEAU_METRICS[9:20]:
        resumed.step(jnp.asarray(metric))  # a 0-d array metric, as a 0-d tensor in torch
        rows.append(snapshot(optimizer))
    assert_rows_close(rows, expected)


# -- construction, step(epoch), resuming with last_epoch ---------------------------------------


def test_construction_writes_initial_lr_with_setdefault():
    optimizer = StandIn([{"lr": 0.1}, {"lr": 0.2, "initial_lr": 0.5}])
    scheduler = LL.ExponentialLR(optimizer, 0.5)
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.1, 0.5]
    assert scheduler.base_lrs == [0.1, 0.5]
    assert scheduler.last_epoch == 0
    assert scheduler.get_last_lr() == [0.1, 0.2]


@pytest.mark.parametrize(
    "build",
    [
        lambda lib, opt: lib.StepLR(opt, 3, 0.5),
        lambda lib, opt: lib.MultiStepLR(opt, [2, 4, 4]),
        lambda lib, opt: lib.ExponentialLR(opt, 0.9),
        lambda lib, opt: lib.CosineAnnealingLR(opt, 5, 0.01),
        lambda lib, opt: lib.ConstantLR(opt),
        lambda lib, opt: lib.LinearLR(opt),
        lambda lib, opt: lib.PolynomialLR(opt, 6, 1.5),
        lambda lib, opt: lib.CosineAnnealingWarmRestarts(opt, 2, 2),
    ],
    ids=["step", "multistep", "exponential", "cosine", "constant", "linear", "poly", "warm"],
)
def test_step_with_epoch_uses_the_closed_form(build):
    epochs = [3, 1, 7, 0, 12, 5, 9, 2]
    torch_opt = torch_optimizer()
    optimizer = stand_in_like(torch_optimizer())
    with quiet():
        theirs, ours = build(TL, torch_opt), build(LL, optimizer)
        for epoch in epochs:
            theirs.step(epoch)
            ours.step(epoch)
            assert_rows_close([snapshot(optimizer)], [snapshot(torch_opt)])
            assert ours.last_epoch == theirs.last_epoch
    if not isinstance(ours, LL.CosineAnnealingWarmRestarts):  # its own step() does not warn
        with pytest.warns(UserWarning, match="epoch parameter"):
            ours.step(4)


@pytest.mark.parametrize(
    "build",
    [
        lambda lib, opt: lib.StepLR(opt, 3, 0.5, last_epoch=5),
        lambda lib, opt: lib.ExponentialLR(opt, 0.9, last_epoch=4),
        lambda lib, opt: lib.CosineAnnealingLR(opt, 7, last_epoch=3),
        lambda lib, opt: lib.LinearLR(opt, total_iters=8, last_epoch=2),
        lambda lib, opt: lib.CyclicLR(opt, 0.01, 0.1, 3, last_epoch=4),
        lambda lib, opt: lib.OneCycleLR(opt, 0.1, 30, last_epoch=6),
        lambda lib, opt: lib.CosineAnnealingWarmRestarts(opt, 3, last_epoch=4),
    ],
    ids=["step", "exponential", "cosine", "linear", "cyclic", "one-cycle", "warm"],
)
def test_resuming_with_last_epoch(build):
    torch_opt = torch_optimizer()
    for group in torch_opt.param_groups:
        group.update(initial_lr=0.3, max_lr=0.1, min_lr=1e-5, max_momentum=0.95)
        group.update(base_momentum=0.85)
    expected, _ = run(build, TL, torch_opt, 15)
    optimizer = stand_in_like(torch_optimizer())
    for group in optimizer.param_groups:
        group.update(initial_lr=0.3, max_lr=0.1, min_lr=1e-5, max_momentum=0.95)
        group.update(base_momentum=0.85)
    actual, _ = run(build, LL, optimizer, 15)
    assert_rows_close(actual, expected)
    with pytest.raises(KeyError, match=re.escape("param 'initial_lr' is not specified")):
        build(LL, StandIn([{"lr": 0.1, "momentum": 0.9}], {"momentum": 0.9}))


def test_one_cycle_refuses_to_step_past_total_steps():
    def build(lib, opt):
        return lib.OneCycleLR(opt, 0.1, total_steps=5)

    _, theirs = run(build, TL, torch_optimizer(), 5)
    _, ours = run(build, LL, stand_in_like(torch_optimizer()), 5)
    with pytest.raises(ValueError) as torch_error:
        theirs.step()
    with pytest.raises(ValueError) as lucid_error:
        ours.step()
    assert str(lucid_error.value) == str(torch_error.value)


def test_get_lr_outside_step_warns_and_get_last_lr_is_torchs_own_list():
    """`get_last_lr()` returns the scheduler's record itself, as torch's does (not a
    copy): appending to it shows in the next call on both sides; an edit of the
    group's lr does not."""
    optimizer = StandIn([{"lr": 0.1}])
    scheduler = LL.StepLR(optimizer, 2)
    tscheduler = torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), 2
    )
    with pytest.warns(UserWarning, match="please use `get_last_lr\\(\\)`"):
        scheduler.get_lr()
    last, tlast = scheduler.get_last_lr(), tscheduler.get_last_lr()
    optimizer.param_groups[0]["lr"] = 5.0
    tscheduler.optimizer.param_groups[0]["lr"] = 5.0
    assert last == tlast == [0.1]
    last.append(9.0)
    tlast.append(9.0)
    assert scheduler.get_last_lr() == tscheduler.get_last_lr() == [0.1, 9.0]
    assert (scheduler.get_last_lr() is last) == (tscheduler.get_last_lr() is tlast) is True


def test_lambda_state_dict_leaves_out_functions_and_keeps_callable_objects():
    class Scale:
        def __init__(self, rate):
            self.rate = rate

        def __call__(self, epoch):
            return self.rate**epoch

    for name in ("LambdaLR", "MultiplicativeLR"):
        optimizer = StandIn([{"lr": 0.1}, {"lr": 0.2}])
        scheduler = getattr(LL, name)(optimizer, [_lambda_decay, Scale(0.9)])
        saved = scheduler.state_dict()
        assert saved["lr_lambdas"] == [None, {"rate": 0.9}]
        torch_opt = torch_optimizer(lrs=(0.1, 0.2))
        torch_saved = getattr(TL, name)(torch_opt, [_lambda_decay, Scale(0.9)])
        assert set(saved) == set(torch_saved.state_dict())
        other = Scale(0.5)
        again = getattr(LL, name)(StandIn([{"lr": 0.1}, {"lr": 0.2}]), [_lambda_decay, other])
        again.load_state_dict(saved)
        assert other.rate == 0.9
        assert "lr_lambdas" in saved  # loading does not consume the caller's dict


def _lambda_decay(epoch):
    return 0.5**epoch


def test_cyclic_state_dict_saves_only_callable_object_scale_fns():
    class Halving:
        def __init__(self):
            self.base = 0.5

        def __call__(self, x):
            return self.base**x

    for scale_fn, saved_as in [(_lambda_decay, None), (Halving(), {"base": 0.5})]:
        scheduler = LL.CyclicLR(
            StandIn([{"lr": 0.1, "momentum": 0.9}], {"momentum": 0.9}), 0.01, 0.1, scale_fn=scale_fn
        )
        assert scheduler.state_dict()["_scale_fn_custom"] == saved_as


# -- validation: torch's exception types and messages, and nothing changes -------------------

INVALID = [
    ("ConstantLR", {"factor": 1.5}),
    ("ConstantLR", {"factor": -0.1}),
    ("LinearLR", {"start_factor": 0.0}),
    ("LinearLR", {"start_factor": 1.2}),
    ("LinearLR", {"end_factor": 1.5}),
    ("CosineAnnealingWarmRestarts", {"T_0": 0}),
    ("CosineAnnealingWarmRestarts", {"T_0": 2.0}),
    ("CosineAnnealingWarmRestarts", {"T_0": 2, "T_mult": 0}),
    ("CosineAnnealingWarmRestarts", {"T_0": 2, "T_mult": 1.5}),
    ("CosineAnnealingWarmRestarts", {"T_0": 2, "eta_min": "0"}),
    ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "mode": "sawtooth"}),
    ("CyclicLR", {"base_lr": [0.01, 0.02, 0.03], "max_lr": 0.1}),
    ("CyclicLR", {"base_lr": 0.01, "max_lr": [0.1]}),
    ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "base_momentum": [0.8, 0.7, 0.6]}),
    ("OneCycleLR", {"max_lr": 0.1}),
    ("OneCycleLR", {"max_lr": 0.1, "total_steps": 0}),
    ("OneCycleLR", {"max_lr": 0.1, "total_steps": 10.0}),
    ("OneCycleLR", {"max_lr": 0.1, "epochs": 0, "steps_per_epoch": 3}),
    ("OneCycleLR", {"max_lr": 0.1, "epochs": 2, "steps_per_epoch": -3}),
    ("OneCycleLR", {"max_lr": 0.1, "total_steps": 10, "pct_start": 1.5}),
    ("OneCycleLR", {"max_lr": 0.1, "total_steps": 10, "pct_start": 1}),
    ("OneCycleLR", {"max_lr": 0.1, "total_steps": 10, "anneal_strategy": "exp"}),
    ("OneCycleLR", {"max_lr": [0.1], "total_steps": 10}),
    ("LambdaLR", {"lr_lambda": [_lambda_decay]}),
    ("MultiplicativeLR", {"lr_lambda": [_lambda_decay]}),
    ("MultiplicativeLR", {"lr_lambda": [_lambda_decay, 0.5]}),
    ("ReduceLROnPlateau", {"factor": 1.0}),
    ("ReduceLROnPlateau", {"mode": "maximum"}),
    ("ReduceLROnPlateau", {"threshold_mode": "relative"}),
    ("ReduceLROnPlateau", {"min_lr": [0.1, 0.2, 0.3]}),
    ("StepLR", {"step_size": 2, "verbose": True}),
    ("ExponentialLR", {"gamma": 0.9, "verbose": False}),
    ("ReduceLROnPlateau", {"verbose": True}),
    ("StepLR", {}),
]


def _describe(error: BaseException) -> tuple[type, str]:
    return type(error), str(error).replace("torch.optim.lr_scheduler", "").strip()


def _stable_id(value: object) -> str:
    """A test id without memory addresses (pytest-xdist workers must agree on ids)."""
    return re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", str(value))


@pytest.mark.parametrize(("name", "options"), INVALID, ids=_stable_id)
def test_invalid_arguments_raise_torchs_errors_and_change_nothing(name, options):
    torch_opt = torch_optimizer(lrs=(0.1, 0.05))
    with pytest.raises(Exception) as torch_error:  # the type is compared below
        getattr(TL, name)(torch_opt, **options)
    optimizer = stand_in_like(torch_optimizer(lrs=(0.1, 0.05)))
    before = copy.deepcopy(optimizer.param_groups)
    with pytest.raises(Exception) as lucid_error:  # the type is compared below
        getattr(LL, name)(optimizer, **options)
    their_type, their_message = _describe(torch_error.value)
    our_type, our_message = _describe(lucid_error.value)
    assert our_type is their_type
    if their_type is TypeError:  # messages name the function; compare the complaint
        assert their_message.split(")")[-1] == our_message.split(")")[-1]
    else:
        assert our_message == their_message
    assert optimizer.param_groups == before


def test_not_an_optimizer_is_a_type_error():
    for name, args in [("StepLR", (2,)), ("CyclicLR", (0.01, 0.1)), ("ReduceLROnPlateau", ())]:
        with pytest.raises(TypeError, match="int is not an Optimizer"):
            getattr(LL, name)(3, *args)


def test_cycling_momentum_needs_momentum_or_betas():
    optimizer = StandIn([{"lr": 0.1}], {"lr": 0.1})
    for build in (
        lambda: LL.CyclicLR(optimizer, 0.01, 0.1),
        lambda: LL.OneCycleLR(optimizer, 0.1, 10),
    ):
        with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
            build()
        assert optimizer.param_groups == [{"lr": 0.1}]
    # without ``defaults`` the groups say which key to cycle
    groups = StandIn([{"lr": 0.1, "betas": (0.9, 0.99)}])
    LL.OneCycleLR(groups, 0.1, 10)
    assert groups.param_groups[0]["betas"] == (0.95, 0.99)


def test_composites_validate_their_children():
    optimizer, other = StandIn([{"lr": 0.1}]), StandIn([{"lr": 0.1}])
    step = LL.StepLR(optimizer, 2)
    plateau = LL.ReduceLROnPlateau(optimizer)
    with pytest.raises(ValueError, match="expects at least one scheduler"):
        LL.SequentialLR(optimizer, [], [])
    with pytest.raises(ValueError, match="expects at least one scheduler to be chained"):
        LL.ChainedScheduler([])
    with pytest.raises(ValueError, match="does not support `ReduceLROnPlateau`"):
        LL.SequentialLR(optimizer, [step, plateau], [3])
    with pytest.raises(ValueError, match="does not support `ReduceLROnPlateau`"):
        LL.ChainedScheduler([step, plateau])
    with pytest.raises(ValueError, match="to belong to the same optimizer"):
        LL.SequentialLR(other, [step], [])
    with pytest.raises(ValueError, match="one more than the number of milestone points"):
        LL.SequentialLR(optimizer, [step, LL.ExponentialLR(optimizer, 0.9)], [1, 2])
    with pytest.raises(TypeError, match="at index 1 should have `optimizer`"):
        LL.ChainedScheduler([step, object()])
    optimizer.has_stepped = True  # what an optimizer's step records (else torch's order warning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LL.ChainedScheduler([step]).step()  # no warnings from a plain step
