"""One state model: eager and compiled steps create and keep state by torch's rules.

Each test here was a failure of the compiled step when it kept its own state
model: state frozen at compile time, a second executable for SGD's first
momentum step, lost updates with shared parameters, parameters on several
devices. Every run is compared with torch (the oracle) and, where both modes
apply, eager with compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from _distributed import HOST_DEVICES
from oracle import count_compiles, loss_jax, problem, torch_default_dtype
from test_shell import (
    _assert_params_close,
    _assert_unchanged,
    _lucid_params,
    _lucid_step,
    _snapshot,
    _torch_params,
    _torch_step,
)

import lucid

MODES = ["eager", "compiled"]


@pytest.fixture(autouse=True)
def _torch_in_float64():
    """torch keeps some 0-d state (NAdam's mu_product) in its default dtype."""
    with torch_default_dtype(torch.float64):
        yield


def _maybe_compile(opt, mode):
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    return opt


def _assert_states_close(ours, theirs, rtol=1e-10):
    ours, theirs = ours.state_dict(), theirs.state_dict()
    assert set(ours["state"]) == set(theirs["state"])
    for index, entry in theirs["state"].items():
        assert set(ours["state"][index]) == set(entry), index
        for name, value in entry.items():
            np.testing.assert_allclose(
                np.asarray(ours["state"][index][name]),
                torch.as_tensor(value).detach().numpy(),
                rtol=rtol,
                atol=1e-13,
                err_msg=f"{index}/{name}",
            )


@pytest.mark.parametrize("mode", MODES)
def test_state_is_made_at_the_first_step_from_the_groups_values_then(mode):
    """RMSprop, group 0 at momentum 0 when compiled, then OneCycleLR cycles momentum:
    the state is created at the first step, with a momentum buffer, as torch does."""
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.RMSprop([{"params": [params["b"]]}, {"params": [params["w"]], "lr": 0.02}])
    topt = torch.optim.RMSprop([{"params": [tparams["b"]]}, {"params": [tparams["w"]], "lr": 0.02}])
    _maybe_compile(opt, mode)
    sched = lucid.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.05, 0.1], total_steps=20)
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=[0.05, 0.1], total_steps=20)
    for _ in range(12):
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
        sched.step()
        tsched.step()
    _assert_params_close(params, tparams)
    _assert_states_close(opt, topt)
    assert "momentum_buffer" in opt.state[params["w"]]


@pytest.mark.parametrize("mode", MODES)
def test_sgd_momentum_turned_on_off_and_on_again_follows_torch(mode):
    """torch starts the buffer from the raw gradient when momentum comes on, leaves it
    untouched while momentum is 0, and resumes it when momentum comes back."""
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = _maybe_compile(lucid.optim.SGD(list(params.values()), lr=0.05, dampening=0.3), mode)
    topt = torch.optim.SGD(list(tparams.values()), lr=0.05, dampening=0.3)
    for step, momentum in enumerate([0, 0, 0.9, 0.9, 0, 0, 0.5, 0.5]):
        for group in (*opt.param_groups, *topt.param_groups):
            group["momentum"] = momentum
            group["weight_decay"] = 0.1 if step % 3 == 0 else 0  # crossing 0 and back
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
        _assert_params_close(params, tparams)
        _assert_states_close(opt, topt)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("name", "options", "turn_on"),
    [
        ("RMSprop", {"lr": 0.01}, {"momentum": 0.9}),
        ("RMSprop", {"lr": 0.01}, {"centered": True}),
        ("Adam", {"lr": 0.01}, {"amsgrad": True}),
    ],
    ids=["rmsprop-momentum", "rmsprop-centered", "adam-amsgrad"],
)
def test_an_option_needing_state_turned_on_later_raises_torchs_keyerror(
    mode, name, options, turn_on
):
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = _maybe_compile(getattr(lucid.optim, name)(list(params.values()), **options), mode)
    topt = getattr(torch.optim, name)(list(tparams.values()), **options)
    _lucid_step(opt, params)
    _torch_step(topt, tparams)
    opt.param_groups[0].update(turn_on)
    topt.param_groups[0].update(turn_on)
    opt.zero_grad()
    lucid.backward(loss_jax, params)
    before = _snapshot(opt, params)
    with pytest.raises(KeyError) as torch_error:
        _torch_step(topt, tparams)
    with pytest.raises(KeyError, match=str(torch_error.value).strip("'")):
        opt.step()
    _assert_unchanged(before, _snapshot(opt, params))


def test_compiled_sgd_with_momentum_under_a_scheduler_builds_one_executable():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.SGD(list(params.values()), lr=0.1, momentum=0.9, nesterov=True)
    topt = torch.optim.SGD(list(tparams.values()), lr=0.1, momentum=0.9, nesterov=True)
    sched = lucid.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.7)
    lucid.compile_optimizer(opt)
    lucid.backward(loss_jax, params)  # compile the loss outside the count
    opt.zero_grad()
    _lucid_step(opt, params)
    _torch_step(topt, tparams)
    sched.step()
    tsched.step()
    with count_compiles() as compiled:
        for _ in range(10):
            _lucid_step(opt, params)
            _torch_step(topt, tparams)
            sched.step()
            tsched.step()
    assert compiled == [], f"{len(compiled)} compilations after the first step"
    _assert_params_close(params, tparams)
    _assert_states_close(opt, topt)


@pytest.mark.parametrize(
    "modes",
    [("compiled", "compiled"), ("eager", "compiled"), ("compiled", "eager")],
    ids=lambda m: "-".join(m),
)
def test_optimizers_sharing_parameters_never_lose_an_update(modes):
    """An optimizer for all weights and another for a subset: torch applies both."""
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    first = lucid.optim.Adam(list(params.values()), lr=0.01)
    second = lucid.optim.SGD([params["w"]], lr=0.05, momentum=0.5)
    tfirst = torch.optim.Adam(list(tparams.values()), lr=0.01)
    tsecond = torch.optim.SGD([tparams["w"]], lr=0.05, momentum=0.5)
    _maybe_compile(first, modes[0])
    _maybe_compile(second, modes[1])
    for step in range(8):
        for opt, topt in ((first, tfirst), (second, tsecond)) if step % 3 else ((second, tsecond),):
            _lucid_step(opt, params)
            _torch_step(topt, tparams)
            _assert_params_close(params, tparams)
    _assert_states_close(first, tfirst)
    _assert_states_close(second, tsecond)


def test_compiling_twice_returns_the_same_object_and_keeps_numbers():
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.NAdam(list(params.values()), lr=0.01)
    topt = torch.optim.NAdam(list(tparams.values()), lr=0.01)
    for step in range(6):
        if step == 3:
            compiled = lucid.compile_optimizer(opt)
            assert isinstance(compiled, lucid.optim.CompiledOptimizer)
            assert lucid.compile_optimizer(opt) is compiled
            assert compiled.param_groups is opt.param_groups
        _lucid_step(opt, params)
        _torch_step(topt, tparams)
    _assert_params_close(params, tparams)
    _assert_states_close(opt, topt)


PLACEMENT_SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import lucid

    d0, d1 = jax.devices()[:2]
    rng = np.random.default_rng(0)
    init = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=(3,)), "c": rng.normal(size=(5,))}
    x = rng.normal(size=(6, 4))

    def loss_fn(m, x):
        # parameters on different devices meet on the first one's device
        w, b, c = (jax.device_put(m[k], d0) for k in ("w", "b", "c"))
        return jnp.mean(jnp.tanh(x @ w + b) ** 2) + jnp.sum(jnp.sin(c) ** 2)

    def run(mode, placed, groups_per_device):
        devices = {"w": d0, "b": d1, "c": d1} if placed else {k: d0 for k in init}
        params = {k: lucid.Parameter(jax.device_put(jnp.asarray(v), devices[k]))
                  for k, v in init.items()}
        if groups_per_device:
            groups = [{"params": [params["w"]]},
                      {"params": [params["b"], params["c"]], "lr": 0.03}]
        else:
            groups = [{"params": list(params.values())}]
        opt = lucid.optim.Adam(groups, lr=0.02, amsgrad=True)
        if mode == "compiled":
            lucid.compile_optimizer(opt)
        fused = lucid.optim.fused_step(loss_fn, opt) if mode == "fused" else None
        for _ in range(5):
            if fused is not None:
                fused(params, x)
            else:
                opt.zero_grad()
                lucid.backward(loss_fn, params, x)
                opt.step()
        for k, p in params.items():
            assert p.data.sharding.device_set == {devices[k]}, (mode, k, p.data.sharding)
        return {k: np.asarray(p.data) for k, p in params.items()}

    reference = run("eager", False, False)
    for mode in ("eager", "compiled", "fused"):
        for groups_per_device in (False, True):
            if groups_per_device:
                expected = run(mode, False, True)
            else:
                expected = reference
            got = run(mode, True, groups_per_device)
            for k in init:
                np.testing.assert_allclose(got[k], expected[k], rtol=1e-12,
                                           err_msg=f"{mode} {groups_per_device} {k}")
    print("OK")
    """
)


@HOST_DEVICES
def test_parameters_on_different_devices_run_in_every_mode(tmp_path):
    """Eager (one group over two devices), backward, compiled (one group, or one per
    device) and fused: every parameter stays on its device and the numbers equal a
    single-device run."""
    script = tmp_path / "placement.py"
    script.write_text(PLACEMENT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("XLA_FLAGS", None)
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("OK")


def test_a_parameter_keeps_one_value_whoever_holds_it():
    """The storage protocol: after compiling, the Parameter forwards to a flat buffer;
    writes through .data and .grad land there, and reads see them."""
    w = lucid.Parameter(jnp.arange(3.0))
    b = lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.SGD([w, b], lr=0.5)
    own = w.location[0]
    lucid.compile_optimizer(opt)
    storage, index = w.location
    assert storage is not own and storage is b.location[0] and index == 0
    w.data = jnp.full(3, 2.0)
    w.grad = jnp.ones(3)
    np.testing.assert_array_equal(np.asarray(storage.value(0)), np.full(3, 2.0))
    opt.step()
    np.testing.assert_array_equal(np.asarray(w.data), np.full(3, 1.5))
    np.testing.assert_array_equal(np.asarray(b.data), np.ones(2))  # no gradient: not moved
    with pytest.raises(TypeError, match="shape"):
        w.grad = [0.1, 0.2, 0.3]


@pytest.mark.parametrize("mode", MODES)
def test_a_loaded_state_without_an_optional_entry_raises_at_the_step_as_torch(mode):
    """torch loads RMSprop state made while momentum was 0 into a group whose momentum is
    0.9 (OneCycleLR set it), and raises KeyError at the next step: lucid the same."""
    init = problem()
    params, tparams = _lucid_params(init), _torch_params(init)
    opt = lucid.optim.RMSprop(list(params.values()), lr=0.01)
    topt = torch.optim.RMSprop(list(tparams.values()), lr=0.01)
    _lucid_step(opt, params)
    _torch_step(topt, tparams)
    for o in (opt, topt):
        o.param_groups[0]["momentum"] = 0.9
    fresh = _maybe_compile(lucid.optim.RMSprop(list(params.values()), lr=0.01), mode)
    tfresh = torch.optim.RMSprop(list(tparams.values()), lr=0.01)
    tfresh.load_state_dict(topt.state_dict())
    fresh.load_state_dict(opt.state_dict())  # accepted, as torch accepts it
    assert "momentum_buffer" not in fresh.state[params["w"]]
    with pytest.raises(KeyError):
        _torch_step(tfresh, tparams)
    fresh.zero_grad()
    lucid.backward(loss_jax, params)
    before = _snapshot(fresh, params)
    with pytest.raises(KeyError, match="momentum_buffer"):
        fresh.step()
    _assert_unchanged(before, _snapshot(fresh, params))
