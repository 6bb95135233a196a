"""torchao's rules in the compiled step's flat buffers (`Execution.blocks`), against torchao
0.18 itself on CPU (TorchDynamo off, as `test_torchao` runs it).

A quantized moment is blocks of ``block_size`` elements, each scaled on its own, so the
compiled step lays a group's quantized parameters end to end (told to stay quantized:
the buffer's total size is not what decides) and its full-precision ones end to end
(told not to be): two buffers per group, one program call over them, instead of several
arrays per parameter. A 4-bit buffer holds two codes a byte and one scale per block, so
its fields are cut per 2 and per ``block_size`` elements. These tests check that the
layout changes no number: parameters of every kind in two groups give torchao's
parameters, codes and scales (the same one-code-at-a-boundary bound `test_torchao`
derives); the flat step is the per-parameter step bit for bit; bfloat16 parameters (a
random key each) and parameters under 4096 elements are laid out as torchao decides;
a state_dict taken from flat buffers is torchao's format and resumes in torchao and in
lucid.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from _flat_stores import stores_of
from test_torchao import NAMES, _grads, _init, check_match, run_both, torch

import lucid
import lucid.optim.torchao as LO
from lucid._platform import FLAT_EXACT

ao = pytest.importorskip("torchao.optim")

# quantized (>= 4096 elements, whole blocks of 256 and 128), full precision (small, or no
# multiple of the block); the first five in group 0, the rest in group 1, whose two
# full-precision ones (50 + 4046 elements) fill a buffer torchao's size rule would quantize
SHAPES = [(64, 64), (3, 5), (32, 256), (4100,), (2, 4096), (50,), (4096,), (16, 512), (4046,)]
GROUPS = [{"params": [0, 1, 2, 3, 4]}, {"params": [5, 6, 7, 8], "lr": 5e-3, "weight_decay": 0.2}]
QUANTIZED = [0, 2, 4, 6, 7]
OPTIONS = {"lr": 1e-2, "weight_decay": 0.1}
# per group, one buffer of quantized and one of full-precision parameters; with jax 0.4
# every parameter alone (`FLAT_EXACT`, `Execution.fusion_sensitive`: the fused step moved off
# the eager numbers there)
STORES = 4 if FLAT_EXACT else len(SHAPES)
FLAT_ONLY = pytest.mark.skipif(not FLAT_EXACT, reason="no flat buffers with this jax")


def _grouped(params: list) -> list:
    return [{**g, "params": [params[i] for i in g["params"]]} for g in GROUPS]


def _lucid_run(name, shapes, steps, compiled, dtype="float32", options=OPTIONS):
    init, grads = _init(shapes), _grads(shapes, steps)
    params = [lucid.Parameter(jnp.asarray(x, dtype)) for x in init]
    opt = getattr(LO, name)(_grouped(params), **options)
    runner = lucid.compile_optimizer(opt) if compiled else opt
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = jnp.asarray(g, dtype)
        runner.step()
    return opt, params


@pytest.mark.parametrize("name", NAMES)
def test_flat_buffers_give_torchaos_numbers_for_parameters_of_any_size(name):
    tparams, lparams, t_opt, l_opt, tracker = run_both(
        name, OPTIONS, shapes=SHAPES, steps=8, groups=GROUPS, compiled=True
    )
    check_match(tparams, lparams, t_opt, l_opt, tracker, OPTIONS, steps=8)
    # they did share buffers: per group, the quantized ones in one, the others in another
    assert len(stores_of(lparams)) == STORES


@pytest.mark.parametrize("name", NAMES)
def test_the_flat_step_is_the_per_parameter_step_bit_for_bit(name):
    e_opt, e_params = _lucid_run(name, SHAPES, 5, compiled=False)
    c_opt, c_params = _lucid_run(name, SHAPES, 5, compiled=True)
    for e, c in zip(e_params, c_params):
        np.testing.assert_array_equal(np.asarray(c.data), np.asarray(e.data))
    chex.assert_trees_all_equal(c_opt.state_dict()["state"], e_opt.state_dict()["state"])


@FLAT_ONLY
def test_a_4bit_buffer_holds_two_codes_a_byte_and_a_scale_per_block_for_each_parameter():
    opt, params = _lucid_run("AdamW4bit", SHAPES, 2, compiled=True)
    members = [params[i] for i in QUANTIZED if i < 5]
    (store,) = stores_of(members)
    assert store.layout.align == 128
    assert store.layout.sizes == tuple(p.data.size for p in members)
    np.testing.assert_array_equal(
        np.asarray(store.values), np.concatenate([np.asarray(p.data).ravel() for p in members])
    )
    saved = opt.state_dict()["state"]
    for p in members:
        index = params.index(p)
        for moment in ("exp_avg", "exp_avg_sq"):
            assert saved[index][moment]["codes"].shape == (p.data.size // 2,)
            assert saved[index][moment]["scale"].shape == (p.data.size // 128,)


def test_bfloat16_parameters_keep_their_own_random_key_and_stay_alone():
    """Stochastic rounding draws from each parameter's own key: the compiled step keeps
    each quantized bfloat16 parameter alone and draws what the eager step draws."""
    options = {**OPTIONS, "bf16_stochastic_round": True}
    runs = [
        _lucid_run("AdamW8bit", SHAPES, 3, compiled, dtype="bfloat16", options=options)
        for compiled in (False, True)
    ]
    (_, eager), (_, compiled) = runs
    assert len(stores_of([compiled[i] for i in QUANTIZED])) == len(QUANTIZED)
    for e, c in zip(eager, compiled):
        assert c.data.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(c.data), np.asarray(e.data))


def test_a_state_dict_of_flat_buffers_resumes_in_torchao_and_in_lucid():
    """A checkpoint of the flat buffers is torchao's per-parameter format: it loads into
    torchao and into a new compiled lucid optimizer, and both go on as the run that was
    not interrupted."""
    name, steps = "AdamW4bit", 8
    init, grads = _init(SHAPES), _grads(SHAPES, steps)
    l_params = [lucid.Parameter(jnp.asarray(x)) for x in init]
    l_opt = getattr(LO, name)(_grouped(l_params), **OPTIONS)
    runner = lucid.compile_optimizer(l_opt)

    def step(params, opt_step, gs, as_grad):
        for p, g in zip(params, gs):
            p.grad = as_grad(g)
        opt_step()

    for gs in grads[:4]:
        step(l_params, runner.step, gs, jnp.asarray)
    saved = l_opt.state_dict()
    t_params = [torch.nn.Parameter(torch.tensor(np.asarray(p.data))) for p in l_params]
    t_opt = getattr(ao, name)(_grouped(t_params), lr=0.5)
    t_opt.load_state_dict(LO.to_torchao(saved))
    r_params = [lucid.Parameter(jnp.asarray(np.asarray(p.data))) for p in l_params]
    r_opt = getattr(LO, name)(_grouped(r_params), lr=0.5)
    r_opt.load_state_dict(saved)
    resumed = lucid.compile_optimizer(r_opt)
    for gs in grads[4:]:
        step(l_params, runner.step, gs, jnp.asarray)
        step(r_params, resumed.step, gs, jnp.asarray)
        step(t_params, t_opt.step, gs, torch.tensor)
    for lp, rp, tp in zip(l_params, r_params, t_params):
        np.testing.assert_array_equal(np.asarray(rp.data), np.asarray(lp.data))
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=1e-5)
    chex.assert_trees_all_equal(r_opt.state_dict()["state"], l_opt.state_dict()["state"])
    assert len(stores_of(r_params)) == STORES
