"""lucid.optim.swa_utils and lucid.functional.averaging against torch.optim.swa_utils:
the averaged weights (SWA, EMA, custom avg_fn, buffers) and SWALR's learning rates."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from oracle import torch_default_dtype

import lucid
import lucid.functional as LF
from lucid.optim import swa_utils

TORCH = torch.optim.swa_utils


def _trajectory(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))} for _ in range(n)]


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3, 2))
        self.b = torch.nn.Parameter(torch.zeros(2))
        self.register_buffer("stat", torch.zeros(2))


def _torch_average(make_averaged, steps):
    with torch_default_dtype(torch.float64):
        model = TorchModel()
        averaged = make_averaged(model)
        for k, values in enumerate(steps):
            with torch.no_grad():
                model.w.copy_(torch.tensor(values["w"]))
                model.b.copy_(torch.tensor(values["b"]))
                model.stat.copy_(torch.tensor(values["b"]) * (k + 1))
            averaged.update_parameters(model)
        module = averaged.module
        return {
            "w": module.w.detach().numpy().copy(),
            "b": module.b.detach().numpy().copy(),
            "stat": module.stat.numpy().copy(),
            "n": int(averaged.n_averaged),
        }


def _lucid_average(make_averaged, steps):
    model = {
        "w": lucid.Parameter(jnp.zeros((3, 2))),
        "b": lucid.Parameter(jnp.zeros(2)),
        "stat": jnp.zeros(2),
    }
    averaged = make_averaged(model)
    for k, values in enumerate(steps):
        model["w"].data = jnp.asarray(values["w"])
        model["b"].data = jnp.asarray(values["b"])
        model["stat"] = jnp.asarray(values["b"]) * (k + 1)
        averaged.update_parameters(model)
    module = averaged.module
    return {
        "w": np.asarray(module["w"].data),
        "b": np.asarray(module["b"].data),
        "stat": np.asarray(module["stat"]),
        "n": int(averaged.n_averaged),
    }


AVERAGERS = {
    "swa": ({}, {}),
    "ema-multi": (
        {"multi_avg_fn": TORCH.get_ema_multi_avg_fn(0.7)},
        {"multi_avg_fn": swa_utils.get_ema_multi_avg_fn(0.7)},
    ),
    "ema-single": (
        {"avg_fn": TORCH.get_ema_avg_fn(0.8)},
        {"avg_fn": swa_utils.get_ema_avg_fn(0.8)},
    ),
    "swa-single": ({"avg_fn": TORCH.get_swa_avg_fn()}, {"avg_fn": swa_utils.get_swa_avg_fn()}),
    "swa-multi": (
        {"multi_avg_fn": TORCH.get_swa_multi_avg_fn()},
        {"multi_avg_fn": swa_utils.get_swa_multi_avg_fn()},
    ),
}


@pytest.mark.parametrize("use_buffers", [False, True])
@pytest.mark.parametrize("kind", list(AVERAGERS))
def test_averaged_model_matches_torch(kind, use_buffers):
    theirs_kw, ours_kw = AVERAGERS[kind]
    steps = _trajectory()
    expected = _torch_average(
        lambda m: TORCH.AveragedModel(m, use_buffers=use_buffers, **theirs_kw), steps
    )
    actual = _lucid_average(
        lambda m: swa_utils.AveragedModel(m, use_buffers=use_buffers, **ours_kw), steps
    )
    assert actual["n"] == expected["n"] == len(steps)
    for key in ("w", "b", "stat"):
        np.testing.assert_allclose(actual[key], expected[key], rtol=1e-12, atol=1e-14, err_msg=key)


@pytest.mark.parametrize("kind", ["swa", "ema"])
def test_functional_averagers_match_torch_and_jit(kind):
    steps = _trajectory()
    if kind == "swa":
        expected = _torch_average(lambda m: TORCH.AveragedModel(m), steps)
        averager = LF.averaging.swa()
    else:
        fn = TORCH.get_ema_multi_avg_fn(0.9)
        expected = _torch_average(lambda m: TORCH.AveragedModel(m, multi_avg_fn=fn), steps)
        averager = LF.averaging.ema(0.9)
    params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
    state = averager.init(params)
    update = jax.jit(averager.update)
    for values in steps:
        state = update({k: jnp.asarray(v) for k, v in values.items()}, state)
    assert int(state.n_averaged) == expected["n"]
    for key in ("w", "b"):
        np.testing.assert_allclose(np.asarray(state.averaged[key]), expected[key], rtol=1e-12)


def test_invalid_decays_raise_torchs_error():
    with pytest.raises(ValueError, match="Invalid decay") as theirs:
        TORCH.get_ema_multi_avg_fn(1.5)
    for make in (swa_utils.get_ema_multi_avg_fn, swa_utils.get_ema_avg_fn, LF.averaging.ema):
        with pytest.raises(ValueError, match=str(theirs.value).replace("[", r"\[")):
            make(1.5)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("anneal_epochs", [0, 1, 4])
def test_swalr_gives_torchs_learning_rates(strategy, anneal_epochs):
    w, tw = lucid.Parameter(jnp.ones(2)), torch.ones(2, requires_grad=True)
    tv = torch.ones(2, requires_grad=True)
    v = lucid.Parameter(jnp.ones(2))
    opt = lucid.optim.SGD([{"params": [w]}, {"params": [v], "lr": 0.3}], lr=0.5)
    topt = torch.optim.SGD([{"params": [tw]}, {"params": [tv], "lr": 0.3}], lr=0.5)
    sched = swa_utils.SWALR(
        opt, swa_lr=[0.05, 0.01], anneal_epochs=anneal_epochs, anneal_strategy=strategy
    )
    tsched = TORCH.SWALR(
        topt, swa_lr=[0.05, 0.01], anneal_epochs=anneal_epochs, anneal_strategy=strategy
    )
    for _ in range(7):
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-14)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(
            [g["lr"] for g in topt.param_groups], rel=1e-14
        )
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
    assert opt.param_groups[0]["swa_lr"] == topt.param_groups[0]["swa_lr"]


def test_swalr_refuses_what_torch_refuses():
    opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.5)
    topt = torch.optim.SGD([torch.ones(2, requires_grad=True)], lr=0.5)
    for kwargs in (
        {"swa_lr": 0.1, "anneal_strategy": "exp"},
        {"swa_lr": 0.1, "anneal_epochs": -1},
        {"swa_lr": 0.1, "anneal_epochs": 2.5},
        {"swa_lr": [0.1, 0.2]},
    ):
        with pytest.raises(ValueError) as theirs:
            TORCH.SWALR(topt, **kwargs)
        with pytest.raises(ValueError) as ours:
            swa_utils.SWALR(opt, **kwargs)
        assert str(ours.value).split()[:3] == str(theirs.value).split()[:3], kwargs


# ------------------------------------------------- validation as torch's, state_dicts both ways
def _torch_one(shape, dtype=torch.float32, value=1.0):
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.full(shape, value, dtype=dtype))
    return module


def _lucid_one(shape, dtype=jnp.float32, value=1.0):
    return {"w": lucid.Parameter(jnp.full(shape, value, dtype=dtype))}


KINDS = {
    "swa": ({}, {}),
    "ema-multi": (
        {"multi_avg_fn": TORCH.get_ema_multi_avg_fn(0.5)},
        {"multi_avg_fn": swa_utils.get_ema_multi_avg_fn(0.5)},
    ),
    "ema-single": (
        {"avg_fn": TORCH.get_ema_avg_fn(0.5)},
        {"avg_fn": swa_utils.get_ema_avg_fn(0.5)},
    ),
}


def _snapshot(averaged):
    return np.asarray(averaged.module["w"].data).copy(), int(averaged.n_averaged)


@pytest.mark.parametrize("first", [True, False], ids=["first-update", "later-update"])
@pytest.mark.parametrize("shape", [(3,), (3, 2, 1), (2,), (1, 2)])
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_update_of_another_shape_is_refused_or_broadcast_as_torch(kind, shape, first):
    """torch writes into the averaged tensor in place: a broadcastable value is broadcast,
    any other raises; lucid refuses the same ones, changes nothing, and never reshapes."""
    theirs_kw, ours_kw = KINDS[kind]
    theirs = TORCH.AveragedModel(_torch_one((3, 2)), **theirs_kw)
    ours = swa_utils.AveragedModel(_lucid_one((3, 2)), **ours_kw)
    if not first:
        theirs.update_parameters(_torch_one((3, 2)))
        ours.update_parameters(_lucid_one((3, 2)))
    before = _snapshot(ours)
    try:
        theirs.update_parameters(_torch_one(shape, value=3.0))
    except RuntimeError:
        with pytest.raises(ValueError, match=r"has shape .* does not fit the averaged copy's"):
            ours.update_parameters(_lucid_one(shape, value=3.0))
        after = _snapshot(ours)
        np.testing.assert_array_equal(after[0], before[0])
        assert after[1] == before[1]
        return
    ours.update_parameters(_lucid_one(shape, value=3.0))
    assert ours.module["w"].shape == tuple(theirs.module.w.shape) == (3, 2)
    np.testing.assert_allclose(
        np.asarray(ours.module["w"].data), theirs.module.w.detach().numpy(), rtol=1e-6
    )


@pytest.mark.parametrize("kind", ["swa", "ema-single"])
def test_a_float32_average_of_a_float64_model_stays_float32_as_torchs(kind):
    theirs_kw, ours_kw = KINDS[kind]
    theirs = TORCH.AveragedModel(_torch_one((2,)), **theirs_kw)
    ours = swa_utils.AveragedModel(_lucid_one((2,)), **ours_kw)
    for value in (1.0 / 3.0, 2.0 / 7.0, 0.1):
        theirs.update_parameters(_torch_one((2,), torch.float64, value))
        ours.update_parameters(_lucid_one((2,), jnp.float64, value))
    assert theirs.module.w.dtype == torch.float32
    assert ours.module["w"].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(ours.module["w"].data), theirs.module.w.detach())


AVG_FN_RESULTS = {
    "0-d": lambda a, c, n: (a + c).sum(),
    "a number": lambda a, c, n: 1.5,
    "float64": lambda a, c, n: (a + c) / 3,
    "one row": lambda a, c, n: c[0] * 2,
    "wrong shape": lambda a, c, n: c[:, 0],
    "None": lambda a, c, n: None,
}


@pytest.mark.parametrize("name", list(AVG_FN_RESULTS))
def test_avg_fn_results_are_checked_as_torchs_copy_checks_them(name):
    """torch copies avg_fn's result into the averaged tensor: broadcast, cast to its dtype,
    or refused; lucid the same, the average's shape and dtype never change."""
    fn = AVG_FN_RESULTS[name]

    def torch_fn(a, c, n):
        result = fn(a, c, n)
        return result.double() if name == "float64" else result

    def lucid_fn(a, c, n):
        result = fn(a, c, n)
        return result.astype(jnp.float64) if name == "float64" else result

    theirs = TORCH.AveragedModel(_torch_one((3, 2)), avg_fn=torch_fn)
    ours = swa_utils.AveragedModel(_lucid_one((3, 2)), avg_fn=lucid_fn)
    rng = np.random.default_rng(3)
    values = [rng.normal(size=(3, 2)) for _ in range(2)]
    for k, value in enumerate(values):
        tm, lm = _torch_one((3, 2)), _lucid_one((3, 2))
        with torch.no_grad():
            tm.w.copy_(torch.tensor(value))
        lm["w"].data = jnp.asarray(value, jnp.float32)
        try:
            theirs.update_parameters(tm)
        except (RuntimeError, TypeError) as error:
            assert k == 1
            before = _snapshot(ours)
            with pytest.raises(type(error) if name == "None" else ValueError, match="avera"):
                ours.update_parameters(lm)
            np.testing.assert_array_equal(_snapshot(ours)[0], before[0])
            assert _snapshot(ours)[1] == before[1] == 1
            return
        ours.update_parameters(lm)
    assert ours.module["w"].dtype == np.float32 and ours.module["w"].shape == (3, 2)
    np.testing.assert_allclose(
        np.asarray(ours.module["w"].data), theirs.module.w.detach().numpy(), rtol=1e-6
    )


def test_multi_avg_fn_results_and_both_averaging_functions_are_refused_in_words():
    with pytest.raises(AssertionError) as theirs:
        TORCH.AveragedModel(_torch_one((2,)), avg_fn=TORCH.get_swa_avg_fn(), multi_avg_fn=print)
    with pytest.raises(ValueError, match=str(theirs.value)):
        swa_utils.AveragedModel(
            _lucid_one((2,)), avg_fn=swa_utils.get_swa_avg_fn(), multi_avg_fn=print
        )
    model = {"w": lucid.Parameter(jnp.ones(2)), "b": lucid.Parameter(jnp.ones(3))}
    for result, error, words in [
        (lambda a, c, n: None, TypeError, "must return the new averaged values"),
        (lambda a, c, n: a[:1], ValueError, "returned 1 arrays for 2"),
        (lambda a, c, n: [c[1], c[0]], ValueError, "does not fit"),
    ]:
        averaged = swa_utils.AveragedModel(model, multi_avg_fn=result)
        averaged.update_parameters(model)
        with pytest.raises(error, match=words):
            averaged.update_parameters(model)
        assert int(averaged.n_averaged) == 1


def _pair(use_buffers=False):
    """A torch AveragedModel and lucid's, over models with torch's names (a buffer too)."""
    theirs = TORCH.AveragedModel(TorchModel(), use_buffers=use_buffers)
    lucid_model = {
        "w": lucid.Parameter(jnp.zeros((3, 2), jnp.float32)),
        "b": lucid.Parameter(jnp.zeros(2, jnp.float32)),
        "stat": jnp.zeros(2, jnp.float32),
    }
    return theirs, swa_utils.AveragedModel(lucid_model, use_buffers=use_buffers), lucid_model


def _feed(theirs, ours, lucid_model, steps):
    for k, values in enumerate(steps):
        model = TorchModel()
        with torch.no_grad():
            model.w.copy_(torch.tensor(values["w"]))
            model.b.copy_(torch.tensor(values["b"]))
            model.stat.copy_(torch.tensor(values["b"]) * (k + 1))
        theirs.update_parameters(model)
        lucid_model["w"].data = jnp.asarray(values["w"], jnp.float32)
        lucid_model["b"].data = jnp.asarray(values["b"], jnp.float32)
        lucid_model["stat"] = jnp.asarray(values["b"] * (k + 1), jnp.float32)
        ours.update_parameters(lucid_model)


def _same(theirs, ours):
    """float32 to rounding: XLA divides by the 0-d `n + 1` as a multiplication by its
    reciprocal, torch divides (one rounding apart in a few entries)."""
    assert int(ours.n_averaged) == int(theirs.n_averaged)
    for ours_value, theirs_value in [
        (ours.module["w"].data, theirs.module.w.detach()),
        (ours.module["b"].data, theirs.module.b.detach()),
        (ours.module["stat"], theirs.module.stat),
    ]:
        assert ours_value.dtype == np.float32
        np.testing.assert_allclose(np.asarray(ours_value), theirs_value.numpy(), rtol=3e-7)


@pytest.mark.parametrize("use_buffers", [False, True])
def test_state_dicts_move_between_torch_and_lucid_averaged_models(use_buffers):
    steps = _trajectory(5, seed=4)
    # torch -> lucid: torch's keys (module.<name>, n_averaged) load as they are
    theirs, ours, lucid_model = _pair(use_buffers)
    _feed(theirs, ours, lucid_model, steps[:3])
    saved = theirs.state_dict()
    fresh_theirs, fresh, fresh_model = _pair(use_buffers)
    fresh.load_state_dict(saved)
    assert sorted(fresh.state_dict()) == sorted(saved)
    fresh_theirs.load_state_dict(saved)
    _feed(fresh_theirs, fresh, fresh_model, steps[3:])
    _same(fresh_theirs, fresh)
    # lucid -> torch: strict load of lucid's state_dict through to_torch
    theirs, ours, lucid_model = _pair(use_buffers)
    _feed(theirs, ours, lucid_model, steps[:2])
    fresh_theirs = TORCH.AveragedModel(TorchModel(), use_buffers=use_buffers)
    fresh_theirs.load_state_dict(lucid.optim.to_torch(ours.state_dict()))
    _feed(fresh_theirs, ours, lucid_model, steps[2:])
    _same(fresh_theirs, ours)


def test_a_state_dict_that_does_not_fit_raises_as_torch_and_changes_nothing():
    theirs, ours, lucid_model = _pair()
    _feed(theirs, ours, lucid_model, _trajectory(2))
    good = theirs.state_dict()
    missing = {k: v for k, v in good.items() if k != "module.b"}
    extra = {**good, "module.extra": torch.zeros(1)}
    wrong = {**good, "module.w": torch.zeros(2, 3)}
    for bad, words in [
        (missing, "Missing key"),
        (extra, "Unexpected key"),
        (wrong, "size mismatch"),
    ]:
        with pytest.raises(RuntimeError, match=words) as torchs:
            TORCH.AveragedModel(TorchModel()).load_state_dict(bad)
        before = {k: np.asarray(v).copy() for k, v in ours.state_dict().items()}
        with pytest.raises(RuntimeError, match=words) as lucids:
            ours.load_state_dict(bad)
        # torch's words, a shape shown as a tuple (torch.Size([2, 3]) -> (2, 3))
        expected = re.sub(
            r"torch\.Size\(\[([^\]]*)\]\)",
            lambda m: str(tuple(int(x) for x in m.group(1).split(", ") if x)),
            str(torchs.value),
        )
        assert str(lucids.value) == expected
        for k, v in ours.state_dict().items():
            np.testing.assert_array_equal(np.asarray(v), before[k])
    with pytest.raises(RuntimeError, match="non-negative integer"):
        ours.load_state_dict({**good, "n_averaged": torch.tensor(1.5)})


def test_the_positional_state_dict_of_earlier_lucid_versions_loads():
    w = lucid.Parameter(jnp.array([1.0, 2.0]))
    averaged = swa_utils.AveragedModel([w, 7])
    averaged.load_state_dict({"module": [jnp.array([3.0, 4.0]), 7], "n_averaged": 2})
    assert averaged.module[0].data.tolist() == [3.0, 4.0] and int(averaged.n_averaged) == 2
    assert sorted(averaged.state_dict()) == ["module.0", "n_averaged"]
    # a leaf missing: torch's header and the counts, nothing loaded
    with pytest.raises(RuntimeError, match=r"(?s)for AveragedModel:.*'module' holds 1 values"):
        averaged.load_state_dict({"module": [jnp.array([5.0, 6.0])], "n_averaged": 3})
    assert averaged.module[0].data.tolist() == [3.0, 4.0] and int(averaged.n_averaged) == 2


def test_functional_averagers_refuse_other_shapes_and_keep_their_dtype():
    for averager in (LF.averaging.swa(), LF.averaging.ema(0.5)):
        state = averager.init({"w": jnp.zeros(2, jnp.float32)})
        with pytest.raises(ValueError, match=r"params\['w'\] has shape \(3, 2\)"):
            jax.jit(averager.update)({"w": jnp.ones((3, 2), jnp.float32)}, state)
        with pytest.raises(ValueError, match="structure"):
            averager.update({"v": jnp.ones(2)}, state)
        for _ in range(2):
            state = averager.update({"w": jnp.full(2, 1 / 3, jnp.float64)}, state)
        assert state.averaged["w"].dtype == np.float32


def test_n_averaged_lives_with_the_averaged_copy_as_torchs_buffer():
    """torch registers `n_averaged` on the averaged copy's `device`; lucid keeps it there
    through updates and loads (run on 2 host devices in a subprocess)."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, jax.numpy as jnp
        import lucid
        first, second = jax.devices()[:2]
        w = lucid.Parameter(jax.device_put(jnp.ones(3), first))
        avg = lucid.optim.swa_utils.AveragedModel({"w": w}, device=second)
        assert avg.n_averaged.devices() == {second}, avg.n_averaged.devices()
        for _ in range(2):
            avg.update_parameters({"w": w})
        assert avg.n_averaged.devices() == {second}
        assert avg.module["w"].data.devices() == {second}
        avg.load_state_dict(avg.state_dict())
        assert avg.n_averaged.devices() == {second} and int(avg.n_averaged) == 2
        print("OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("JAX_ENABLE_X64", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]


class TiedTorchModel(torch.nn.Module):
    """An encoder and a decoder sharing one weight (tied embeddings), plus a bias."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(2, 3, bias=False)
        self.dec = torch.nn.Linear(2, 3)
        self.dec.weight = self.enc.weight


@pytest.mark.parametrize("kind", ["swa", "ema-multi", "swa-single"])
def test_tied_weights_stay_one_averaged_parameter_as_in_torch(kind):
    """torch's deepcopy keeps the tie and `parameters()` yields it once: one averaged
    Parameter, in both places, and an averaging function that sees it once."""
    theirs_kw, ours_kw = AVERAGERS[kind]
    seen: dict[str, list[int]] = {"torch": [], "lucid": []}

    def counted(kw: dict, side: str) -> dict:
        if "multi_avg_fn" not in kw:
            return kw
        fn = kw["multi_avg_fn"]

        def multi(averaged, current, n):
            seen[side].append(len(averaged))
            return fn(averaged, current, n)

        return {"multi_avg_fn": multi}

    rng = np.random.default_rng(7)
    steps = [(rng.normal(size=(3, 2)), rng.normal(size=(3,))) for _ in range(4)]
    with torch_default_dtype(torch.float64):
        model = TiedTorchModel()
        averaged = TORCH.AveragedModel(model, **counted(theirs_kw, "torch"))
        for weight, bias in steps:
            with torch.no_grad():
                model.enc.weight.copy_(torch.tensor(weight))
                model.dec.bias.copy_(torch.tensor(bias))
            averaged.update_parameters(model)
    w = lucid.Parameter(jnp.zeros((3, 2)))
    ours_model = {"enc": {"weight": w}, "dec": {"weight": w, "bias": lucid.Parameter(jnp.zeros(3))}}
    ours = swa_utils.AveragedModel(ours_model, **counted(ours_kw, "lucid"))
    assert ours.module["enc"]["weight"] is ours.module["dec"]["weight"]
    assert ours.module["enc"]["weight"] is not w
    for weight, bias in steps:
        w.data = jnp.asarray(weight)
        ours_model["dec"]["bias"].data = jnp.asarray(bias)
        ours.update_parameters(ours_model)
    assert seen["lucid"] == seen["torch"]
    saved = ours.state_dict()
    assert sorted(saved) == sorted(averaged.state_dict())
    for key, value in averaged.state_dict().items():
        np.testing.assert_allclose(np.asarray(saved[key]), value.numpy(), rtol=1e-12, err_msg=key)
    averaged.load_state_dict(lucid.optim.to_torch(saved))  # strict: both names, one tensor
    assert averaged.module.enc.weight is averaged.module.dec.weight
    untied = {"enc": {"weight": lucid.Parameter(w.data)}, "dec": dict(ours_model["dec"])}
    with pytest.raises(ValueError, match="one Parameter in the averaged copy"):
        ours.update_parameters(untied)
    assert int(ours.n_averaged) == len(steps)
