"""bitsandbytes' rules in the compiled step's flat buffers (`Execution.blocks`), against
bitsandbytes 0.50 itself on CPU.

An 8-bit state is blocks of 256 elements, each quantized on its own, so the compiled
step lays a group's 8-bit parameters of whole blocks end to end, and its 32-bit ones
end to end: two buffers per group, one program call over them (on a GPU, one fused
kernel), instead of seven arrays per parameter. These tests check that the layout
changes no number: a group's parameters of whole blocks, of a partial last block
(alone) and under `min_8bit_size`, with infinite and NaN gradients, give
bitsandbytes' parameters, codes and absmax; their state_dicts are cut back out per
parameter in bitsandbytes' format and load back into the flat buffers; rules that
reduce over a parameter (LAMB's and LARS's trust ratio, AdEMAMix's stacked moments)
keep each parameter alone.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from _flat_stores import stores_of
from test_bnb import PARAM_ATOL, assert_non_finite_state_alike, assert_states_match

import lucid
import lucid.optim.bnb as LB
from lucid.optim._engine.layout import Layout

bnb = pytest.importorskip("bitsandbytes")

warnings.filterwarnings("ignore", message=".*kernels.*")

# per group: whole blocks (one of exactly min_8bit_size), a partial last block (alone),
# under min_8bit_size (32-bit state)
SHAPES = [(256, 48), (100, 300), (64, 64), (50,), (5000,), (4096,)]
SHAPES += [(33, 129), (7,), (128, 96), (16, 16), (40, 256)]
WHOLE = [i for i, s in enumerate(SHAPES) if np.prod(s) >= 4096 and np.prod(s) % 256 == 0]
STEPS = 8

CASES = [
    ("AdamW8bit", {"lr": 1e-3, "weight_decay": 0.01}),
    ("Adam8bit", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6}),
    ("Lion8bit", {"lr": 1e-3, "weight_decay": 0.1}),
    ("SGD8bit", {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.01}),
    ("RMSprop8bit", {"lr": 1e-3, "alpha": 0.9}),
    ("Adagrad8bit", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-3}),  # 32-bit state: elementwise, one flat buffer per group
]


def _data(seed: int = 0, non_finite: bool = False):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [
        [0.1 * rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)
    ]
    if non_finite:  # in parameters that share a buffer with others
        grads[2][2][10, 3] = np.inf  # (64, 64): its block 2
        grads[4][5][4095] = np.nan  # (4096,): its last block
        grads[3][8][127, 95] = np.inf  # (128, 96), in the second group: its last block
    return init, grads


def _groups(params):
    """Two groups, each with parameters of every kind: the second at half the lr."""
    return [{"params": params[:6]}, {"params": params[6:], "lr": 5e-4}]


def _torch_run(name, kwargs, init, grads):
    params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in init]
    opt = getattr(bnb.optim, name)(_groups(params), **kwargs)
    for g in grads:
        for p, x in zip(params, g):
            p.grad = torch.from_numpy(x.copy())
        opt.step()
    return opt, params


def _lucid_run(name, kwargs, init, grads, compiled=True):
    params = [lucid.Parameter(jnp.asarray(x)) for x in init]
    opt = getattr(LB, name)(_groups(params), **kwargs)
    runner = lucid.compile_optimizer(opt) if compiled else opt
    for g in grads:
        for p, x in zip(params, g):
            p.grad = jnp.asarray(x)
        runner.step()
    return opt, params


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[n for n, _ in CASES])
def test_flat_buffers_give_bitsandbytes_numbers_for_parameters_of_any_size(name, kwargs):
    init, grads = _data()
    t_opt, t_params = _torch_run(name, kwargs, init, grads)
    l_opt, l_params = _lucid_run(name, kwargs, init, grads)
    for tp, lp in zip(t_params, l_params):
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL)
        assert_states_match(name, t_opt.state[tp], l_opt.state[lp])


@pytest.mark.parametrize("name", ["AdamW8bit", "SGD8bit", "Lion8bit"])
def test_infinite_and_nan_gradients_spoil_only_their_own_blocks_as_in_bitsandbytes(name):
    """An infinite or NaN gradient in a parameter that shares a buffer spoils the blocks
    bitsandbytes' spoils, in that parameter only: its neighbours' numbers are theirs.
    (Lion's sign is torch's, 0 for NaN: the parameter keeps its value there.)"""
    kwargs = {"lr": 1e-2, "momentum": 0.9} if name == "SGD8bit" else {"lr": 1e-3}
    init, grads = _data(1, non_finite=True)
    t_opt, t_params = _torch_run(name, kwargs, init, grads)
    l_opt, l_params = _lucid_run(name, kwargs, init, grads)
    for tp, lp in zip(t_params, l_params):
        theirs, ours = tp.detach().numpy(), np.asarray(lp.data)
        np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
        np.testing.assert_allclose(ours, theirs, atol=PARAM_ATOL, equal_nan=True)
        assert_non_finite_state_alike(t_opt.state[tp], l_opt.state[lp])
    for index in set(WHOLE) - {2, 5, 8}:  # their neighbours in the buffers: untouched
        assert np.isfinite(np.asarray(l_params[index].data)).all()
        assert np.isfinite(np.asarray(l_opt.state[l_params[index]]["absmax1"])).all()
    assert len(stores_of([l_params[i] for i in WHOLE])) == 2  # they shared two buffers


@pytest.mark.parametrize(
    ("name", "expected"),
    [("AdamW8bit", 7), ("Adam", 2), ("LAMB8bit", len(SHAPES)), ("AdEMAMix8bit", len(SHAPES))],
)
def test_a_group_keeps_one_buffer_per_state_width_and_rules_over_whole_parameters_stay_alone(
    name, expected
):
    """Each group: its 8-bit parameters of whole blocks in one buffer, its 32-bit ones
    in another, each of a partial last block alone (one buffer a group for a 32-bit
    optimizer); a trust ratio or AdEMAMix: one per parameter."""
    init, grads = _data()
    _, params = _lucid_run(name, {"lr": 1e-3}, init, grads[:1])
    assert len(stores_of(params)) == expected


def test_a_flat_buffer_holds_its_parameters_end_to_end_and_their_absmax_per_block():
    init, grads = _data()
    l_opt, params = _lucid_run("AdamW8bit", {"lr": 1e-3}, init, grads)
    members = [params[i] for i in WHOLE if i < 6]
    (store,) = {id(p.location[0]): p.location[0] for p in members}.values()
    assert store.layout.align == 256
    assert store.layout.sizes == tuple(p.data.size for p in members)
    buffer = np.asarray(store.values)
    assert buffer.size == sum(store.layout.sizes)
    end_to_end = np.concatenate([np.asarray(p.data).ravel() for p in members])
    np.testing.assert_array_equal(buffer, end_to_end)
    for p in members:
        state = l_opt.state[p]
        assert state["state1"].shape == p.data.shape
        assert state["absmax1"].shape == (p.data.size // 256,)


def test_a_state_dict_of_flat_buffers_resumes_with_the_per_parameter_numbers():
    """A checkpoint taken from the flat buffers is bitsandbytes' per-parameter format: it
    loads into a bitsandbytes optimizer and into a new compiled lucid one, and both go on
    as the run that was not interrupted."""
    name, kwargs = "AdamW8bit", {"lr": 1e-3}
    init, grads = _data(2)
    l_opt, l_params = _lucid_run(name, kwargs, init, grads[:4])
    saved = l_opt.state_dict()
    # bitsandbytes resumes from lucid's flat-buffer checkpoint
    t_params = [torch.nn.Parameter(torch.from_numpy(np.asarray(p.data).copy())) for p in l_params]
    t_opt = getattr(bnb.optim, name)(_groups(t_params), **kwargs)
    t_opt.load_state_dict(lucid.optim.to_torch(saved))
    # lucid resumes into new flat buffers
    r_params = [lucid.Parameter(jnp.asarray(np.asarray(p.data))) for p in l_params]
    r_opt = getattr(LB, name)(_groups(r_params), **kwargs)
    r_opt.load_state_dict(saved)
    resumed = lucid.compile_optimizer(r_opt)
    runner = lucid.compile_optimizer(l_opt)
    for g in grads[4:]:
        for ps in (l_params, r_params):
            for p, x in zip(ps, g):
                p.grad = jnp.asarray(x)
        for p, x in zip(t_params, g):
            p.grad = torch.from_numpy(x.copy())
        runner.step()
        resumed.step()
        t_opt.step()
    for lp, rp, tp in zip(l_params, r_params, t_params):
        np.testing.assert_array_equal(np.asarray(rp.data), np.asarray(lp.data))
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL)
        assert_states_match(name, t_opt.state[tp], r_opt.state[rp])


def test_an_edit_of_the_static_options_lays_the_parameters_out_again():
    """``optim_bits`` 32 in a group that had none (the next parameters' new states are
    32-bit) moves nothing already stepped and keeps the numbers of an eager run."""
    init, grads = _data(3)
    runs = []
    for compiled in (False, True):
        params = [lucid.Parameter(jnp.asarray(x)) for x in init]
        opt = LB.Adam(_groups(params), lr=1e-3, optim_bits=8)
        runner = lucid.compile_optimizer(opt) if compiled else opt
        for step, g in enumerate(grads):
            if step == 3:
                opt.param_groups[1]["min_8bit_size"] = 10**6  # new states: 32-bit
                new = lucid.Parameter(jnp.ones((64, 64), jnp.float32))
                opt.param_groups[1]["params"].append(new)
                params.append(new)
            for p, x in zip(params, [*g, np.full((64, 64), 0.1, np.float32)]):
                p.grad = jnp.asarray(x)
            runner.step()
        runs.append((opt, params))
    (_e_opt, e_params), (c_opt, c_params) = runs
    assert "absmax1" not in c_opt.state[c_params[-1]]
    assert "absmax1" in c_opt.state[c_params[0]]
    for ep, cp in zip(e_params, c_params):
        np.testing.assert_allclose(np.asarray(cp.data), np.asarray(ep.data), atol=1e-6)


def test_a_layout_of_blocks_cuts_a_per_block_buffer_per_parameter():
    shapes = ((3, 256), (256,), (2, 2, 128))
    layout = Layout(True, 1, tuple(int(np.prod(s)) for s in shapes), shapes, 256)
    per_block = layout.per(256)
    assert per_block.sizes == (3, 1, 2) and per_block.shapes == ((3,), (1,), (2,))
    absmax = jnp.arange(6, dtype=jnp.float32)
    pieces = [np.asarray(x).tolist() for x in per_block.split(absmax)]
    assert pieces == [[0.0, 1.0, 2.0], [3.0], [4.0, 5.0]]
    np.testing.assert_array_equal(np.asarray(per_block.join(per_block.split(absmax))), absmax)
    assert layout.per(2).sizes == (384, 128, 256)  # two 4-bit codes a byte
    with pytest.raises(ValueError, match="one entry per 512"):
        layout.per(512)
