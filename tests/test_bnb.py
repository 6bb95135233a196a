"""bitsandbytes' optimizers against bitsandbytes 0.50 itself, on CPU, in float32.

The oracle is bitsandbytes' CPU backend: its 8-bit block-wise kernel (dequantize, the
rule in PyTorch ops, quantize with its 65536-bin table) and its 32-bit kernel.

* **Quantization**: the dynamic maps are bitsandbytes' bit for bit, and quantizing and
  dequantizing give its codes and absmax exactly, on values of every magnitude, zero
  blocks, NaN and partial blocks.
* **Trajectories**: 20 steps of every family and option, two parameter groups, one
  parameter on the 8-bit path (a (64, 129) matrix: 33 blocks, the last partial) and one
  under `min_8bit_size` (32-bit state). The stored codes must equal bitsandbytes'. A
  code may differ only where a state value lands within float32 rounding of a table bin
  edge and the two float32 computations of it round differently (XLA and PyTorch may
  fuse a multiply-add differently): we allow at most 0.1% of the codes to differ, each by
  one code (measured: none differ). Dequantized states and float32 parameters agree to
  float32 rounding; the tolerance, `1e-5` absolute on parameters of size ~1, also covers
  one flipped code (one code step, ~1% of a state value, times lr <= 1e-2, over a few
  steps).
* **Checkpoints** both ways in bitsandbytes' format, the functional form under
  `jax.jit`, `compile_optimizer` (same numbers as eager), the stored size, bitsandbytes'
  signatures and errors (type, message and moment).
"""

from __future__ import annotations

import inspect
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import lucid
import lucid.functional as LF
import lucid.optim.bnb as LB
from lucid.functional.bnb import dequantize_blockwise, dynamic_map, quantize_blockwise
from lucid.optim._registry import entry_of, registered

bnb = pytest.importorskip("bitsandbytes")
bnbF = pytest.importorskip("bitsandbytes.functional")

warnings.filterwarnings("ignore", message=".*kernels.*")

STEPS = 20
BIG = (64, 129)  # 8256 elements: 8-bit state, 33 blocks of 256 (the last one partial)
SMALL = (10, 10)  # under min_8bit_size: 32-bit state
PARAM_ATOL = 1e-5
STATE_RTOL = 1e-5
CODE_SHARE = 1e-3  # codes allowed to differ (by one), at float32 rounding of a bin edge


# ---------------------------------------------------------------------- quantization
@pytest.mark.parametrize("signed", [True, False])
def test_the_dynamic_maps_are_bitsandbytes_bit_for_bit(signed):
    ours = dynamic_map(signed)
    theirs = bnbF.create_dynamic_map(signed=signed).numpy()
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_and_dequantize_blockwise_equal_bitsandbytes(signed):
    rng = np.random.default_rng(1 if signed else 2)
    code = bnbF.create_dynamic_map(signed=signed)
    total = 0
    for n in (1, 3000):
        x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-9, 3, n)).astype(np.float32)
        if not signed:
            x = np.abs(x)
        if n >= 3000:
            x[:256] = 0.0  # a block of zeros
            x[300] = np.nan
            x[700:712] = x[700]  # ties
        codes, absmax = quantize_blockwise(jnp.asarray(x), signed)
        theirs, state = bnbF.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=256)
        assert codes.dtype == jnp.uint8 and absmax.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(codes), theirs.numpy())
        np.testing.assert_array_equal(np.asarray(absmax), state.absmax.numpy())
        values = bnbF.dequantize_blockwise(theirs, absmax=state.absmax, code=code, blocksize=256)
        ours = dequantize_blockwise(theirs.numpy(), state.absmax.numpy(), signed)
        np.testing.assert_array_equal(np.asarray(ours), values.numpy())
        total += n
    assert total > 3000


@pytest.mark.parametrize("chunk", [64, 7, 200])
def test_in_chunks_gives_the_whole_arrays_numbers(chunk):
    """`in_chunks` (the CPU's loop over chunks of blocks, then the remainder) quantizes
    exactly as one call on the whole array does, values of every magnitude and NaN."""
    from lucid.functional._lowbit.chunks import in_chunks

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((131, 256)) * 10.0 ** rng.integers(-8, 3, (131, 1))).astype(np.float32)
    x[7, 3] = np.nan
    x[40] = 0.0
    x = jnp.asarray(x)
    state = (jnp.zeros((131, 256), jnp.uint8), jnp.zeros((131,), jnp.float32))
    run = jax.jit(
        lambda x, state: in_chunks(quantize_step, x, x, *state, block_size=256, chunk=chunk)
    )
    _, codes, absmax = run(x, state)
    want_codes, want_absmax = quantize_blockwise(x)
    np.testing.assert_array_equal(np.asarray(codes), np.asarray(want_codes))
    np.testing.assert_array_equal(np.asarray(absmax), np.asarray(want_absmax))


def quantize_step(p, g, codes, absmax):
    return (p, *quantize_blockwise(g))


def test_quantize_blockwise_keeps_the_shape_and_jits():
    x = jnp.linspace(-3.0, 2.0, 600, dtype=jnp.float32).reshape(20, 30)
    codes, absmax = jax.jit(quantize_blockwise)(x)
    assert codes.shape == (20, 30) and absmax.shape == (3,)
    back = dequantize_blockwise(codes, absmax)
    # one code step of the dynamic map near 1 is 1/64 of the block's absmax
    chex.assert_trees_all_close(back, x, atol=3.0 / 64)


# ---------------------------------------------------------------------- trajectories
CASES = [
    ("Adam8bit", {"lr": 1e-3}),
    ("Adam8bit", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("Adam8bit", {"lr": 1e-3, "min_8bit_size": 10000}),  # both parameters in 32 bits
    ("AdamW8bit", {}),
    ("PagedAdamW8bit", {"lr": 2e-3}),
    ("PagedAdam8bit", {"is_paged": True}),
    ("Adam", {"optim_bits": 8, "weight_decay": 0.01}),
    ("Adam", {"lr": 1e-2}),
    ("AdamW32bit", {"weight_decay": 0.05}),
    ("PagedAdamW", {}),
    ("Lion8bit", {"lr": 1e-3, "weight_decay": 0.1}),
    ("Lion", {"lr": 1e-3, "betas": (0.95, 0.98)}),
    ("PagedLion8bit", {}),
    ("SGD8bit", {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 1e-2, "momentum": 0.5, "optim_bits": 8}),
    ("SGD32bit", {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "dampening": 0.1}),
    ("RMSprop8bit", {"lr": 1e-3, "alpha": 0.9, "weight_decay": 0.01}),
    ("RMSprop", {"lr": 1e-3, "momentum": 0.5}),
    ("Adagrad8bit", {"lr": 1e-2, "weight_decay": 0.01}),
    ("Adagrad", {"lr": 1e-2, "eps": 1e-8}),
    ("AdEMAMix8bit", {"lr": 1e-3}),
    ("AdEMAMix8bit", {"lr": 1e-3, "t_alpha": 10, "t_beta3": 10, "alpha": 8.0}),
    ("AdEMAMix", {"lr": 1e-3, "betas": (0.8, 0.99, 0.999), "weight_decay": 0.0}),
    ("PagedAdEMAMix8bit", {"lr": 1e-3}),
    ("LAMB8bit", {"lr": 1e-3}),
    ("LAMB", {"lr": 1e-3, "weight_decay": 0.01}),
    ("LARS", {"lr": 1e-2, "momentum": 0.9}),
    ("LARS8bit", {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.01}),
]


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    big, small = (rng.standard_normal(s).astype(np.float32) for s in (BIG, SMALL))
    grads = [
        tuple(0.1 * rng.standard_normal(s).astype(np.float32) for s in (BIG, SMALL))
        for _ in range(STEPS)
    ]
    return big, small, grads


def _groups(params, kwargs):
    """Two groups: the big parameter with the case's options, the small one with half
    its learning rate."""
    lr = kwargs.get("lr", 1e-3)
    return [{"params": [params[0]]}, {"params": [params[1]], "lr": lr / 2}]


def _torch_run(name, kwargs, big, small, grads, steps=STEPS):
    params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in (big, small)]
    kwargs = {"lr": 1e-3, **kwargs} if name.startswith(("SGD", "LARS")) else kwargs
    opt = getattr(bnb.optim, name)(_groups(params, kwargs), **kwargs)
    for g in grads[:steps]:
        for p, x in zip(params, g):
            p.grad = torch.from_numpy(x.copy())
        opt.step()
    return opt, params


def _lucid_run(name, kwargs, big, small, grads, steps=STEPS, compiled=False):
    params = [lucid.Parameter(jnp.asarray(x)) for x in (big, small)]
    kwargs = {"lr": 1e-3, **kwargs} if name.startswith(("SGD", "LARS")) else kwargs
    opt = getattr(LB, name)(_groups(params, kwargs), **kwargs)
    runner = lucid.compile_optimizer(opt) if compiled else opt
    for g in grads[:steps]:
        for p, x in zip(params, g):
            p.grad = jnp.asarray(x)
        runner.step()
    return opt, params


def assert_codes_match(ours, theirs):
    ours, theirs = np.asarray(ours).astype(int), np.asarray(theirs).astype(int)
    assert ours.shape == theirs.shape
    differ = ours != theirs
    assert differ.mean() <= CODE_SHARE, f"{differ.sum()} of {differ.size} codes differ"
    assert np.abs(ours - theirs).max(initial=0) <= 1


def assert_non_finite_state_alike(t_state, l_state):
    """The first state's entries and block maxima that are NaN or infinite are where
    bitsandbytes' are."""
    for key in ("state1", "absmax1"):
        if key in t_state:
            np.testing.assert_array_equal(
                np.isfinite(np.asarray(l_state[key], float)),
                np.isfinite(t_state[key].numpy().astype(float)),
            )


def assert_states_match(name, t_state, l_state):
    assert set(l_state) == set(t_state), (sorted(l_state), sorted(t_state))
    for key, theirs in t_state.items():
        ours = l_state[key]
        if key == "step":
            assert ours == theirs and isinstance(ours, int)
            continue
        theirs = theirs.numpy()
        assert np.asarray(ours).dtype == theirs.dtype, key
        if theirs.dtype == np.uint8:
            assert_codes_match(ours, theirs)
        elif key.startswith("qmap"):
            np.testing.assert_array_equal(np.asarray(ours), theirs)
        else:
            scale = float(np.abs(theirs).max(initial=0.0))
            np.testing.assert_allclose(
                np.asarray(ours), theirs, rtol=STATE_RTOL, atol=STATE_RTOL * scale
            )
    if "absmax1" in t_state:  # the dequantized states
        signed = {"state1": True, "state2": False}
        for key, absmax in (("state1", "absmax1"), ("state2", "absmax2")):
            if key not in t_state:
                continue
            codes, scale = t_state[key], t_state[absmax]
            if scale.dim() == 2:  # AdEMAMix: two moments, one absmax row each
                pairs = [(codes[i], scale[i], l_state[key][i], l_state[absmax][i]) for i in (0, 1)]
            else:
                pairs = [(codes, scale, l_state[key], l_state[absmax])]
            code = bnbF.create_dynamic_map(signed=signed[key])
            for tc, ts, lc, ls in pairs:
                theirs = bnbF.dequantize_blockwise(tc, absmax=ts, code=code, blocksize=256)
                ours = dequantize_blockwise(lc, ls, signed[key])
                np.testing.assert_allclose(
                    np.asarray(ours), theirs.numpy(), rtol=2e-2, atol=STATE_RTOL * float(ts.max())
                )


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_trajectories_equal_bitsandbytes(name, kwargs):
    big, small, grads = _data()
    t_opt, t_params = _torch_run(name, kwargs, big, small, grads)
    l_opt, l_params = _lucid_run(name, kwargs, big, small, grads)
    for tp, lp in zip(t_params, l_params):
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL)
        assert_states_match(name, t_opt.state[tp], l_opt.state[lp])
    eight = ("8bit" in name or kwargs.get("optim_bits") == 8) and "min_8bit_size" not in kwargs
    assert ("absmax1" in l_opt.state[l_params[0]]) == eight
    assert "absmax1" not in l_opt.state[l_params[1]]  # under min_8bit_size: 32-bit


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", ["Lion", "Lion8bit"])
def test_a_nan_gradient_leaves_a_lion_parameter_where_bitsandbytes_leaves_it(name, compiled):
    """bitsandbytes takes Lion's sign with `torch.sign`, which is 0 for NaN: where a
    gradient is NaN the parameter moves by its weight decay only and stays finite, and
    the average turns NaN (8-bit: its block's absmax, so the block's later signs are 0
    too). `jnp.sign` is NaN there and would write NaN into the parameter."""
    big, small, grads = _data(5)
    grads = [tuple(g.copy() for g in step) for step in grads[:5]]
    grads[1][0][3, :5] = np.nan  # the 8-bit parameter: one block
    grads[2][1][2, 2] = np.nan  # the 32-bit one (under min_8bit_size)
    kwargs = {"lr": 1e-3, "weight_decay": 0.1}
    t_opt, t_params = _torch_run(name, kwargs, big, small, grads, steps=5)
    l_opt, l_params = _lucid_run(name, kwargs, big, small, grads, steps=5, compiled=compiled)
    for tp, lp in zip(t_params, l_params):
        theirs, ours = tp.detach().numpy(), np.asarray(lp.data)
        assert np.isfinite(theirs).all()
        np.testing.assert_allclose(ours, theirs, atol=PARAM_ATOL)
        assert_non_finite_state_alike(t_opt.state[tp], l_opt.state[lp])


@pytest.mark.parametrize("name", ["AdamW8bit", "AdEMAMix8bit", "Lion8bit", "LAMB8bit", "SGD8bit"])
def test_the_compiled_step_gives_the_eager_numbers(name):
    big, small, grads = _data(3)
    kwargs = {"lr": 1e-2, "momentum": 0.9} if name == "SGD8bit" else {"lr": 1e-3}
    e_opt, e_params = _lucid_run(name, kwargs, big, small, grads, steps=8)
    c_opt, c_params = _lucid_run(name, kwargs, big, small, grads, steps=8, compiled=True)
    for ep, cp in zip(e_params, c_params):
        np.testing.assert_allclose(np.asarray(cp.data), np.asarray(ep.data), atol=1e-6)
        for key, value in e_opt.state[ep].items():
            other = c_opt.state[cp][key]
            if np.asarray(value).dtype == np.uint8:
                assert_codes_match(other, value)
            else:
                np.testing.assert_allclose(np.asarray(other), np.asarray(value), rtol=1e-5)


CHUNKED = (131, 256)  # whole blocks: on the CPU, two loop iterations of 64 blocks and 3 more
CHUNKED_CASES = [
    ("AdamW8bit", {"lr": 1e-3}),
    ("AdEMAMix8bit", {"lr": 1e-3}),
    ("Lion8bit", {"lr": 1e-3, "weight_decay": 0.1}),
    ("SGD8bit", {"lr": 1e-2, "momentum": 0.9}),
    ("RMSprop8bit", {"lr": 1e-3, "alpha": 0.9}),
    ("Adagrad8bit", {"lr": 1e-2}),
]


@pytest.mark.parametrize(("name", "kwargs"), CHUNKED_CASES, ids=[n for n, _ in CHUNKED_CASES])
def test_a_state_of_whole_blocks_runs_in_chunks_with_bitsandbytes_numbers(name, kwargs):
    """A parameter of whole blocks takes the CPU's chunked program (`in_chunks`, here a
    loop of two chunks and a remainder); eager and compiled, its trajectory is
    bitsandbytes' (codes, absmax and parameters)."""
    from lucid.functional._lowbit.chunks import chunk_blocks, chunkable

    blocks = CHUNKED[0] * CHUNKED[1] // 256
    assert chunkable(blocks * 256, 256) == (jax.device_count() == 1)
    assert blocks // chunk_blocks(256) == 2 and blocks % chunk_blocks(256)
    rng = np.random.default_rng(11)
    big, small = (rng.standard_normal(s).astype(np.float32) for s in (CHUNKED, SMALL))
    grads = [
        tuple(0.1 * rng.standard_normal(s).astype(np.float32) for s in (CHUNKED, SMALL))
        for _ in range(6)
    ]
    grads[3][0][5, :7] = np.nan  # a NaN in a block of the first chunk
    t_opt, t_params = _torch_run(name, kwargs, big, small, grads, steps=6)
    for compiled in (False, True):
        l_opt, l_params = _lucid_run(name, kwargs, big, small, grads, steps=6, compiled=compiled)
        for tp, lp in zip(t_params, l_params):
            np.testing.assert_allclose(
                np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL, equal_nan=True
            )
        assert_states_match(name, t_opt.state[t_params[0]], l_opt.state[l_params[0]])


def test_edits_of_the_groups_reach_the_next_step_as_in_bitsandbytes():
    """bitsandbytes reads `lr`, `betas`, `eps` and `weight_decay` from the group at every
    step (a scheduler's edits); so does lucid's compiled step."""
    big, small, grads = _data(9)
    t_params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in (big, small)]
    l_params = [lucid.Parameter(jnp.asarray(x)) for x in (big, small)]
    t_opt = bnb.optim.AdamW8bit(t_params, lr=1e-3)
    l_opt = LB.AdamW8bit(l_params, lr=1e-3)
    compiled = lucid.compile_optimizer(l_opt)
    for i, g in enumerate(grads[:8]):
        if i == 4:
            for group in (t_opt.param_groups[0], l_opt.param_groups[0]):
                group.update(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.1)
        for tp, lp, x in zip(t_params, l_params, g):
            tp.grad, lp.grad = torch.from_numpy(x.copy()), jnp.asarray(x)
        t_opt.step()
        compiled.step()
    for tp, lp in zip(t_params, l_params):
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL)
        assert_states_match("AdamW8bit", t_opt.state[tp], l_opt.state[lp])


def test_fused_step_gives_the_eager_numbers():
    def loss_fn(params, x):
        w, b = params
        return jnp.sum(jnp.tanh(x @ w) ** 2) + jnp.sum(b**2)

    x = jnp.asarray(np.random.default_rng(8).standard_normal((4, BIG[0])), jnp.float32)
    results = []
    for fused in (True, False):
        params = [lucid.Parameter(jnp.ones(BIG)), lucid.Parameter(jnp.ones(SMALL))]
        opt = LB.AdamW8bit(params, lr=1e-2)
        step = lucid.optim.fused_step(loss_fn, opt) if fused else None
        for _ in range(4):
            if fused:
                step(params, x)
            else:
                opt.zero_grad()
                lucid.backward(loss_fn, params, x)
                opt.step()
        results.append((params, opt))
    (fp, fo), (ep, eo) = results
    for a, b in zip(fp, ep):
        np.testing.assert_allclose(np.asarray(a.data), np.asarray(b.data), atol=1e-6)
    assert_codes_match(fo.state[fp[0]]["state1"], eo.state[ep[0]]["state1"])
    assert_codes_match(fo.state[fp[0]]["state2"], eo.state[ep[0]]["state2"])


def test_the_functional_transform_under_jit_gives_the_class_numbers():
    big, small, grads = _data(4)
    tx = LF.bnb.adamw8bit(lr=1e-3, weight_decay=0.05)
    params = {"big": jnp.asarray(big), "small": jnp.asarray(small)}
    state = tx.init(params)
    assert state.state1["big"].dtype == jnp.uint8 and state.absmax1["small"] is None
    update = jax.jit(tx.update)
    for g in grads[:6]:
        updates, state = update(
            {"big": jnp.asarray(g[0]), "small": jnp.asarray(g[1])}, state, params
        )
        params = optax.apply_updates(params, updates)
    t_opt, t_params = _torch_run(
        "AdamW8bit", {"lr": 1e-3, "weight_decay": 0.05}, big, small, grads, 6
    )
    np.testing.assert_allclose(np.asarray(params["big"]), t_params[0].detach().numpy(), atol=1e-6)
    assert_codes_match(state.state1["big"], t_opt.state[t_params[0]]["state1"].numpy())
    assert_codes_match(state.state2["big"], t_opt.state[t_params[0]]["state2"].numpy())
    assert int(state.step["big"]) == 6


def test_a_float32_step_has_no_float64_and_no_host_callback():
    tx = LF.bnb.ademamix8bit(lr=1e-3, t_alpha=5, t_beta3=5)
    params = {"w": jnp.zeros(BIG, jnp.float32), "b": jnp.zeros(SMALL, jnp.float32)}
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    assert jax.config.jax_enable_x64  # the tests' setting: float64 would appear if made
    text = str(jax.make_jaxpr(tx.update)(grads, state, params))
    assert "f64" not in text and "callback" not in text


@pytest.mark.parametrize("name", ["AdamW8bit", "Lion8bit", "AdamW"])
def test_bfloat16_parameters_are_updated_as_bitsandbytes_updates_them(name):
    """bitsandbytes computes in float32 and writes the parameter back in bfloat16: the
    same bits here."""
    big, _, grads = _data(7)
    t_param = torch.nn.Parameter(torch.from_numpy(big.copy()).bfloat16())
    l_param = lucid.Parameter(jnp.asarray(big).astype(jnp.bfloat16))
    t_opt, l_opt = getattr(bnb.optim, name)([t_param]), getattr(LB, name)([l_param])
    for g, _ in grads[:8]:
        t_param.grad = torch.from_numpy(g.copy()).bfloat16()
        l_param.grad = jnp.asarray(g).astype(jnp.bfloat16)
        t_opt.step()
        l_opt.step()
    assert l_param.data.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(l_param.data.astype(jnp.float32)), t_param.detach().float().numpy()
    )
    state = l_opt.state[l_param]
    assert state["state1"].dtype == (jnp.uint8 if "8bit" in name else jnp.float32)
    np.testing.assert_array_equal(
        np.asarray(state["state1"]), t_opt.state[t_param]["state1"].numpy()
    )


# ---------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("name", ["AdamW8bit", "AdEMAMix8bit", "Lion8bit", "LAMB", "RMSprop8bit"])
def test_checkpoints_move_both_ways_in_bitsandbytes_format(name):
    big, small, grads = _data(5)
    kwargs = {"lr": 1e-3}
    t_opt, t_params = _torch_run(name, kwargs, big, small, grads, steps=5)
    saved = t_opt.state_dict()
    params = [lucid.Parameter(jnp.asarray(p.detach().numpy().copy())) for p in t_params]
    l_opt = getattr(LB, name)(_groups(params, kwargs), **kwargs)
    l_opt.load_state_dict(saved)  # torch -> lucid, then both run on
    compiled = lucid.compile_optimizer(l_opt)
    for g in grads[5:10]:
        for tp, lp, x in zip(t_params, params, g):
            tp.grad, lp.grad = torch.from_numpy(x.copy()), jnp.asarray(x)
        t_opt.step()
        compiled.step()
    for tp, lp in zip(t_params, params):
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL)
        assert_states_match(name, t_opt.state[tp], l_opt.state[lp])
    # lucid -> torch: bitsandbytes' format, loaded by bitsandbytes, the next step agrees
    ours = lucid.optim.to_torch(compiled.state_dict())
    theirs = t_opt.state_dict()
    assert sorted(ours["state"][0]) == sorted(theirs["state"][0])
    for key in ours["state"]:
        wrapped = "__bnb_optimizer_quant_state__"
        assert sorted(ours["state"][key].get(wrapped, {})) == sorted(
            theirs["state"][key].get(wrapped, {})
        )
    for our_group, their_group in zip(ours["param_groups"], theirs["param_groups"]):
        assert set(their_group) <= set(our_group)  # bitsandbytes reads its keys from ours
    fresh = [torch.nn.Parameter(torch.from_numpy(np.asarray(p.data).copy())) for p in params]
    t_new = getattr(bnb.optim, name)(_groups(fresh, kwargs), **kwargs)
    t_new.load_state_dict(ours)
    for tp, lp, x in zip(fresh, params, grads[10]):
        tp.grad, lp.grad = torch.from_numpy(x.copy()), jnp.asarray(x)
    t_new.step()
    compiled.step()
    for tp, lp in zip(fresh, params):
        np.testing.assert_allclose(np.asarray(lp.data), tp.detach().numpy(), atol=PARAM_ATOL)
        assert_states_match(name, t_new.state[tp], l_opt.state[lp])


def test_a_lucid_checkpoint_resumes_in_lucid_eager_or_compiled():
    big, small, grads = _data(10)
    opt, params = _lucid_run("AdEMAMix8bit", {"lr": 1e-3}, big, small, grads, steps=4)
    saved = opt.state_dict()
    copies = [lucid.Parameter(jnp.array(p.data)) for p in params]
    resumed = LB.AdEMAMix8bit(_groups(copies, {"lr": 1e-3}), lr=1e-3)
    resumed.load_state_dict(saved)
    compiled = lucid.compile_optimizer(resumed)
    for g in grads[4:7]:
        for p, c, x in zip(params, copies, g):
            p.grad, c.grad = jnp.asarray(x), jnp.asarray(x)
        opt.step()
        compiled.step()
    for p, c in zip(params, copies):
        np.testing.assert_allclose(np.asarray(c.data), np.asarray(p.data), atol=1e-6)
        for key, value in opt.state[p].items():
            if np.asarray(value).dtype == np.uint8:
                assert_codes_match(resumed.state[c][key], value)


def test_a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing():
    big, small, grads = _data(6)
    opt, _ = _lucid_run("Adam8bit", {}, big, small, grads, steps=2)
    saved = opt.state_dict()
    before = opt.state_dict()
    bad = lucid.optim.to_torch(saved)
    bad["state"][0]["__bnb_optimizer_quant_state__"]["qmap1"] = torch.linspace(-1, 1, 256)
    with pytest.raises(ValueError, match="dynamic map"):
        opt.load_state_dict(bad)
    bad = lucid.optim.to_torch(saved)
    bad["state"][0]["__bnb_optimizer_quant_state__"]["absmax1"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    chex.assert_trees_all_equal(
        after["state"][0]["__bnb_optimizer_quant_state__"],
        before["state"][0]["__bnb_optimizer_quant_state__"],
    )


def test_a_32_bit_state_saved_in_bfloat16_loads_as_float32():
    """A bitsandbytes state_dict whose 32-bit `state1`/`state2` were kept in bfloat16
    (NumPy's issubdtype does not call bfloat16 a float) loads, as float32 (lucid's 32-bit
    state), and goes on as the uninterrupted bitsandbytes run to the bfloat16 rounding of
    the moments: Adam's step `lr m / sqrt(v)` moves by at most about `lr * 3 * 2**-9`.
    (bitsandbytes' own load keeps the bfloat16 tensors, and its CPU step then moves
    every entry by about `lr`: no oracle here.)"""
    rng = np.random.default_rng(5)
    x, g1, g2 = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    p = torch.nn.Parameter(torch.tensor(x))
    theirs = bnb.optim.Adam32bit([p], lr=1e-2)
    p.grad = torch.tensor(g1)
    theirs.step()
    saved = theirs.state_dict()
    quant = saved["state"][0]["__bnb_optimizer_quant_state__"]
    for key in ("state1", "state2"):
        quant[key] = quant[key].bfloat16()
    # a copy: on the CPU, jax may share a NumPy view's memory, which torch updates in place
    w = lucid.Parameter(jnp.array(p.detach().numpy(), copy=True))
    ours = LB.Adam32bit([w], lr=1e-2)
    ours.load_state_dict(saved)
    assert ours.state[w]["state1"].dtype == jnp.float32
    p.grad, w.grad = torch.tensor(g2), jnp.asarray(g2)
    theirs.step()
    ours.step()
    np.testing.assert_allclose(np.asarray(w.data), p.detach().numpy(), atol=1e-2 * 3 * 2**-9)


def test_an_entry_of_another_name_is_kept_beside_the_state_as_torch_keeps_it():
    big, small, grads = _data(6)
    opt, _ = _lucid_run("Adam8bit", {}, big, small, grads, steps=2)
    saved = lucid.optim.to_torch(opt.state_dict())
    saved["state"][0]["exp_avg"] = torch.zeros(BIG)  # torch's load_state_dict keeps it too
    opt.load_state_dict(saved)
    entry = opt.state_dict()["state"][0]
    assert tuple(entry["exp_avg"].shape) == BIG and "__bnb_optimizer_quant_state__" in entry


# ---------------------------------------------------------------------- storage
def test_8bit_adam_is_stored_in_at_most_2_05_bytes_per_parameter():
    w = lucid.Parameter(jnp.zeros((256, 256), jnp.float32))
    compiled = lucid.compile_optimizer(LB.Adam8bit([w]))
    w.grad = jnp.ones_like(w.data)
    compiled.step()
    state = compiled.state[w]
    assert state["state1"].dtype == jnp.uint8 and state["state2"].dtype == jnp.uint8
    assert state["absmax1"].dtype == jnp.float32 and state["absmax1"].shape == (256,)
    per_param = sum(compiled.state_bytes_per_device().values()) / w.data.size
    assert per_param <= 2.05
    assert per_param >= 2.0  # two codes per parameter: nothing is stored wider


# ---------------------------------------------------------------------- the API
NAMES = [entry.name for entry in registered("bitsandbytes")]


def test_every_bitsandbytes_optimizer_class_exists():
    theirs = {
        name
        for name, value in vars(bnb.optim).items()
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer)
    }
    theirs -= {"PytorchLARS"}  # a plain torch reference implementation, no bitsandbytes kernel
    assert len(theirs) == 39
    assert theirs == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_signatures_are_bitsandbytes_and_every_class_is_registered(name):
    ours = inspect.signature(getattr(LB, name))
    theirs = inspect.signature(getattr(bnb.optim, name))
    assert [(p.name, p.default) for p in ours.parameters.values()] == [
        (p.name, p.default) for p in theirs.parameters.values()
    ]
    entry = entry_of(getattr(LB, name))
    assert entry is not None and entry.reference == "bitsandbytes"
    factory = getattr(LF.bnb, name.lower().replace("paged", "paged_"))
    assert list(inspect.signature(factory).parameters) == list(theirs.parameters)[1:]


ERRORS = [
    ("Adam8bit", {"lr": -1.0}, ValueError, "Invalid learning rate: -1.0", "init"),
    ("Adam8bit", {"eps": -1.0}, ValueError, "Invalid epsilon value: -1.0", "init"),
    ("Adam8bit", {"betas": (1.0, 0.9)}, ValueError, "Invalid beta parameter at index 0", "init"),
    ("AdamW8bit", {"weight_decay": -1}, ValueError, "Invalid weight_decay value: -1", "init"),
    ("Adam8bit", {"amsgrad": True}, ValueError, "Adam8bit does not support amsgrad=True", "init"),
    ("PagedAdamW8bit", {"optim_bits": 8}, ValueError, "only supports optim_bits=32", "init"),
    ("Adam", {"optim_bits": 16}, NotImplementedError, "bits not supported: 16", "step"),
    ("SGD8bit", {"lr": 0.1}, NotImplementedError, "SGD without momentum", "init"),
    ("LARS", {"lr": 0.1}, NotImplementedError, "LARS without momentum", "init"),
    ("RMSprop8bit", {"alpha": 0}, NotImplementedError, "alpha==0.0 is not supported", "init"),
    ("RMSprop", {"centered": True}, NotImplementedError, "Centered RMSprop", "init"),
    ("Adagrad8bit", {"lr_decay": 0.1}, ValueError, "Lr Decay != 0.0 not supported", "init"),
    ("Adagrad", {"initial_accumulator_value": 1}, ValueError, "Initial accumulator", "init"),
    ("Adagrad8bit", {"optim_bits": 32}, ValueError, "only supports optim_bits=8", "init"),
    ("LAMB8bit", {"max_unorm": 0.5}, ValueError, "only supports max_unorm=1.0", "init"),
    ("LAMB8bit", {"amsgrad": True}, ValueError, "does not support amsgrad=True", "init"),
    ("Lion8bit", {"betas": (0.9, -0.1)}, ValueError, "Invalid beta parameter at index 1", "init"),
    ("AdEMAMix8bit", {"betas": (0.9, 0.99, 1.0)}, ValueError, "at index 2: 1.0", "init"),
    ("Adam8bit", {"foo": 1}, TypeError, "unexpected keyword argument 'foo'", "init"),
]


@pytest.mark.parametrize(("name", "kwargs", "error", "message", "when"), ERRORS)
def test_errors_are_bitsandbytes(name, kwargs, error, message, when):
    for module, make in ((bnb.optim, torch.nn.Parameter), (LB, lucid.Parameter)):
        array = np.ones(8, np.float32)
        p = make(torch.from_numpy(array) if module is bnb.optim else jnp.asarray(array))
        cls = getattr(module, name)
        if when == "init":
            with pytest.raises(error, match=message):
                cls([p], **kwargs)
            continue
        opt = cls([p], **kwargs)
        p.grad = torch.ones(8) if module is bnb.optim else jnp.ones(8)
        before = np.array(np.asarray(p.data if module is LB else p.detach()))
        with pytest.raises(error, match=message):
            opt.step()
        now = np.asarray(p.data) if module is LB else p.detach().numpy()
        np.testing.assert_array_equal(now, before)


def test_the_args_object_is_refused_with_a_clear_error():
    """bitsandbytes' `args` bundles `optim_bits`, `min_8bit_size`, ...; lucid takes them as
    keywords only (documented), and says so before anything is made."""
    with pytest.raises(TypeError, match="pass optim_bits and min_8bit_size"):
        LB.Adam8bit([lucid.Parameter(jnp.ones(8))], args=object())
