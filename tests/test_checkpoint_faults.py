"""lucid.optim.checkpoint beyond the common case: empty and absent state, L-BFGS, zero-size
parameters, Python values, your own Optimizer subclass; a failed save that leaves the previous
checkpoint and the path usable; corrupted files caught by their checksums; every error in
lucid's words. Checkpoints read back into torch's optimizers where torch has the class."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

checkpoint = pytest.importorskip("lucid.optim.checkpoint")
pytest.importorskip("orbax.checkpoint")

RNG = np.random.default_rng(7)
SHAPES = [(3, 2), (4,)]
INIT = [RNG.normal(size=s) for s in SHAPES]
GRADS = [[RNG.normal(size=s) for s in SHAPES] for _ in range(3)]


def _pair(cls_name, kwargs, shapes=SHAPES, init=INIT):
    params = [lucid.Parameter(jnp.asarray(v, jnp.float64)) for v in init[: len(shapes)]]
    tparams = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in init]
    opt = getattr(lucid.optim, cls_name)(params, **kwargs)
    topt = getattr(torch.optim, cls_name)(tparams[: len(shapes)], **kwargs)
    return params, opt, tparams[: len(shapes)], topt


def _step(params, opt, tparams, topt, grads):
    for p, tp, g in zip(params, tparams, grads):
        p.grad = jnp.asarray(g)
        tp.grad = torch.tensor(g)
    opt.step()
    topt.step()


def _same_state_dicts(ours, expected):
    """Two lucid state_dicts (the second as saved) equal, Python types included."""
    assert ours["param_groups"] == expected["param_groups"]
    assert list(ours["state"]) == list(expected["state"])
    for key, entry in expected["state"].items():
        assert list(ours["state"][key]) == list(entry), key
        for name, value in entry.items():
            got = ours["state"][key][name]
            assert type(got) is type(value) or (
                isinstance(got, np.ndarray | jnp.ndarray)
                and isinstance(value, np.ndarray | jnp.ndarray)
            ), (name, type(got), type(value))
            if isinstance(value, list | tuple):
                assert len(got) == len(value)
                for a, b in zip(got, value):
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            else:
                np.testing.assert_array_equal(np.asarray(got), np.asarray(value))
                assert np.asarray(got).dtype == np.asarray(value).dtype


CASES = {
    "SGD without momentum (no state)": ("SGD", {"lr": 0.1}, 2),
    "Adam before its first step": ("Adam", {"lr": 0.1}, 0),
    "Adam": ("Adam", {"lr": 0.1, "amsgrad": True}, 2),
    "ASGD (float state)": ("ASGD", {"lr": 0.05}, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_save_restore_and_torch_continue_as_the_uninterrupted_run(case, tmp_path):
    cls_name, kwargs, steps = CASES[case]
    params, opt, tparams, topt = _pair(cls_name, kwargs)
    for grads in GRADS[:steps]:
        _step(params, opt, tparams, topt, grads)
    path = tmp_path / "ckpt"
    checkpoint.save(path, opt)
    _same_state_dicts(checkpoint.load(path), opt.state_dict())
    # restore into a fresh optimizer with the same values: it continues as the original
    fresh_params = [lucid.Parameter(p.data) for p in params]
    fresh = getattr(lucid.optim, cls_name)(fresh_params, lr=0.9)
    checkpoint.restore(path, fresh)
    _same_state_dicts(fresh.state_dict(), opt.state_dict())
    # and torch's optimizer takes the checkpoint as it is
    fresh_tparams = [torch.tensor(np.asarray(p.data), requires_grad=True) for p in params]
    fresh_topt = getattr(torch.optim, cls_name)(fresh_tparams, lr=0.9)
    fresh_topt.load_state_dict(checkpoint.load(path, as_torch=True))
    for grads in GRADS[steps:]:
        _step(fresh_params, fresh, fresh_tparams, fresh_topt, grads)
        _step(params, opt, tparams, topt, grads)
    for p, q, tp in zip(fresh_params, params, fresh_tparams):
        np.testing.assert_array_equal(np.asarray(p.data), np.asarray(q.data))
        np.testing.assert_allclose(np.asarray(p.data), tp.detach().numpy(), rtol=1e-12)


def test_a_zero_size_parameter_saves_and_restores(tmp_path):
    shapes, init = [(0, 3), (4,)], [np.zeros((0, 3)), INIT[1]]
    params, opt, tparams, topt = _pair("Adam", {"lr": 0.1}, shapes, init)
    _step(params, opt, tparams, topt, [np.zeros((0, 3)), GRADS[0][1]])
    checkpoint.save(tmp_path / "ckpt", opt)
    saved = checkpoint.load(tmp_path / "ckpt")
    assert saved["state"][0]["exp_avg"].shape == (0, 3)
    _same_state_dicts(saved, opt.state_dict())
    fresh = lucid.optim.Adam([lucid.Parameter(p.data) for p in params])
    checkpoint.restore(tmp_path / "ckpt", fresh)
    _same_state_dicts(fresh.state_dict(), opt.state_dict())
    topt2 = torch.optim.Adam([torch.zeros(0, 3, dtype=torch.float64), tparams[1].detach()])
    topt2.load_state_dict(checkpoint.load(tmp_path / "ckpt", as_torch=True))
    assert topt2.state_dict()["state"][0]["exp_avg"].shape == (0, 3)


def test_lbfgs_lists_and_numbers_save_restore_and_continue(tmp_path):
    target = jnp.asarray(INIT[0])

    def loss_fn(w):
        return jnp.sum((w - target) ** 2 * jnp.arange(1.0, 7.0).reshape(3, 2))

    def run(w, opt, steps):
        def closure():
            opt.zero_grad()
            return lucid.backward(loss_fn, w)

        return [float(opt.step(closure)) for _ in range(steps)]

    w = lucid.Parameter(jnp.zeros((3, 2), jnp.float64))
    opt = lucid.optim.LBFGS([w], max_iter=3, history_size=4)
    run(w, opt, 2)
    saved_state = opt.state_dict()
    assert isinstance(saved_state["state"][0]["old_dirs"], list)
    checkpoint.save(tmp_path / "lbfgs", opt)
    _same_state_dicts(checkpoint.load(tmp_path / "lbfgs"), saved_state)
    w2 = lucid.Parameter(w.data)
    opt2 = lucid.optim.LBFGS([w2], max_iter=3, history_size=4)
    checkpoint.restore(tmp_path / "lbfgs", opt2)
    assert run(w2, opt2, 2) == run(w, opt, 2)
    np.testing.assert_array_equal(np.asarray(w2.data), np.asarray(w.data))
    # torch's L-BFGS takes it too
    tw = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    topt = torch.optim.LBFGS([tw], max_iter=3, history_size=4)
    topt.load_state_dict(checkpoint.load(tmp_path / "lbfgs", as_torch=True))
    assert topt.state_dict()["state"][0]["n_iter"] == saved_state["state"][0]["n_iter"]


class Counting(lucid.optim.Optimizer):
    """Your own optimizer: state of every kind a state_dict may hold."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.99)})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.data = p.data - group["lr"] * p.grad
                state = self.state[p]
                state["steps"] = state.get("steps", 0) + 1
                state["last"] = p.grad
                state["counts"] = jnp.arange(3, dtype=jnp.int32) * state["steps"]
                state["history"] = [*state.get("history", []), float(jnp.sum(p.grad))]
                state["meta"] = {"tag": "w", "scale": None, "pair": (1, 2.5), "inf": float("inf")}
                state["flag"] = True


def test_your_own_optimizer_subclass_with_python_and_integer_state(tmp_path):
    params = [lucid.Parameter(jnp.asarray(v)) for v in INIT]
    opt = Counting(params)
    for grads in GRADS[:2]:
        for p, g in zip(params, grads):
            p.grad = jnp.asarray(g)
        opt.step()
    checkpoint.save(tmp_path / "own", opt)
    saved = checkpoint.load(tmp_path / "own")
    expected = opt.state_dict()
    assert saved["param_groups"][0]["betas"] == (0.9, 0.99)  # a tuple, as it was
    for key, entry in expected["state"].items():
        assert saved["state"][key]["meta"] == entry["meta"]
        assert saved["state"][key]["history"] == entry["history"]
        assert saved["state"][key]["steps"] == 2 and type(saved["state"][key]["steps"]) is int
        assert saved["state"][key]["flag"] is True
        assert saved["state"][key]["counts"].dtype == np.int32
    fresh = Counting([lucid.Parameter(p.data) for p in params], lr=0.5)
    checkpoint.restore(tmp_path / "own", fresh)
    assert fresh.param_groups[0]["lr"] == 0.1
    state = fresh.state_dict()["state"]
    np.testing.assert_array_equal(
        np.asarray(state[1]["last"]), np.asarray(expected["state"][1]["last"])
    )
    assert state[0]["meta"] == expected["state"][0]["meta"]


# ------------------------------------------------------------------- failed saves
def _adam(tmp_path, lr=0.1):
    params = [lucid.Parameter(jnp.asarray(v)) for v in INIT]
    opt = lucid.optim.Adam(params, lr=lr)
    for p, g in zip(params, GRADS[0]):
        p.grad = jnp.asarray(g)
    opt.step()
    return params, opt


def _leftovers(tmp_path):
    return sorted(name for name in os.listdir(tmp_path) if name.startswith("."))


def test_a_save_to_an_existing_checkpoint_needs_overwrite_and_a_failed_one_keeps_the_old(
    tmp_path, monkeypatch
):
    _, opt = _adam(tmp_path)
    path = tmp_path / "ckpt"
    checkpoint.save(path, opt)
    old = checkpoint.load(path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        checkpoint.save(path, opt)
    opt.param_groups[0]["lr"] = 0.5

    # a failure after orbax wrote the arrays (a disk error while sealing): the old one stays
    def broken(root):
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint, "_digests", broken)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(path, opt, overwrite=True)
    monkeypatch.undo()
    assert _leftovers(tmp_path) == []
    _same_state_dicts(checkpoint.load(path), old)
    # orbax itself failing: lucid's words, nothing left, the old checkpoint intact
    import orbax.checkpoint as ocp

    def failing_save(self, directory, *args, **kwargs):
        os.makedirs(directory)
        raise ValueError("simulated orbax failure")

    monkeypatch.setattr(ocp.Checkpointer, "save", failing_save)
    with pytest.raises(RuntimeError, match="orbax-checkpoint could not write the arrays"):
        checkpoint.save(path, opt, overwrite=True)
    monkeypatch.undo()
    assert _leftovers(tmp_path) == []
    _same_state_dicts(checkpoint.load(path), old)
    # the path is usable: the next save replaces the old checkpoint
    checkpoint.save(path, opt, overwrite=True)
    assert checkpoint.load(path)["param_groups"][0]["lr"] == 0.5
    assert _leftovers(tmp_path) == []


def test_what_a_killed_save_left_behind_does_not_break_the_next_save(tmp_path):
    _, opt = _adam(tmp_path)
    junk = tmp_path / ".ckpt.lucid-partial" / "checkpoint" / "arrays.orbax-checkpoint-tmp"
    junk.mkdir(parents=True)
    (junk / "half-written").write_bytes(b"\0" * 10)
    checkpoint.save(tmp_path / "ckpt", opt)
    assert _leftovers(tmp_path) == []
    _same_state_dicts(checkpoint.load(tmp_path / "ckpt"), opt.state_dict())


def test_a_value_no_checkpoint_can_hold_is_named_before_anything_is_written(tmp_path):
    params = [lucid.Parameter(jnp.asarray(v)) for v in INIT]
    opt = Counting(params)
    opt.state[params[1]]["callback"] = print
    with pytest.raises(TypeError, match=r"state\[1\]\['callback'\] is of type builtin_function"):
        checkpoint.save(tmp_path / "ckpt", opt)
    del opt.state[params[1]]["callback"]
    opt.state[params[0]]["names"] = np.array(["a", "b"])
    with pytest.raises(TypeError, match=r"state\[0\]\['names'\] is an array of dtype <U1"):
        checkpoint.save(tmp_path / "ckpt", opt)
    del opt.state[params[0]]["names"]
    opt.param_groups[0]["schedule"] = object()
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['schedule'\] is of type object"):
        checkpoint.save(tmp_path / "ckpt", opt)
    assert os.listdir(tmp_path) == []


# -------------------------------------------------------------------- corruption
def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_file_raises_an_error_naming_it_and_changes_nothing(tmp_path):
    _, opt = _adam(tmp_path)
    path = tmp_path / "ckpt"
    checkpoint.save(path, opt)
    files = sorted((p for p in (path / "arrays").rglob("*") if p.is_file()), key=os.path.getsize)
    victim = files[-1]  # the largest file: the arrays' bytes
    _flip_a_byte(victim)
    _, fresh = _adam(tmp_path, lr=0.7)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=f"{victim.name} is corrupted"):
        checkpoint.restore(path, fresh)
    _same_state_dicts(fresh.state_dict(), before)
    with pytest.raises(ValueError, match=f"{victim.name} is corrupted"):
        checkpoint.load(path)
    victim.unlink()
    with pytest.raises(ValueError, match=f"the file .*{victim.name} is missing"):
        checkpoint.load(path)


def test_a_corrupted_or_absent_manifest_and_a_missing_checkpoint_are_errors_in_words(tmp_path):
    _, opt = _adam(tmp_path)
    path = tmp_path / "ckpt"
    checkpoint.save(path, opt)
    manifest = path / checkpoint.MANIFEST
    text = manifest.read_text()
    manifest.write_text(text.replace('"lr": 0.1', '"lr": 0.2'))
    with pytest.raises(ValueError, match=f"{checkpoint.MANIFEST} is corrupted"):
        checkpoint.load(path)
    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=f"{checkpoint.MANIFEST} is corrupted"):
        checkpoint.load(path)
    manifest.unlink()
    with pytest.raises(ValueError, match=r"not written by lucid\.optim\.checkpoint\.save"):
        checkpoint.restore(path, opt)
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        checkpoint.load(tmp_path / "nothing here")
    with pytest.raises(FileExistsError, match="not a lucid checkpoint"):
        checkpoint.save(path, opt, overwrite=True)
