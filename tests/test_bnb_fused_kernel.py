"""bitsandbytes' fused 8-bit step (`lucid.functional.bnb._pallas`) against the XLA graph of
the same step (`_family.xla_step8`), from the same state, for every one-moment-per-state rule.

On a GPU the kernel is compiled by Triton; elsewhere it runs through Pallas' interpreter, so
that CI (CPU) checks its tiling, indexing, block reduction and quantization. The two programs
evaluate the same operations but are scheduled by different compilers, which contract
multiplies and adds into fused multiply-adds in different places: a value may move by an ulp,
and a state value within an ulp of a rounding boundary may then take the neighbouring code.
The tests bound exactly that: parameters within float32 rounding of the step's terms, absmax
within one ulp, codes equal but for a few (at most 1 in 1000) that differ by one code, and
the parameters after twelve steps each way within float32 rounding of each other.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lucid.functional.bnb import _family, _pallas, quantize_blockwise

ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU

# (module, kernel, hyper-parameters, flags) of every rule the fused kernel takes
RULES = {
    "adam": ("adam", "ADAM_KERNEL", {"eps": 1e-8, "decay": 1 - 1e-4}, {"use_weight_decay": True}),
    "lion": ("lion", "LION_KERNEL", {"decay": 1 - 1e-4}, {"use_weight_decay": True}),
    "momentum": ("sgd", "MOMENTUM_KERNEL", {"decay": 1.0}, {"use_weight_decay": False}),
    "rmsprop": ("rmsprop", "RMSPROP_KERNEL", {"eps": 1e-8, "alpha": 0.99}, {}),
    "adagrad": ("adagrad", "ADAGRAD_KERNEL", {"eps": 1e-10}, {}),
}


def _kernel(name: str):
    module, attribute, _, _ = RULES[name]
    return getattr(importlib.import_module(f"lucid.functional.bnb.{module}"), attribute)


def _hyper(name: str) -> dict:
    base = {
        "lr": 1e-2,
        "beta1": 0.9,
        "beta2": 0.999,
        "one_minus_beta1": 0.1,
        "one_minus_beta2": 0.001,
        "weight_decay": 1e-2,
    }
    return {k: jnp.float32(v) for k, v in {**base, **RULES[name][2]}.items()}


def _flags(name: str) -> dict:
    return {"use_weight_decay": False, "use_unorm": False, **RULES[name][3]}


def _state(kernel, shape, rng) -> _family.BnbState:
    s1 = jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32)
    s2 = jnp.asarray(0.01 * rng.random(shape), jnp.float32)
    if kernel.name in ("rmsprop", "adagrad"):  # squared gradients (in the signed map)
        s1 = jnp.abs(s1)
    codes1, absmax1 = quantize_blockwise(s1)
    codes2 = absmax2 = None
    if kernel.two_states:
        codes2, absmax2 = quantize_blockwise(s2, signed=False)
    return _family.BnbState(jnp.int32(3), codes1, codes2, absmax1, absmax2, None)


def _both(name: str, p, g, state, step: int):
    kernel, flags = _kernel(name), _flags(name)

    @jax.jit
    def run(p, g, state, h):
        scalars = _family.step8_scalars(kernel, h, jnp.float32(step))
        xla = _family.xla_step8(kernel, p, g, state, scalars, flags)
        fused = _pallas.fused_step8(kernel, p, g, state, scalars, flags, interpret=INTERPRET)
        return xla, fused

    return run(p, g, state, _hyper(name))


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max(initial=0))


def _check_parameter(before, a, b) -> None:
    """The new parameters agree to float32 rounding of the step's two terms: within four
    ulps of the larger of the old value and the update."""
    before, a, b = (np.asarray(x, np.float64) for x in (before, a, b))
    assert not np.isnan(a).any() and not np.isnan(b).any()
    bound = 2.0**-21 * (np.abs(before) + np.abs(a - before))
    assert np.all(np.abs(a - b) <= bound), float(np.max(np.abs(a - b) / bound))


def _check_codes(a, b) -> None:
    a, b = np.asarray(a, np.int32), np.asarray(b, np.int32)
    differ = a != b
    assert differ.mean() <= 1e-3, f"{differ.sum()} of {a.size} codes differ"
    assert np.abs(a - b).max(initial=0) <= 1


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("shape", [(6, 256), (3, 512)], ids=str)
def test_one_fused_step_is_the_xla_step_to_an_ulp(name, shape):
    rng = np.random.default_rng(sorted(RULES).index(name))
    kernel = _kernel(name)
    state = _state(kernel, shape, rng)
    p = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    g = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    xla, fused = _both(name, p, g, state, step=4)
    assert fused[0].shape == p.shape and fused[0].dtype == jnp.float32
    _check_parameter(p, xla[0], fused[0])
    _check_codes(xla[1], fused[1])
    assert _ulps(xla[2], fused[2]) <= 1
    assert fused[1].dtype == jnp.uint8 and fused[2].shape == xla[2].shape
    if kernel.two_states:
        _check_codes(xla[3], fused[3])
        assert _ulps(xla[4], fused[4]) <= 1
    else:
        assert fused[3] is None and fused[4] is None


@pytest.mark.parametrize("name", ["adam", "lion"])
def test_fused_steps_follow_the_xla_steps(name):
    """Twelve steps each way from the same start: each path feeds itself, so the last-bit
    differences of single steps may accumulate; they stay at float32 rounding."""
    rng = np.random.default_rng(7)
    kernel, shape = _kernel(name), (4, 256)
    state = _state(kernel, shape, rng)
    p = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    ours = [(p, state), (p, state)]
    for step in range(1, 13):
        g = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        for which in (0, 1):
            p_i, s_i = ours[which]
            new = _both(name, p_i, g, s_i, step)[which]
            codes1, absmax1, codes2, absmax2 = new[1:]
            ours[which] = (
                new[0],
                _family.BnbState(s_i.step + 1, codes1, codes2, absmax1, absmax2, None),
            )
    np.testing.assert_allclose(ours[0][0], ours[1][0], rtol=1e-5, atol=1e-6)


def test_zero_and_nan_blocks_code_as_the_xla_step():
    """A block whose new state is all zeros gets absmax 0 and codes 0; a NaN gradient
    gives code 0 where it lands, in both programs."""
    kernel, shape = _kernel("momentum"), (4, 256)
    state = _family.BnbState(
        jnp.int32(0), jnp.zeros(shape, jnp.uint8), None, jnp.zeros((4,), jnp.float32), None, None
    )
    g = np.zeros(shape, np.float32)
    g[1] = 1.0
    g[2, 5] = np.nan
    p = jnp.zeros(shape, jnp.float32)  # (SGD8bit's weight decay is added to the gradient)
    xla, fused = _both("momentum", p, jnp.asarray(g), state, step=1)
    np.testing.assert_array_equal(xla[1], fused[1])
    np.testing.assert_array_equal(xla[2], fused[2])
    assert float(fused[2][0]) == 0.0 and not np.asarray(fused[1])[0].any()
    assert float(fused[2][1]) == 1.0 and np.isnan(np.asarray(fused[0])[2, 5])
    assert kernel.name == "momentum"


def test_the_kernel_takes_whole_blocks_of_one_moment_rules():
    assert _pallas.supported(_kernel("adam"), jnp.zeros((64, 64)))
    assert not _pallas.supported(_kernel("adam"), jnp.zeros((4096 + 100,)))
    ademamix = importlib.import_module("lucid.functional.bnb.ademamix").ADEMAMIX_KERNEL
    assert not _pallas.supported(ademamix, jnp.zeros((64, 64)))


def test_tiles_divide_the_blocks():
    for blocks in (64, 40, 3, 1):
        rows = _pallas._rows_per_tile(blocks)
        assert blocks % rows == 0 and 1 <= rows <= _pallas.ROWS


def test_the_gpu_replacements_reach_every_division_and_square_root():
    """The interpreter the GPU kernel traces its rule through replaces each float32
    `div` and `sqrt` (inside nested jitted jnp functions too) and nothing else."""
    seen = []

    def div(x, y):
        seen.append("div")
        return jax.lax.div(x, y)

    def sqrt(x):
        seen.append("sqrt")
        return jax.lax.sqrt(x)

    kernel = _kernel("adam")

    def rule(p, g, s1, s2, h):
        return kernel.step8(p, g, s1, s2, h, h["step"], _flags("adam"))

    args = [jnp.full((2, 256), v, jnp.float32) for v in (1.0, 0.5, 0.1, 0.01)]
    h = _family.step8_scalars(kernel, _hyper("adam"), jnp.float32(2))
    closed = jax.make_jaxpr(rule)(*args, h)
    flat = jax.tree_util.tree_leaves((*args, h))
    outs = _pallas._eval_with(
        closed.jaxpr, list(closed.consts), flat, {jax.lax.div_p: div, jax.lax.sqrt_p: sqrt}
    )
    assert sorted(set(seen)) == ["div", "sqrt"] and seen.count("sqrt") == 1
    for got, want in zip(outs, rule(*args, h)):
        np.testing.assert_array_equal(got, want)
