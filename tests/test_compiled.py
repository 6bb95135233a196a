"""compile_optimizer: compiled == eager == torch, one compilation under any
scheduler, ownership, structure changes, None grads and checkpoints."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import CASES, case_id
from oracle import (
    F64_RTOL,
    count_compiles,
    loss_jax,
    loss_torch,
    problem,
    relative_error,
    run_shell,
    run_torch,
    to_numpy,
)
from test_shell import _assert_params_close, _assert_unchanged, _lucid_step, _snapshot

import lucid
from lucid.optim._engine import CompiledBackend

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)


def _compare_states(ours: dict, theirs: dict, rtol: float) -> None:
    assert set(ours["state"]) == set(theirs["state"])
    for index, torch_state in theirs["state"].items():
        assert set(ours["state"][index]) == set(torch_state)
        for name, value in torch_state.items():
            err = relative_error(np.asarray(ours["state"][index][name]), to_numpy(value))
            assert err <= rtol, (index, name, err)


@pytest.mark.parametrize("compile_at", [0, 20], ids=["from-start", "adopting-eager-state"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_compiled_matches_torch_in_every_option(case, compile_at):
    name, options = case
    init = problem()
    expected, torch_sd = run_torch(getattr(torch.optim, name), options, init, "float64")
    actual, opt = run_shell(
        getattr(lucid.optim, name), options, init, "float64", compile_at=compile_at
    )
    assert isinstance(opt.backend, CompiledBackend)
    for key in expected:
        chex.assert_trees_all_close(actual[key], expected[key], rtol=F64_RTOL, atol=1e-13)
    ours = opt.state_dict()
    assert ours["param_groups"] == torch_sd["param_groups"]
    _compare_states(ours, torch_sd, 1e-9)


def _ulps_apart(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance between corresponding float32 values, in units in the last
    place (0: the same bits; +0 and -0 count as equal)."""

    def ordered(x):
        bits = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return int(np.max(np.abs(ordered(a) - ordered(b)), initial=0))


@pytest.mark.parametrize("case", CASES[::4], ids=case_id)
def test_compiled_float32_equals_eager_float32_bit_for_bit(case):
    """Same rule, same order of operations: after 10 steps the flat buffers of the
    compiled step hold the eager step's float32 bits exactly. jax 0.4's XLA (the
    oldest lane) contracts multiply-adds into FMAs differently in a long buffer than
    in short arrays (measured there: up to 54 ulps after 10 steps, Adadelta and SGD
    with dampening), so there the bound is rounding: 1e-6 relative."""
    name, options = case
    init = problem()
    eager, _ = run_shell(getattr(lucid.optim, name), options, init, "float32", steps=10)
    compiled, _ = run_shell(
        getattr(lucid.optim, name), options, init, "float32", steps=10, compile_at=0
    )
    for key in eager:
        if jax.__version_info__[:2] == (0, 4):
            assert relative_error(compiled[key], eager[key]) <= 1e-6
        else:
            assert _ulps_apart(compiled[key], eager[key]) == 0, key


def _params(dtype="float64"):
    return {k: lucid.Parameter(jnp.asarray(v, dtype)) for k, v in sorted(problem().items())}


def _torch_params():
    return {k: torch.tensor(v, requires_grad=True) for k, v in sorted(problem().items())}


def test_a_hundred_steps_under_a_scheduler_compile_once():
    params, tparams = _params(), _torch_params()
    opt = lucid.optim.Adam(
        [{"params": [params["w"]]}, {"params": [params["b"]], "lr": 0.02}],
        lr=0.01,
        weight_decay=0.01,
    )
    topt = torch.optim.Adam(
        [{"params": [tparams["w"]]}, {"params": [tparams["b"]], "lr": 0.02}],
        lr=0.01,
        weight_decay=0.01,
    )
    sched = lucid.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.05, 0.1], total_steps=101)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=[0.05, 0.1], total_steps=101)
    lucid.compile_optimizer(opt)

    def both_steps():
        _lucid_step(opt, params)
        sched.step()
        topt.zero_grad()
        loss_torch(tparams).backward()
        topt.step()
        tsched.step()

    both_steps()  # the first step compiles
    with count_compiles() as compiled:
        for _ in range(99):
            both_steps()
    assert len(compiled) == 0, f"{len(compiled)} compilations after the first step"
    _assert_params_close(params, tparams)


def test_ownership_rules():
    params = _params()
    opt = lucid.optim.SGD(list(params.values()), lr=0.1, momentum=0.9)
    _lucid_step(opt, params)
    compiled = lucid.compile_optimizer(opt)
    assert (
        lucid.compile_optimizer(opt) is compiled and lucid.optim.compile_optimizer(opt) is compiled
    )
    assert compiled.param_groups is opt.param_groups
    assert isinstance(opt.backend, CompiledBackend)
    _lucid_step(opt, params)  # opt.step() runs the compiled step
    assert opt.state_dict()["state"].keys() == compiled.state_dict()["state"].keys()
    np.testing.assert_array_equal(
        np.asarray(opt.state[params["w"]]["momentum_buffer"]),
        np.asarray(compiled.state_dict()["state"][1]["momentum_buffer"]),
    )
    opt.zero_grad()
    assert all(p.grad is None for p in params.values())
    with pytest.raises(AttributeError):
        opt.state = {}


def test_only_lucids_own_classes_compile():
    class MyAdam(lucid.optim.Adam):
        pass

    p = lucid.Parameter(jnp.ones(3))
    with pytest.raises(TypeError, match="SGD") as error:
        lucid.compile_optimizer(MyAdam([p]))
    assert "MyAdam" in str(error.value)
    with pytest.raises(TypeError):
        lucid.compile_optimizer(object())
    with pytest.raises(ValueError, match="no parameters"):
        lucid.compile_optimizer(lucid.optim.SGD([{"params": []}]))


def test_none_grads_are_skipped_and_their_state_does_not_move():
    params, tparams = _params(), _torch_params()
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    topt = torch.optim.Adam(list(tparams.values()), lr=0.01)
    compiled = lucid.compile_optimizer(opt)
    for step in range(12):
        opt.zero_grad()
        topt.zero_grad()
        if step % 3 == 2:  # only w gets a gradient
            lucid.backward(lambda p: loss_jax({"w": p, "b": jnp.zeros(3)}), params["w"])
            loss_torch({"w": tparams["w"], "b": torch.zeros(3, dtype=torch.float64)}).backward()
        else:
            lucid.backward(loss_jax, params)
            loss_torch(tparams).backward()
        opt.step()
        topt.step()
    _assert_params_close(params, tparams)
    steps = {int(np.asarray(s["step"])) for s in compiled.state.values()}
    assert steps == {12, 8}


def test_add_param_group_and_a_new_shape_recompile_correctly():
    params, tparams = _params(), _torch_params()
    opt = lucid.optim.SGD([params["w"]], lr=0.1, momentum=0.9)
    topt = torch.optim.SGD([tparams["w"]], lr=0.1, momentum=0.9)
    lucid.compile_optimizer(opt)
    for step in range(10):
        if step == 4:
            opt.add_param_group({"params": [params["b"]], "lr": 0.05})
            topt.add_param_group({"params": [tparams["b"]], "lr": 0.05})
        _lucid_step(opt, params)
        topt.zero_grad()
        loss_torch(tparams).backward()
        topt.step()
    _assert_params_close(params, tparams)
    fresh = lucid.Parameter(jnp.ones(2))
    opt2 = lucid.optim.Adam([fresh], lr=0.1)
    lucid.compile_optimizer(opt2)
    fresh.data = jnp.ones(5)  # no state yet: a new shape is a new layout
    fresh.grad = jnp.ones(5)
    opt2.step()
    chex.assert_trees_all_close(fresh.data, jnp.full(5, 0.9), rtol=1e-6)
    with pytest.raises(ValueError, match="state"):
        fresh.data = jnp.ones(3)  # now it has state for shape (5,)


def test_checkpoints_move_eager_compiled_torch():
    options = {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}
    tparams = _torch_params()
    topt = torch.optim.Adam(list(tparams.values()), **options)
    params = _params()
    opt = lucid.optim.Adam(list(params.values()), **options)
    for _ in range(5):
        _lucid_step(opt, params)
        topt.zero_grad()
        loss_torch(tparams).backward()
        topt.step()
    eager_sd = opt.state_dict()
    # eager -> compiled: a fresh optimizer, compiled, loads the eager checkpoint
    params2 = {k: lucid.Parameter(p.data) for k, p in params.items()}
    opt2 = lucid.optim.Adam(list(params2.values()), **options)
    lucid.compile_optimizer(opt2).load_state_dict(eager_sd)
    # torch -> compiled
    params3 = {
        k: lucid.Parameter(jnp.asarray(v.detach().numpy().copy())) for k, v in tparams.items()
    }
    opt3 = lucid.optim.Adam(list(params3.values()), **options)
    lucid.compile_optimizer(opt3)
    opt3.load_state_dict(topt.state_dict())
    for _ in range(5):
        for o, p in ((opt, params), (opt2, params2), (opt3, params3)):
            _lucid_step(o, p)
        topt.zero_grad()
        loss_torch(tparams).backward()
        topt.step()
    for p in (params, params2, params3):
        _assert_params_close(p, tparams)
    # compiled -> eager and -> torch
    params4 = {k: lucid.Parameter(p.data) for k, p in params2.items()}
    opt4 = lucid.optim.Adam(list(params4.values()), **options)
    opt4.load_state_dict(opt2.state_dict())
    tparams5 = {k: torch.tensor(np.asarray(p.data), requires_grad=True) for k, p in params2.items()}
    topt5 = torch.optim.Adam(list(tparams5.values()), **options)
    sd = opt2.state_dict()
    topt5.load_state_dict(
        {
            "state": {
                i: {n: torch.as_tensor(v) for n, v in s.items()} for i, s in sd["state"].items()
            },
            "param_groups": sd["param_groups"],
        }
    )
    for _ in range(5):
        _lucid_step(opt4, params4)
        _lucid_step(opt2, params2)
        topt5.zero_grad()
        loss_torch(tparams5).backward()
        topt5.step()
    _assert_params_close(params4, tparams5)
    _assert_params_close(params2, tparams5)


def test_compiled_load_errors_change_nothing():
    params = _params()
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    lucid.compile_optimizer(opt)
    _lucid_step(opt, params)
    good = opt.state_dict()
    bad = opt.state_dict()
    bad["state"][1]["exp_avg"] = np.zeros((2, 2))
    before = _snapshot(opt, params)
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)
    _assert_unchanged(before, _snapshot(opt, params))
    opt.load_state_dict(good)
    _assert_unchanged(before, _snapshot(opt, params))


def test_state_dict_of_a_compiled_optimizer_is_a_snapshot_that_survives_steps():
    params = _params()
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    lucid.compile_optimizer(opt)
    _lucid_step(opt, params)
    sd = opt.state_dict()
    entries = dict(opt.state[params["w"]])  # arrays read out of the live state
    step_before = float(np.asarray(sd["state"][0]["step"]))
    for _ in range(3):
        _lucid_step(opt, params)  # donates the buffers the snapshot was cut from
    assert float(np.asarray(sd["state"][0]["step"])) == step_before == 1.0
    assert float(np.asarray(entries["step"])) == 1.0
    np.asarray(entries["exp_avg"])  # still readable after the donations
    assert float(np.asarray(opt.state[params["w"]]["step"])) == 4.0  # the live view
    assert float(np.asarray(opt.state_dict()["state"][0]["step"])) == 4.0


def test_grads_and_values_read_back_through_the_parameter_boxes():
    params = _params()
    opt = lucid.optim.SGD(list(params.values()), lr=0.1)
    lucid.compile_optimizer(opt)
    grads = jax.grad(loss_jax)({k: p.data for k, p in params.items()})
    lucid.backward(loss_jax, params)
    for k in params:
        chex.assert_trees_all_close(params[k].grad, grads[k], rtol=1e-12)
    before = {k: p.data for k, p in params.items()}
    opt.step()
    for k in params:
        chex.assert_trees_all_close(params[k].data, before[k] - 0.1 * grads[k], rtol=1e-12)
    params["b"].grad = jnp.ones(3)  # assigned by hand, as in torch
    params["w"].grad = None
    opt.step()
    chex.assert_trees_all_close(params["b"].data, before["b"] - 0.1 * grads["b"] - 0.1, rtol=1e-12)
    chex.assert_trees_all_close(params["w"].data, before["w"] - 0.1 * grads["w"], rtol=1e-12)
    with pytest.raises(ValueError, match="dtype"):
        params["b"].grad = jnp.ones(3, jnp.float32)


def test_compiled_lbfgs_is_the_functional_bb_step():
    import optax

    params = _params()
    opt = lucid.optim.LBFGS(list(params.values()), lr=0.1)
    compiled = lucid.compile_optimizer(opt)
    assert lucid.compile_optimizer(opt) is compiled
    tx = lucid.functional.lbfgs(lr=0.1)
    ref = {k: p.data for k, p in params.items()}
    ref_state = tx.init(ref)
    for _ in range(5):

        def closure():
            compiled.zero_grad()
            return lucid.backward(loss_jax, params)

        loss = compiled.step(closure)
        updates, ref_state = tx.update(jax.grad(loss_jax)(ref), ref_state, ref)
        assert float(loss) == pytest.approx(float(loss_jax(ref)))
        ref = optax.apply_updates(ref, updates)
    for k in params:
        chex.assert_trees_all_close(params[k].data, ref[k], rtol=1e-10)
    assert set(compiled.state_dict()["state"][0]) == {"step", "prev_param", "prev_grad"}
    assert opt.state_dict()["state"] == {}  # the BB steps never touched the eager L-BFGS


def test_compiling_lbfgs_leaves_the_eager_lbfgs_to_torchs_iterates():
    """The contract's one exception: after compile_optimizer(lbfgs), opt.step(closure),
    opt.state and opt.state_dict stay torch's L-BFGS; the BB step keeps its own state."""
    params, tparams = _params(), _torch_params()
    opt = lucid.optim.LBFGS(list(params.values()), lr=0.5, max_iter=4, history_size=3)
    topt = torch.optim.LBFGS(list(tparams.values()), lr=0.5, max_iter=4, history_size=3)
    compiled = lucid.compile_optimizer(opt)

    def closure():
        opt.zero_grad()
        return lucid.backward(loss_jax, params)

    def torch_closure():
        topt.zero_grad()
        loss = loss_torch(tparams)
        loss.backward()
        return loss

    for _ in range(3):
        loss = opt.step(closure)
        expected = topt.step(torch_closure)
        assert float(loss) == pytest.approx(expected.item(), rel=1e-9)
    _assert_params_close(params, tparams)
    ours, theirs = opt.state_dict()["state"][0], topt.state_dict()["state"][0]
    assert ours["n_iter"] == theirs["n_iter"] and ours["func_evals"] == theirs["func_evals"]
    assert set(opt.state[params["b"]]) == set(theirs)
    assert compiled.state_dict()["state"] == {}  # the compiled BB step has not run yet
    compiled.step(closure)
    assert set(compiled.state_dict()["state"][0]) == {"step", "prev_param", "prev_grad"}
    assert opt.state_dict()["state"][0]["n_iter"] == theirs["n_iter"]  # untouched by copt
    eager = opt.state_dict()
    fresh = lucid.optim.LBFGS(list(params.values()), lr=0.5, max_iter=4, history_size=3)
    fresh.load_state_dict(eager)  # the eager L-BFGS's checkpoint is torch's, not the BB step's
