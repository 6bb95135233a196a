"""torchao's fused low-bit step (`lucid.functional.torchao._pallas`) against the XLA graph of
the same step (`adam._step`), from the same state, for every form (8-bit, 4-bit, fp8).

On a GPU the kernel is compiled by Triton; elsewhere it runs through Pallas' interpreter, so
that CI (CPU) checks its tiling, strided halves, gathers, block reduction and quantization.
The two programs evaluate the same operations but are scheduled by different compilers,
which contract multiplies and adds into fused multiply-adds in different places: a value may
move by an ulp, and a moment within an ulp of a rounding boundary may then take the
neighbouring code. The tests bound exactly that (as bitsandbytes' kernel's tests do).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lucid import _platform
from lucid.functional._lowbit import floats
from lucid.functional._lowbit import torchao as codec
from lucid.functional.torchao import _pallas
from lucid.functional.torchao import adam as rules

ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU
FORMS = ("8bit", "4bit", "fp8")
HYPER = {
    "lr": 1e-2,
    "beta1": 0.9,
    "beta2": 0.999,
    "one_minus_beta1": 0.1,
    "one_minus_beta2": 0.001,
    "eps": 1e-8,
    "weight_decay": 1e-2,
}


def _block(form: str) -> int:
    return 128 if form == "4bit" else 256


def _state(form: str, size: int, block: int, rng) -> tuple:
    m = jnp.asarray(0.1 * rng.standard_normal(size), jnp.float32)
    v = jnp.asarray(0.01 * rng.random(size), jnp.float32)
    return (*codec.quantize(m, form, True, block), *codec.quantize(v, form, False, block))


def _both(form: str, adamw: bool, p, g, stored, step: int, block: int, hyper=None):
    h = {k: jnp.float32(v) for k, v in (hyper or HYPER).items()}

    @jax.jit
    def run(p, g, stored):
        common = {"h": h, "step": jnp.float32(step), "form": form, "adamw": adamw}
        xla = rules._step(p, g, *stored, None, None, block_size=block, **common)
        fused = _pallas.fused_step(
            p, g, *stored, block_size=block, rule=rules.RULE_MATH, interpret=INTERPRET, **common
        )
        return xla, fused

    return run(p, g, stored)


def _ulps(a, b) -> int:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max(initial=0))


def _unpacked(codes, form: str) -> np.ndarray:
    codes = np.asarray(codes)
    if form == "fp8":
        return codes.view(np.uint8).astype(np.int32)
    if form == "4bit":
        return np.stack([codes >> 4, codes & 15], axis=-1).reshape(-1).astype(np.int32)
    return codes.astype(np.int32)


def _check_codes(a, b, form: str) -> None:
    a, b = _unpacked(a, form), _unpacked(b, form)
    differ = a != b
    assert differ.mean() <= 1e-3, f"{differ.sum()} of {a.size} codes differ"
    assert np.abs(a - b).max(initial=0) <= 1


def _check_parameter(before, a, b) -> None:
    """Within float32 rounding of the step's two terms (four ulps of the larger)."""
    before, a, b = (np.asarray(x, np.float64) for x in (before, a, b))
    bound = 2.0**-21 * (np.abs(before) + np.abs(a - before))
    assert np.all(np.abs(a - b) <= bound), float(np.max(np.abs(a - b) / bound))


@pytest.mark.parametrize("adamw", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("form", FORMS)
def test_one_fused_step_is_the_xla_step_to_an_ulp(form, adamw):
    rng = np.random.default_rng(FORMS.index(form) + 3 * adamw)
    block = _block(form)
    size = 6 * block
    p = jnp.asarray(rng.standard_normal(size), jnp.float32)
    g = jnp.asarray(rng.standard_normal(size), jnp.float32)
    stored = _state(form, size, block, rng)
    xla, fused = _both(form, adamw, p, g, stored, 4, block)
    assert fused[5] is None and fused[6] is None
    for got, want in zip(fused[:5], xla[:5]):
        assert got.shape == want.shape and got.dtype == want.dtype
    _check_parameter(p, xla[0], fused[0])
    for i in (1, 3):
        _check_codes(xla[i], fused[i], form)
    for i in (2, 4):
        assert _ulps(xla[i], fused[i]) <= 1


@pytest.mark.parametrize("form", FORMS)
def test_a_matrix_in_smaller_blocks_steps_as_the_xla_step(form):
    """Any shape of whole blocks (here 32-element blocks of a matrix) and the other branch
    of torch's lerp (weights of at least 0.5)."""
    rng = np.random.default_rng(11)
    block, shape = 32, (8, 64)
    hyper = {**HYPER, "beta1": 0.4, "one_minus_beta1": 0.6, "beta2": 0.3, "one_minus_beta2": 0.7}
    p = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    g = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    stored = _state(form, p.size, block, rng)
    stored = (
        stored[0].reshape(shape) if form != "4bit" else stored[0],
        stored[1],
        stored[2].reshape(shape) if form != "4bit" else stored[2],
        stored[3],
    )
    xla, fused = _both(form, True, p, g, stored, 2, block, hyper)
    assert fused[0].shape == shape
    _check_parameter(p, xla[0], fused[0])
    _check_codes(xla[1], fused[1], form)
    _check_codes(xla[3], fused[3], form)


@pytest.mark.parametrize("form", FORMS)
def test_zero_and_nan_blocks_code_as_the_xla_step(form):
    """A block whose moments stay zero takes the floor scale 1e-12 (fp8: over 448); a NaN
    gradient makes its block's scale NaN, as torchao's amax does, in both programs."""
    block = _block(form)
    size = 4 * block
    zeros = jnp.zeros(size, jnp.float32)
    stored = (*codec.quantize(zeros, form, True, block), *codec.quantize(zeros, form, False, block))
    g = np.zeros(size, np.float32)
    g[block : 2 * block] = 1.0
    g[2 * block + 5] = np.nan
    xla, fused = _both(form, True, zeros, jnp.asarray(g), stored, 1, block)
    np.testing.assert_array_equal(_unpacked(xla[1], form), _unpacked(fused[1], form))
    np.testing.assert_array_equal(np.asarray(xla[2]), np.asarray(fused[2]))
    scale = np.asarray(fused[2])
    assert np.isnan(scale[2]) and not np.isnan(scale[[0, 1, 3]]).any()
    floor = np.float32(1e-12) / np.float32(448) if form == "fp8" else np.float32(1e-12)
    assert scale[0] == floor


def test_fused_steps_follow_the_xla_steps():
    """Ten 8-bit steps each way from the same start stay at float32 rounding."""
    rng = np.random.default_rng(5)
    block, size = 256, 4 * 256
    p = jnp.asarray(rng.standard_normal(size), jnp.float32)
    start = (p, _state("8bit", size, block, rng))
    ours = [start, start]
    for step in range(1, 11):
        g = jnp.asarray(rng.standard_normal(size), jnp.float32)
        for which in (0, 1):
            p_i, stored = ours[which]
            new = _both("8bit", True, p_i, g, stored, step, block)[which]
            ours[which] = (new[0], new[1:5])
    np.testing.assert_allclose(ours[0][0], ours[1][0], rtol=1e-5, atol=1e-6)


def test_fp8_bits_decode_every_code_as_the_float8_cast():
    codes = jnp.arange(256, dtype=jnp.uint8)
    want = jax.lax.bitcast_convert_type(codes, floats.FP8).astype(jnp.float32)
    got, want = np.asarray(floats.from_fp8_bits(codes)), np.asarray(want)
    nan = np.isnan(want)  # (a NaN's payload is the compiler's: XLA on a GPU sets every bit)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert nan.sum() == 2 and np.signbit(got[nan]).tolist() == [False, True]


def test_fp8_bits_with_the_kernels_rounding_encode_as_the_float8_cast():
    """`rint_small` (add and take away 2**23) rounds as ``round`` does, ties to even, so the
    kernel's codes are `to_fp8`'s: every float32 from 2**-12 up to 448 (each binade's
    values and the midpoints between e4m3fn codes), both signs, zero and NaN."""
    grid = np.concatenate(
        [np.linspace(2.0**e, 2.0 ** (e + 1), 257, dtype=np.float32) for e in range(-12, 9)]
    )
    ties = (np.arange(0, 17, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-9)
    x = np.concatenate([grid, ties, -grid, -ties, [0.0, -0.0, np.nan]]).astype(np.float32)
    x = x[np.abs(np.nan_to_num(x)) <= 448]
    want = jax.lax.bitcast_convert_type(floats.to_fp8(jnp.asarray(x)), jnp.uint8)
    got = floats.fp8_bits(jnp.asarray(x), floats.rint_small)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_kernel_takes_float32_whole_power_of_two_blocks_without_amsgrad():
    p = jnp.zeros((64, 64), jnp.float32)
    state = rules._init(p, {}, form="8bit", amsgrad=False, block_size=256)
    assert _pallas.supported(p, p, state, 256, "8bit")
    assert not _pallas.supported(p.astype(jnp.bfloat16), p, state, 256, "8bit")
    assert not _pallas.supported(p, p, state, 192, "8bit")  # not a power of two
    assert not _pallas.supported(p, p, state, 16, "8bit")  # under a warp's 32
    amsgrad = rules._init(p, {}, form="8bit", amsgrad=True, block_size=256)
    assert not _pallas.supported(p, p, amsgrad, 256, "8bit")
    small = rules._init(jnp.zeros((8,)), {}, form="8bit", amsgrad=False, block_size=256)
    assert not _pallas.supported(jnp.zeros((8,)), jnp.zeros((8,)), small, 256, "8bit")


def test_the_triton_backend_runs_where_jax_does_not_deprecate_it(monkeypatch):
    """jax < 0.11: the kernels run; jax 0.11 on: only with the opt-in."""
    deprecated = jax.__version_info__[:2] >= _platform.TRITON_DEPRECATED_FROM
    for value, opted in (("", False), ("1", True)):
        monkeypatch.setenv(_platform.TRITON_OPT_IN, value)
        _platform.triton_backend.cache_clear()
        try:
            assert _platform.triton_backend() == (opted or not deprecated)
        finally:
            _platform.triton_backend.cache_clear()


@pytest.mark.parametrize("cls_name", ["bnb.AdamW8bit", "torchao.AdamW8bit", "torchao.AdamWFp8"])
def test_a_compiled_low_bit_step_warns_of_no_deprecation(cls_name):
    """The compiled step, of a state large enough for the fused kernel where it runs,
    compiles and steps with no DeprecationWarning from jax (on the newest jax, the GPU
    runs XLA's graph unless the Triton kernels are opted into)."""
    import importlib

    import lucid

    module, name = cls_name.split(".")
    cls = getattr(importlib.import_module(f"lucid.optim.{module}"), name)
    params = [lucid.Parameter(jnp.full((64, 256), 0.5, jnp.float32))]
    compiled = lucid.compile_optimizer(cls(params, lr=1e-3))
    params[0].grad = jnp.full((64, 256), 1e-3, jnp.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled.step()
        jax.block_until_ready(params[0].data)
    if _platform.triton_backend() and ON_GPU:
        return  # opted in: jax warns of its Triton backend, as the opt-in says
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert not deprecations, [str(w.message) for w in deprecations]


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU: compiles the fused kernel with Triton")
@pytest.mark.parametrize("form", FORMS)
def test_on_the_gpu_the_opted_in_step_runs_the_kernel_with_the_xla_numbers(form, monkeypatch):
    """With the kernels on, the rule's update compiles to a program holding the Triton
    kernel (XLA's otherwise), and its parameters after three steps are the XLA program's
    to float32 rounding."""
    import lucid
    from lucid.functional import _apply

    cls = {"8bit": "AdamW8bit", "4bit": "AdamW4bit", "fp8": "AdamWFp8"}[form]
    p0 = jnp.linspace(-1.0, 1.0, 512 * 256, dtype=jnp.float32).reshape(512, 256)
    opt = getattr(lucid.optim.torchao, cls)([lucid.Parameter(p0)], lr=1e-2)
    hyper, flags = opt.rule.split(opt.param_groups[0])
    h = {k: jnp.asarray(v, jnp.float32) for k, v in _apply.pack(opt.rule, hyper).items()}
    results = []
    for opted in ("1", ""):
        monkeypatch.setenv(_platform.TRITON_OPT_IN, opted)
        _platform.triton_backend.cache_clear()
        try:

            @jax.jit
            def update(p, g, s):
                return _apply.apply_leaf(opt.rule, flags, h, p, g, s)

            p, state = p0, _apply.init_leaf(opt.rule, flags, h, p0)
            text = update.lower(p, p, state).compile().as_text()
            assert ("triton" in text.lower()) == (opted == "1" or not _deprecated())
            for step in range(3):
                p, state = update(p, jnp.full_like(p, 0.1 * (step + 1)), state)
            results.append(np.asarray(p))
        finally:
            _platform.triton_backend.cache_clear()
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


def _deprecated() -> bool:
    return jax.__version_info__[:2] >= _platform.TRITON_DEPRECATED_FROM
