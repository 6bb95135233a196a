"""The stateful shell's behaviour against torch.optim: groups, None grads,
closures, edited hyper-parameters, checkpoints both ways, and error paths."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import count_compiles, loss_jax, loss_torch, problem

import lucid

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)


def _lucid_params(init, dtype="float64"):
    return {k: lucid.Parameter(jnp.asarray(v, dtype)) for k, v in sorted(init.items())}


def _torch_params(init, dtype=torch.float64):
    return {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in sorted(init.items())}


def _torch_step(opt, params, loss=loss_torch):
    opt.zero_grad()
    value = loss(params)
    value.backward()
    opt.step()
    return value


def _lucid_step(opt, params, loss=loss_jax):
    opt.zero_grad()
    value = lucid.backward(loss, params)
    opt.step()
    return value


def _assert_params_close(ours, theirs, rtol=1e-10):
    for key in theirs:
        chex.assert_trees_all_close(
            np.asarray(ours[key].data), theirs[key].detach().numpy(), rtol=rtol, atol=1e-13
        )


def _snapshot(opt, params):
    sd = opt.state_dict()
    return (
        {k: np.asarray(p.data).copy() for k, p in params.items()},
        {i: {n: np.asarray(v).copy() for n, v in s.items()} for i, s in sd["state"].items()},
        [dict(g) for g in sd["param_groups"]],
    )


def _assert_unchanged(before, after):
    params0, state0, groups0 = before
    params1, state1, groups1 = after
    assert groups0 == groups1
    assert set(state0) == set(state1)
    for i in state0:
        assert set(state0[i]) == set(state1[i])
        for name in state0[i]:
            np.testing.assert_array_equal(state0[i][name], state1[i][name])
    for k in params0:
        np.testing.assert_array_equal(params0[k], params1[k])


# ---------------------------------------------------------------- Parameter


def test_parameter_is_a_mutable_box_with_torch_like_attributes():
    p = lucid.Parameter(np.ones((2, 3), np.float32))
    assert p.shape == (2, 3) and p.dtype == jnp.float32 and p.ndim == 2 and p.size == 6
    assert p.grad is None
    assert "Parameter(" in repr(p) and "float32" in repr(p)
    p.data = jnp.zeros((2, 3), jnp.float32)
    np.testing.assert_array_equal(np.asarray(p), np.zeros((2, 3)))
    assert hash(p) != hash(lucid.Parameter(np.ones(1)))


def test_backward_accumulates_until_zero_grad_like_torch():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    for _ in range(2):
        lucid.backward(loss_jax, params)
        loss_torch(tparams).backward()
    for k in init:
        chex.assert_trees_all_close(np.asarray(params[k].grad), tparams[k].grad.numpy(), rtol=1e-12)
    opt = lucid.optim.SGD(list(params.values()))
    opt.zero_grad(set_to_none=False)
    assert all(float(jnp.abs(p.grad).max()) == 0.0 for p in params.values())
    opt.zero_grad()
    assert all(p.grad is None for p in params.values())


def test_backward_passes_extra_arguments_and_non_parameter_leaves():
    w = lucid.Parameter(jnp.asarray([1.0, 2.0]))
    model = {"w": w, "scale": 3.0, "offset": jnp.asarray(0.5)}

    def loss_fn(m, x, power=2):
        return jnp.sum((m["scale"] * m["w"] * x + m["offset"]) ** power)

    x = jnp.asarray([1.0, -1.0])
    loss = lucid.backward(loss_fn, model, x, power=2)
    chex.assert_trees_all_close(loss, loss_fn({**model, "w": w.data}, x))
    expected = 2 * (3.0 * w.data * x + 0.5) * 3.0 * x
    chex.assert_trees_all_close(w.grad, expected)


# ---------------------------------------------------------------- groups


def test_param_groups_have_torchs_keys_and_per_group_values():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.Adam(
        [{"params": [params["w"]], "lr": 0.05, "betas": (0.5, 0.9)}, {"params": [params["b"]]}],
        lr=0.01,
        weight_decay=0.1,
    )
    topt = torch.optim.Adam(
        [{"params": [tparams["w"]], "lr": 0.05, "betas": (0.5, 0.9)}, {"params": [tparams["b"]]}],
        lr=0.01,
        weight_decay=0.1,
    )
    assert [set(g) for g in opt.param_groups] == [set(g) for g in topt.param_groups]
    for _ in range(20):
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
    _assert_params_close(params, tparams)


def test_add_param_group_later_matches_torch():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.SGD([params["w"]], lr=0.1, momentum=0.9)
    topt = torch.optim.SGD([tparams["w"]], lr=0.1, momentum=0.9)
    for step in range(12):
        if step == 5:
            opt.add_param_group({"params": params["b"], "lr": 0.02})
            topt.add_param_group({"params": tparams["b"], "lr": 0.02})
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
    _assert_params_close(params, tparams)


def test_a_parameter_in_two_groups_is_refused_and_changes_nothing():
    p = lucid.Parameter(jnp.ones(3))
    opt = lucid.optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [p]})
    assert len(opt.param_groups) == 1


def test_none_grads_are_skipped_and_get_no_state():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    topt = torch.optim.Adam(list(tparams.values()), lr=0.01)

    def loss_w_jax(p):
        return loss_jax({"w": p["w"], "b": jnp.zeros(3)})

    def loss_w_torch(p):
        return loss_torch({"w": p["w"], "b": torch.zeros(3, dtype=torch.float64)})

    for step in range(10):
        opt.zero_grad()
        lucid.backward(loss_w_jax, {"w": params["w"]})
        topt.zero_grad()
        loss_w_torch({"w": tparams["w"]}).backward()
        if step >= 4:
            lucid.backward(lambda b: 0.1 * jnp.sum(jnp.sin(3 * b)), params["b"])
            (0.1 * torch.sum(torch.sin(3 * tparams["b"]))).backward()
        if step == 3:
            assert params["b"] not in opt.state and params["b"].grad is None
        opt.step()
        topt.step()
    _assert_params_close(params, tparams)
    assert float(opt.state[params["b"]]["step"]) == 6.0
    assert float(opt.state[params["w"]]["step"]) == 10.0


def test_step_returns_the_closures_loss():
    init = problem()
    params = _lucid_params(init)
    opt = lucid.optim.SGD(list(params.values()), lr=0.1)

    def closure():
        opt.zero_grad()
        return lucid.backward(loss_jax, params)

    before = float(loss_jax({k: p.data for k, p in params.items()}))
    loss = opt.step(closure)
    assert float(loss) == pytest.approx(before)
    assert float(loss_jax({k: p.data for k, p in params.items()})) < before


def test_hand_edited_hyperparameters_take_effect_without_recompiling():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    # weight_decay starts non-zero: going from 0 to non-zero is a change of
    # program (torch skips the term entirely at 0), not of value
    opt = lucid.optim.Adam(list(params.values()), lr=0.01, betas=(0.9, 0.99), weight_decay=0.01)
    topt = torch.optim.Adam(list(tparams.values()), lr=0.01, betas=(0.9, 0.99), weight_decay=0.01)
    # two steps before counting: the first eager step lays the small parameters into
    # the pieces it returns, so the second backward sees new buffers (once)
    for _ in range(2):
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
    with count_compiles() as compiled:
        for step in range(2, 30):
            for group in (opt.param_groups[0], topt.param_groups[0]):
                group["lr"] = 0.01 * (1 + np.sin(step))
                group["betas"] = (0.9 - 0.01 * (step % 3), 0.99)
                group["weight_decay"] = 0.05 * (step % 2) + 0.01
            _lucid_step(opt, params)
            _torch_step(topt, tparams)
    assert len(compiled) == 0, f"{len(compiled)} compilations while only values changed"
    _assert_params_close(params, tparams)


# ---------------------------------------------------------------- checkpoints


def _with_torch_tensor_leaves(sd):
    """lucid's state_dict with every state leaf a torch tensor (what torch loads)."""
    return {
        "state": {i: {n: torch.as_tensor(v) for n, v in s.items()} for i, s in sd["state"].items()},
        "param_groups": sd["param_groups"],
    }


@pytest.mark.parametrize(
    "name,options",
    [
        ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
        ("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.1}),
        ("AdamW", {"lr": 0.01}),
    ],
)
def test_checkpoints_move_both_ways_between_torch_and_lucid(name, options):
    init = problem()
    # torch -> lucid: k torch steps, load into lucid, continue both
    tparams = _torch_params(init)
    topt = getattr(torch.optim, name)(list(tparams.values()), **options)
    for _ in range(7):
        _torch_step(topt, tparams)
    params = _lucid_params({k: v.detach().numpy().copy() for k, v in tparams.items()})
    opt = getattr(lucid.optim, name)(list(params.values()), **options)
    opt.load_state_dict(topt.state_dict())
    for _ in range(8):
        _torch_step(topt, tparams)
        _lucid_step(opt, params)
    _assert_params_close(params, tparams)

    # lucid -> torch: lucid's state_dict with each leaf through torch.as_tensor
    tparams2 = _torch_params({k: np.asarray(p.data) for k, p in params.items()})
    topt2 = getattr(torch.optim, name)(list(tparams2.values()), **options)
    topt2.load_state_dict(_with_torch_tensor_leaves(opt.state_dict()))
    for _ in range(8):
        _torch_step(topt2, tparams2)
        _lucid_step(opt, params)
    _assert_params_close(params, tparams2)


def test_state_dict_is_a_snapshot():
    init = problem()
    params = _lucid_params(init)
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    _lucid_step(opt, params)
    before = _snapshot(opt, params)
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 123.0
    sd["param_groups"][0]["betas"] = (0.0, 0.0)
    sd["state"][0]["exp_avg"] = None
    kept = opt.state_dict()
    sd["state"].clear()
    _assert_unchanged(before, _snapshot(opt, params))
    # and the steps after it go on as if no state_dict had been taken, nor edited
    reference_params = _lucid_params(init)
    reference = lucid.optim.Adam(list(reference_params.values()), lr=0.01)
    _lucid_step(reference, reference_params)
    for _ in range(2):
        _lucid_step(opt, params)
        _lucid_step(reference, reference_params)
    for k in params:
        np.testing.assert_array_equal(np.asarray(params[k].data), reference_params[k].data)
    # a later step does not reach into a state_dict taken before it
    assert float(np.asarray(kept["state"][0]["step"])) == 1.0


def test_state_entries_written_by_name_are_kept_and_loaded_as_torch_keeps_them():
    _, opt = _stepped_adam()
    tparam = torch.zeros(3, requires_grad=True)
    topt = torch.optim.Adam([tparam], lr=0.01)
    tparam.grad = torch.ones(3)
    topt.step()
    tsd = topt.state_dict()
    tsd["state"][0]["velocity"] = torch.zeros(3)  # a name Adam does not keep
    topt.load_state_dict(tsd)
    assert "velocity" in topt.state[tparam]  # torch keeps it
    sd = opt.state_dict()
    sd["state"][0]["velocity"] = np.zeros(3)
    opt.load_state_dict(sd)
    first = opt.param_groups[0]["params"][0]
    assert "velocity" in opt.state[first]
    assert "velocity" in opt.state_dict()["state"][0]


_RESUME_SCRIPT = textwrap.dedent(
    """
    import pickle, sys
    import numpy as np, jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, {tests!r})
    import lucid
    from oracle import loss_jax, problem

    mode, path, total, first = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    params = {{k: lucid.Parameter(jnp.asarray(v, jnp.float32))
              for k, v in sorted(problem().items())}}
    opt = lucid.optim.Adam(list(params.values()), lr=0.01, amsgrad=True)
    if mode == "resume-pickle":
        with open(path, "rb") as f:
            saved = pickle.load(f)
    elif mode == "resume-npz":
        data = np.load(path)
        saved = {{"params": {{k: data["param." + k] for k in params}},
                  "optimizer": {{"param_groups": pickle.loads(data["groups"].tobytes()),
                                 "state": {{}}}}}}
        for key in data.files:
            if key.startswith("state."):
                _, index, name = key.split(".")
                saved["optimizer"]["state"].setdefault(int(index), {{}})[name] = data[key]
    if mode.startswith("resume"):
        for k, p in params.items():
            p.data = jnp.asarray(saved["params"][k])
        opt.load_state_dict(saved["optimizer"])
        steps = total - first
    else:
        steps = first if mode.startswith("save") else total
    for _ in range(steps):
        opt.zero_grad()
        lucid.backward(loss_jax, params)
        opt.step()
    if mode == "save-pickle":
        with open(path, "wb") as f:
            pickle.dump({{"params": {{k: np.asarray(p.data) for k, p in params.items()}},
                         "optimizer": opt.state_dict()}}, f)
    elif mode == "save-npz":
        sd = opt.state_dict()
        arrays = {{"param." + k: np.asarray(p.data) for k, p in params.items()}}
        for index, state in sd["state"].items():
            arrays.update({{f"state.{{index}}.{{n}}": np.asarray(v) for n, v in state.items()}})
        arrays["groups"] = np.frombuffer(pickle.dumps(sd["param_groups"]), np.uint8)
        np.savez(path, **arrays)
    else:
        with open(path + ".final", "wb") as f:
            pickle.dump({{k: np.asarray(p.data) for k, p in params.items()}}, f)
    """
)


@pytest.mark.parametrize("fmt", ["pickle", "npz"])
def test_resume_after_restart_is_bit_identical(tmp_path, fmt):
    import os

    script = tmp_path / "run.py"
    script.write_text(_RESUME_SCRIPT.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(mode, path):
        subprocess.run(
            [sys.executable, str(script), mode, str(path), "30", "12"], check=True, env=env
        )

    straight = tmp_path / "straight"
    run("straight", straight)
    ckpt = tmp_path / f"ckpt.{fmt}"
    run(f"save-{fmt}", ckpt)
    run(f"resume-{fmt}", ckpt)
    with open(f"{straight}.final", "rb") as f:
        expected = pickle.load(f)
    with open(f"{ckpt}.final", "rb") as f:
        resumed = pickle.load(f)
    for k in expected:
        np.testing.assert_array_equal(resumed[k], expected[k])


# ---------------------------------------------------------------- errors


def _stepped_adam():
    params = _lucid_params(problem())
    opt = lucid.optim.Adam(list(params.values()), lr=0.01, amsgrad=True)
    _lucid_step(opt, params)
    return params, opt


def _corrupt(sd, how):
    if how == "groups":
        sd["param_groups"].append(dict(sd["param_groups"][0]))
    elif how == "params":
        sd["param_groups"][0]["params"] = sd["param_groups"][0]["params"][:1]
    elif how == "shape":
        sd["state"][1]["exp_avg"] = np.zeros((4, 4))
    elif how == "missing-state":
        del sd["state"][0]["exp_avg"]
    elif how == "missing-key":
        del sd["state"]
    elif how == "unknown-index":
        sd["state"][7] = sd["state"][0]
    elif how == "bad-hyper":
        sd["param_groups"][0]["lr"] = -1.0
    elif how == "step-shape":
        sd["state"][0]["step"] = np.zeros(2)
    return sd


@pytest.mark.parametrize(
    "how",
    [
        "groups",
        "params",
        "shape",
        "missing-state",
        "missing-key",
        "unknown-index",
        "bad-hyper",
        "step-shape",
    ],
)
def test_loading_a_mismatched_state_dict_raises_and_changes_nothing(how):
    params, opt = _stepped_adam()
    sd = opt.state_dict()
    # the later state_dict carries different values, so a partial load would show
    other_params, other = _stepped_adam()
    _lucid_step(other, other_params)
    before = _snapshot(opt, params)
    with pytest.raises(ValueError):
        opt.load_state_dict(_corrupt(other.state_dict(), how))
    _assert_unchanged(before, _snapshot(opt, params))
    opt.load_state_dict(sd)  # and a good one still loads


def test_a_bad_gradient_raises_before_any_group_changes():
    params = _lucid_params(problem())
    opt = lucid.optim.Adam([{"params": [params["b"]]}, {"params": [params["w"]]}], lr=0.01)
    _lucid_step(opt, params)
    before = _snapshot(opt, params)
    lucid.backward(loss_jax, params)
    params["w"].grad = jnp.zeros((2, 2))
    with pytest.raises(ValueError, match="shape"):
        opt.step()
    params["w"].grad = jnp.zeros((5, 3), jnp.float32)
    with pytest.raises(ValueError, match="dtype"):
        opt.step()
    _assert_unchanged(before, _snapshot(opt, params))


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: lucid.optim.SGD([]), ValueError, "empty parameter list"),
        (lambda: lucid.optim.SGD(lucid.Parameter(jnp.ones(2))), TypeError, "iterable"),
        (
            lambda: lucid.optim.SGD([{"params": {lucid.Parameter(jnp.ones(2))}}]),
            TypeError,
            "ordered",
        ),
        (lambda: lucid.optim.SGD([jnp.ones(2)]), TypeError, "lucid.Parameter"),
        (
            lambda: lucid.optim.SGD([lucid.Parameter(jnp.ones(2, jnp.int32))]),
            ValueError,
            "floating",
        ),
        (
            lambda: lucid.optim.Adam([lucid.Parameter(jnp.ones(2))], lr=-1.0),
            ValueError,
            "Invalid learning rate: -1.0",
        ),
        (
            lambda: lucid.optim.Adam([lucid.Parameter(jnp.ones(2))], momentum=0.9),
            TypeError,
            "momentum",
        ),
        (
            lambda: lucid.optim.Adam([lucid.Parameter(jnp.ones(2))], differentiable=True),
            ValueError,
            "differentiable",
        ),
    ],
)
def test_constructor_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_differentiable_keyword_fails_identically_for_functional_and_shell():
    with pytest.raises(ValueError, match="differentiable") as functional_error:
        lucid.functional.adam(differentiable=True)
    w = lucid.Parameter(jnp.ones(2))
    with pytest.raises(ValueError, match="differentiable") as shell_error:
        lucid.optim.Adam([w], differentiable=True)
    assert str(shell_error.value) == str(functional_error.value)
    opt = lucid.optim.Adam([w])
    opt.param_groups[0]["differentiable"] = True  # set by hand: refused at the step
    w.grad = jnp.ones(2)
    with pytest.raises(ValueError, match="differentiable") as step_error:
        opt.step()
    assert str(step_error.value) == str(functional_error.value)
    np.testing.assert_array_equal(np.asarray(w.data), np.ones(2))


def test_sparse_adam_shell_takes_dense_and_bcoo_grads_like_torch():
    from jax.experimental import sparse

    rng = np.random.default_rng(3)
    table = rng.normal(size=(10, 4))
    batches = [rng.integers(0, 10, size=5) for _ in range(12)]
    tw = torch.tensor(table, requires_grad=True)
    topt = torch.optim.SparseAdam([tw], lr=0.05)
    dense_w = lucid.Parameter(jnp.asarray(table))
    sparse_w = lucid.Parameter(jnp.asarray(table))
    dense_opt = lucid.optim.SparseAdam([dense_w], lr=0.05)
    sparse_opt = lucid.optim.SparseAdam([sparse_w], lr=0.05)
    target = rng.normal(size=(5, 4))
    for idx in batches:
        topt.zero_grad()
        rows = torch.nn.functional.embedding(torch.as_tensor(idx), tw, sparse=True)
        torch.sum((rows - torch.as_tensor(target)) ** 2).backward()
        topt.step()
        for w, opt in ((dense_w, dense_opt), (sparse_w, sparse_opt)):
            opt.zero_grad()
            lucid.backward(lambda t, i: jnp.sum((t[i] - target) ** 2), w, jnp.asarray(idx))
        sparse_w.grad = sparse.BCOO.fromdense(sparse_w.grad, n_dense=1)
        dense_opt.step()
        sparse_opt.step()
    for w in (dense_w, sparse_w):
        chex.assert_trees_all_close(w.data, tw.detach().numpy(), rtol=1e-10)
    sd, tsd = dense_opt.state_dict(), topt.state_dict()
    assert sd["state"][0]["step"] == tsd["state"][0]["step"] and isinstance(
        sd["state"][0]["step"], int
    )
    chex.assert_trees_all_close(
        sd["state"][0]["exp_avg_sq"], tsd["state"][0]["exp_avg_sq"].numpy(), rtol=1e-10
    )


def test_adamw_load_makes_weight_decay_decoupled_again_as_torch():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.AdamW(list(params.values()), lr=0.01)
    topt = torch.optim.AdamW(list(tparams.values()), lr=0.01)
    for o in (opt, topt):
        o.param_groups[0]["decoupled_weight_decay"] = False
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["param_groups"][0]["decoupled_weight_decay"] is False
    fresh = lucid.optim.AdamW(list(params.values()), lr=0.01)
    tfresh = torch.optim.AdamW(list(tparams.values()), lr=0.01)
    fresh.load_state_dict(sd)
    tfresh.load_state_dict(tsd)
    assert fresh.param_groups[0]["decoupled_weight_decay"] is True
    assert fresh.state_dict()["param_groups"] == tfresh.state_dict()["param_groups"]
