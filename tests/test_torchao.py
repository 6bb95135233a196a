"""torchao's low-bit Adams (`lucid.optim.torchao`, `lucid.functional.torchao`) against torchao.

torchao 0.18 runs on the CPU with its `torch.compile` turned off
(``TORCHDYNAMO_DISABLE=1``, set here before torchao is imported). Both sides get
the same gradients at every step (drawn once, heavy-tailed so that the blocks
span several decades), so what is compared is the optimizer alone.

**Stored codes.** lucid's float32 arithmetic is torch's up to one rounding in a
few places: torch's CPU ``lerp`` is one fused multiply-add, and XLA turns a
division by a broadcast scalar (``m / (1 - beta1**t)``, ``x / scale`` of a
block) into a multiplication by its reciprocal. The moments therefore agree to
an ulp, and a code differs only where the float32 value lies within an ulp of a
rounding boundary between two codes: then the codes differ by exactly one
(checked), with a probability of about an ulp over the code gap, 2^-23 / 0.007
~ 2e-5 per stored code for the 8-bit map (whose smallest relative gap over the
values that occur is ~0.7%); the tests allow 1e-4 of all stored codes. Once a
code differs, that element's state (and parameter) follow a slightly different
path: such elements are tracked and bounded by Adam's largest step, and every
other element must match to float32 rounding.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import dataclasses
import io
import math
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
ao = pytest.importorskip("torchao.optim")

from torchao.optim import quant_utils, subclass_4bit, subclass_8bit, subclass_fp8  # noqa: E402

import lucid  # noqa: E402
import lucid.functional.torchao as LT  # noqa: E402
from lucid.functional.torchao.adam import FORM_OF  # noqa: E402
from lucid.optim._registry import registered  # noqa: E402

NAMES = tuple(entry.name for entry in registered("torchao"))
FUNCTIONAL = {entry.name: entry.transform for entry in registered("torchao")}
SUBCLASSES = (
    subclass_8bit.OptimState8bit,
    subclass_4bit.OptimState4bit,
    subclass_fp8.OptimStateFp8,
)
STEPS = 12
BIG = (2, 4096)  # quantized (8192 elements)
SMALL = (3, 5)  # full precision (fewer than 4096 elements)
ODD = (4100,)  # >= 4096 elements, but no multiple of the block: full precision
ATOL = 5e-6  # float32 rounding over STEPS steps of unit-size parameters (~1 ulp a step)
FLIP_RATE = 1e-4  # stored codes that may differ by one (see the module docstring)


def _form(name: str) -> str:
    return FORM_OF[getattr(lucid.optim.torchao, name).rule]


def _grads(shapes: list[tuple], steps: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [(rng.normal(size=s) * np.exp(2 * rng.normal(size=s))).astype(np.float32) for s in shapes]
        for _ in range(steps)
    ]


def _init(shapes: list[tuple], seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


# ------------------------------------------------------------------ the state, both sides


def _torch_codes(value: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes as ordinals, scale) of a torchao state tensor; None for a plain tensor."""
    if not isinstance(value, SUBCLASSES):
        return None
    return _ordinals(value.codes.view(torch.uint8).numpy(), value), value.scale.numpy()


def _ordinals(raw: np.ndarray, like: Any) -> np.ndarray:
    """Codes as integers whose difference counts codes: 4-bit nibbles unpacked, fp8 bit
    patterns as signed magnitudes (adjacent fp8 values differ by one)."""
    raw = raw.astype(np.int64)
    if isinstance(like, subclass_4bit.OptimState4bit) or (isinstance(like, str) and like == "4bit"):
        return np.stack([raw >> 4, raw & 0xF], -1).reshape(-1)
    if isinstance(like, subclass_fp8.OptimStateFp8) or (isinstance(like, str) and like == "fp8"):
        magnitude = raw & 0x7F
        return np.where(raw & 0x80, -magnitude, magnitude).reshape(-1)
    return raw.reshape(-1)


def _lucid_codes(value: Any, form: str) -> tuple[np.ndarray, np.ndarray] | None:
    if not isinstance(value, dict):
        return None
    return _ordinals(np.asarray(value["codes"]).view(np.uint8), form), np.asarray(value["scale"])


def _dequantized(value: Any) -> np.ndarray:
    if isinstance(value, SUBCLASSES):
        return value.dequantize().float().numpy().reshape(-1)
    if isinstance(value, dict):
        form = "fp8" if np.asarray(value["codes"]).dtype == jnp.float8_e4m3fn else None
        table = value.get("qmap")
        if form is None:
            form = "8bit" if np.asarray(table).size == 256 else "4bit"
        signed = form != "fp8" and float(np.asarray(table)[0]) < 0
        return np.asarray(
            LT.dequantize(value["codes"], value["scale"], form, signed, (-1,))
        ).reshape(-1)
    if isinstance(value, torch.Tensor):
        return value.float().numpy().reshape(-1)
    return np.asarray(value, np.float32).reshape(-1)


@dataclasses.dataclass
class Tracker:
    """Follows the stored codes of every quantized moment, step by step."""

    form: str
    stored: int = 0  # codes written so far
    flips: int = 0  # codes that came to differ while their element's state was equal
    marked: dict = dataclasses.field(default_factory=dict)  # (param, moment) -> bool mask
    lr: float = 1e-3  # the largest lr of the run
    path: dict = dataclasses.field(default_factory=dict)  # param -> sum of |torchao's moves|
    wild: dict = dataclasses.field(default_factory=dict)  # param -> ever moved > 10 lr

    def moved(self, index: int, before: np.ndarray, after: np.ndarray) -> None:
        move = np.abs(after - before)
        self.path[index] = self.path.get(index, 0.0) + move
        self.wild[index] = self.wild.get(index, False) | (move > 10 * self.lr)

    def compare(self, t_state: dict, l_state: dict, index: int, size: int) -> None:
        for moment, t_value in t_state.items():
            if moment == "step":
                continue
            t_codes = _torch_codes(t_value)
            l_codes = _lucid_codes(l_state[moment], self.form)
            assert (t_codes is None) == (l_codes is None), moment
            if t_codes is None:
                continue
            (tc, ts), (lc, ls) = t_codes, l_codes
            assert tc.shape == lc.shape and ts.shape == ls.shape
            key = (index, moment)
            before = self.marked.get(key, np.zeros(size, bool))
            differ = tc != lc
            new = differ & ~before
            # a code that comes to differ from an equal state differs by exactly one
            assert np.all(np.abs(tc - lc)[new] == 1), np.abs(tc - lc)[new]
            self.stored += tc.size
            self.flips += int(new.sum())
            # an element whose state differs may become its block's max: the whole
            # block's scale, hence its dequantized values, may then part too
            block = size // ts.size
            self.marked[key] = before | np.repeat(differ.reshape(-1, block).any(-1), block)

    def elements(self, index: int, size: int) -> np.ndarray:
        """Elements of param ``index`` whose stored state ever differed (any moment):
        their later steps may follow another path."""
        mask = np.zeros(size, bool)
        for (i, _), marked in self.marked.items():
            if i == index:
                mask |= marked
        return mask

    def check_rate(self) -> None:
        assert self.flips <= max(2, FLIP_RATE * self.stored), (self.flips, self.stored)


def _step_bound(options: dict, steps: int) -> float:
    """How far lucid's run may move beyond torchao's path where their states parted:
    Adam's step is at most about lr * (1 - beta1) / sqrt(1 - beta2), below 4 lr for
    the betas used here, while the second moment is not stored as zero; twice that
    is allowed."""
    return 8 * options.get("lr", 1e-3) * steps


def run_both(
    name: str,
    options: dict,
    shapes: list[tuple] = (BIG, SMALL),
    steps: int = STEPS,
    groups: list[dict] | None = None,
    dtype: str = "float32",
    compiled: bool = False,
) -> tuple[list, list, Any, Any, Tracker]:
    """``steps`` steps of torchao's ``name`` and lucid's on the same gradients (lucid's
    ``compiled``: through `lucid.compile_optimizer`), the stored codes compared after
    every step."""
    shapes = list(shapes)
    init, grads = _init(shapes), _grads(shapes, steps)
    tdtype = getattr(torch, dtype)
    tparams = [torch.nn.Parameter(torch.tensor(x).to(tdtype)) for x in init]
    lparams = [lucid.Parameter(jnp.asarray(x, dtype)) for x in init]

    def grouped(params: list) -> list:
        if groups is None:
            return params
        return [{**g, "params": [params[i] for i in g["params"]]} for g in groups]

    t_opt = getattr(ao, name)(grouped(tparams), **options)
    l_opt = getattr(lucid.optim.torchao, name)(grouped(lparams), **options)
    runner = lucid.compile_optimizer(l_opt) if compiled else l_opt
    lrs = [options.get("lr", 1e-3)] + [g.get("lr", 0.0) for g in groups or []]
    tracker = Tracker(_form(name), lr=max(lrs))
    for gs in grads:
        for tp, lp, g in zip(tparams, lparams, gs):
            tp.grad = torch.tensor(g).to(tdtype)
            lp.grad = jnp.asarray(g, dtype)
        _steps(t_opt, tparams, l_opt, lparams, tracker, runner)
    return tparams, lparams, t_opt, l_opt, tracker


def _flat(tp: Any) -> np.ndarray:
    return tp.detach().float().numpy().reshape(-1).copy()


def _steps(
    t_opt: Any, tparams: list, l_opt: Any, lparams: list, tracker: Tracker, runner: Any = None
) -> None:
    """One step of both (lucid's by ``runner``, if given, else ``l_opt``); the stored
    codes compared, torchao's moves recorded."""
    before = [_flat(tp) for tp in tparams]
    t_opt.step()
    (l_opt if runner is None else runner).step()
    for index, (tp, lp) in enumerate(zip(tparams, lparams)):
        tracker.moved(index, before[index], _flat(tp))
        tracker.compare(t_opt.state[tp], l_opt.state[lp], index, tp.numel())


def check_match(tparams, lparams, t_opt, l_opt, tracker, options, steps=STEPS, atol=ATOL):
    """Parameters and dequantized state: float32 rounding where no code ever differed,
    Adam's step bound where one did; and few codes differed.

    Where a second moment is stored as code 0 (below 3e-7 of its block's max, the
    floor of the 8-bit map; the 4-bit map's is 1/16) and the next gradient is small
    (``grad + weight_decay * p`` may cancel), Adam's step ``m / sqrt(v)`` is far above
    ``lr``: torchao's behaviour, and an ill-conditioned one, where an ulp of the
    parameter becomes many ulps of the step. Elements that ever moved more than
    ``10 lr`` in one step are bounded as parted ones; the others must match to float32
    rounding of the distance they travelled."""
    tracker.check_rate()
    for index, (tp, lp) in enumerate(zip(tparams, lparams)):
        mine = np.asarray(jnp.asarray(lp.data, jnp.float32)).reshape(-1)
        theirs = tp.detach().float().numpy().reshape(-1)
        parted = tracker.elements(index, tp.numel()) | tracker.wild[index]
        path = tracker.path[index]
        gap = np.abs(mine - theirs)
        within = gap <= atol + 1e-6 * np.abs(theirs) + 4e-6 * path
        assert np.all(within[~parted]), (gap[~parted & ~within], path[~parted & ~within])
        assert np.all(gap[parted] <= _step_bound(options, steps) + path[parted])
        t_state, l_state = t_opt.state[tp], l_opt.state[lp]
        assert set(t_state) == set(l_state)
        assert float(l_state["step"]) == float(t_state["step"])
        for moment in t_state:
            if moment == "step":
                continue
            a, b = _dequantized(l_state[moment]), _dequantized(t_state[moment])
            scale = max(float(np.abs(b).max()), 1e-30)
            np.testing.assert_allclose(a[~parted], b[~parted], rtol=1e-5, atol=1e-6 * scale)


# ------------------------------------------------------------------------ the code maps


@pytest.mark.parametrize(
    "bits, signed, theirs",
    [
        (8, True, subclass_8bit.get_qmap_signed),
        (8, False, subclass_8bit.get_qmap_unsigned),
        (4, True, subclass_4bit.get_qmap_signed),
        (4, False, subclass_4bit.get_qmap_unsigned),
    ],
)
def test_code_maps_are_torchaos_bit_for_bit(bits, signed, theirs):
    mine = LT.qmap(bits, signed)
    expected = np.asarray(theirs(), np.float32)
    assert mine.dtype == np.float32 and mine.shape == expected.shape
    assert np.array_equal(mine.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("columns", [False, True])
def test_codes_are_torchaos_at_every_rounding_boundary(bits, signed, columns):
    """On the same scaled values, lucid's codes are torchao's, exactly: at every
    threshold between two codes and the float32 values on either side of it, at every
    map value and its neighbours, at 0, -0, NaN, the ends and beyond, and on random
    values spread over the decades; with the bucket table read by rows and by columns
    (the CPU's chunked step)."""
    from lucid.functional._lowbit.nearest import nearest_codes, thresholds

    table = LT.qmap(bits, signed)
    cuts = thresholds(table)
    rng = np.random.default_rng(0)
    pieces = [
        cuts,
        np.nextafter(cuts, np.float32(-2)),
        np.nextafter(cuts, np.float32(2)),
        table,
        np.nextafter(table, np.float32(-2)),
        np.nextafter(table, np.float32(2)),
        [0.0, -0.0, np.nan, -1.0, 1.0, 1.0000001, -1.0000001, 1e-30, -1e-30, 1.4, 2.0, -3.0],
        rng.uniform(-1, 1, 20000),
        rng.uniform(-1, 1, 20000) ** 7,
    ]
    x = np.concatenate([np.asarray(p, np.float32) for p in pieces])
    if not signed:
        x = np.abs(x)
    quantizer = (
        quant_utils.quantize_8bit_with_qmap if bits == 8 else quant_utils.quantize_4bit_with_qmap
    )
    theirs = quantizer(torch.tensor(x), torch.tensor(table)).numpy()
    mine = jax.jit(lambda v: nearest_codes(v, table, columns))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(mine), theirs.astype(np.int32))


def test_the_cpus_fp8_rounding_by_bits_is_torchs_cast():
    """`to_fp8_by_bits` (the CPU's chunked step) gives torch's ``x.to(float8_e4m3fn)``
    bit for bit, as `to_fp8` does: on every e4m3fn value, every midpoint between two
    (the ties) and three float32 neighbours on either side, zeros, NaN, the subnormal
    range and random values over the decades up to 448."""
    from lucid.functional._lowbit.floats import to_fp8, to_fp8_by_bits

    grid = np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float32)
    grid = np.unique(grid[np.isfinite(grid)])
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    near = [(v.view(np.int32) + d).view(np.float32) for v in (grid, mids) for d in range(-3, 4)]
    rng = np.random.default_rng(2)
    spread = rng.standard_normal(50000) * 10.0 ** rng.uniform(-10, 2.6, 50000)
    special = [0.0, -0.0, np.nan, 448.0, -448.0, 2.0**-6, 2.0**-9, 2.0**-10, -(2.0**-10)]
    x = np.concatenate([*near, spread.astype(np.float32), np.float32(special)])
    x = x[~(np.abs(x) > 448.0)]  # within e4m3fn's range (NaN kept)
    theirs = torch.tensor(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    for convert in (to_fp8, to_fp8_by_bits):
        mine = np.asarray(jax.jit(convert)(jnp.asarray(x))).view(np.uint8)
        nan = np.isnan(x)
        np.testing.assert_array_equal(mine[~nan], theirs[~nan])
        assert np.all(mine[nan] & 0x7F == 0x7F)  # NaN (its sign is not compared)


@pytest.mark.parametrize("form", ["8bit", "4bit", "fp8"])
@pytest.mark.parametrize("signed", [True, False])
def test_quantize_gives_torchaos_codes_and_scales(form, signed):
    rng = np.random.default_rng(3)
    x = (rng.normal(size=8192) * np.exp(3 * rng.normal(size=8192))).astype(np.float32)
    if not signed:
        x = np.abs(x)
    x[:256] = 0.0  # an all-zero block: scale clipped at 1e-12
    block = 128 if form == "4bit" else 256
    t = torch.tensor(x)
    if form == "fp8":
        t_codes, t_scale = subclass_fp8.quantize_fp8(t, block)
        t_raw = t_codes.view(torch.uint8).numpy()
    else:
        scaled, t_scale = quant_utils.scale_tensor(t, block)
        mod = subclass_8bit if form == "8bit" else subclass_4bit
        table = torch.tensor(mod.get_qmap_signed() if signed else mod.get_qmap_unsigned())
        quantizer = (
            quant_utils.quantize_8bit_with_qmap
            if form == "8bit"
            else quant_utils.quantize_4bit_with_qmap
        )
        t_raw = quantizer(scaled, table).numpy()
        if form == "4bit":
            t_raw = (t_raw[::2] << 4) | t_raw[1::2]
    codes, scale = jax.jit(LT.quantize, static_argnums=(1, 2, 3))(
        jnp.asarray(x), form, signed, block
    )
    assert np.asarray(scale).dtype == np.float32
    assert np.array_equal(np.asarray(scale), t_scale.numpy())  # max and fp8's /448: exact
    mine = _ordinals(np.asarray(codes).view(np.uint8), form)
    theirs = _ordinals(t_raw, form)
    differ = mine != theirs
    # x / scale is one multiplication by a reciprocal in XLA: an ulp from torch's
    # quotient, so a value on a rounding boundary may land one code away
    assert np.all(np.abs(mine - theirs)[differ] == 1)
    assert differ.sum() <= max(2, FLIP_RATE * differ.size), differ.sum()
    back = LT.dequantize(codes, scale, form, signed, x.shape)
    if form == "fp8":
        expected = subclass_fp8.OptimStateFp8(t_codes, t_scale).dequantize().numpy()
    else:
        codes_t = torch.tensor(np.asarray(codes))
        cls = subclass_8bit.OptimState8bit if form == "8bit" else subclass_4bit.OptimState4bit
        extra = (x.shape,) if form == "4bit" else ()
        expected = cls(codes_t, t_scale, table, signed, *extra).dequantize().numpy()
        expected = expected.reshape(-1)
    np.testing.assert_array_equal(np.asarray(back).reshape(-1)[~differ], expected[~differ])


def test_torchaos_exception_keeps_small_and_unaligned_tensors_in_full_precision():
    assert LT.is_quantized(4096, 256) and LT.is_quantized(8192, 128)
    assert not LT.is_quantized(4095, 1) and not LT.is_quantized(4100, 256)
    w = lucid.Parameter(jnp.zeros(ODD, jnp.bfloat16))
    opt = lucid.optim.torchao.Adam8bit([w])
    w.grad = jnp.ones(ODD, jnp.bfloat16)
    opt.step()
    state = opt.state[w]
    assert state["exp_avg"].dtype == jnp.bfloat16 and state["exp_avg"].shape == ODD
    t = torch.nn.Parameter(torch.zeros(ODD, dtype=torch.bfloat16))
    t_opt = ao.Adam8bit([t])
    t.grad = torch.ones(ODD, dtype=torch.bfloat16)
    t_opt.step()
    assert type(t_opt.state[t]["exp_avg"]) is torch.Tensor


# ---------------------------------------------------------------------- parity, eager


@pytest.mark.parametrize("name", NAMES)
def test_every_optimizer_matches_torchao(name):
    options = {"lr": 1e-2, "weight_decay": 0.1}
    check_match(*run_both(name, options, shapes=[BIG, SMALL, ODD]), options)


CHUNKED = (131, 256)  # on the CPU: two loop iterations of 16,384 elements, and a remainder


@pytest.mark.parametrize(
    "name, options",
    [
        ("AdamW8bit", {"lr": 1e-2, "weight_decay": 0.1}),
        ("Adam4bit", {"lr": 1e-2}),
        ("AdamWFp8", {"lr": 1e-2}),
        ("AdamW8bit", {"lr": 1e-2, "amsgrad": True, "block_size": 128}),
    ],
)
def test_a_quantized_state_runs_in_chunks_with_torchaos_numbers(name, options, torchao_maximum):
    """A quantized state of at least one chunk of blocks takes the CPU's chunked program
    (`in_chunks`: a loop over chunks, then the remainder); its codes, scales and
    parameters are torchao's, eager and compiled alike."""
    from lucid.functional._lowbit.chunks import chunk_blocks, chunkable

    block = options.get("block_size", 128 if "4bit" in name else 256)
    size = int(np.prod(CHUNKED))
    assert chunkable(size, block) == (jax.device_count() == 1)
    assert size // block // chunk_blocks(block) == 2 and (size // block) % chunk_blocks(block)
    check_match(*run_both(name, options, shapes=[CHUNKED, SMALL], steps=4), options, steps=4)
    compiled, _ = _lucid_run(name, options, [CHUNKED, SMALL], 4, compiled=True)
    eager, _ = _lucid_run(name, options, [CHUNKED, SMALL], 4)
    for c, e in zip(compiled, eager):
        np.testing.assert_array_equal(np.asarray(c.data), np.asarray(e.data))


@pytest.mark.parametrize(
    "name, options",
    [
        ("AdamW8bit", {"lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "block_size": 128}),
        ("Adam4bit", {"lr": 2e-3, "betas": (0.95, 0.9), "block_size": 256, "weight_decay": 0.5}),
        ("AdamFp8", {"lr": 5e-3, "eps": 1e-3, "block_size": 512}),
    ],
)
def test_options_match_torchao(name, options):
    check_match(*run_both(name, options), options)


@pytest.fixture
def torchao_maximum():
    """torchao's eager step cannot run AMSGrad on quantized state: its tensor subclasses
    implement ``lerp`` (by dequantizing) but not ``maximum``. This registers the same
    dequantize-then-compute rule for ``maximum`` for the test's duration, so that
    torchao's own ``single_param_adam`` runs its AMSGrad branch as written."""
    op = torch.ops.aten.maximum.default

    def maximum(func, types, args, kwargs):
        args = [a.dequantize() if isinstance(a, SUBCLASSES) else a for a in args]
        return func(*args, **kwargs)

    for cls in SUBCLASSES:
        cls._ATEN_OP_TABLE[cls][op] = maximum
    try:
        yield
    finally:
        for cls in SUBCLASSES:
            del cls._ATEN_OP_TABLE[cls][op]


@pytest.mark.parametrize("name", ["AdamW8bit", "Adam4bit"])
def test_amsgrad_matches_torchao(name, torchao_maximum):
    options = {"lr": 1e-2, "amsgrad": True}
    check_match(*run_both(name, options), options)


def test_param_groups_with_their_own_options_match_torchao():
    options = {"lr": 1e-2}
    groups = [
        {"params": [0, 2], "lr": 3e-2, "weight_decay": 0.2},
        {"params": [1], "betas": (0.5, 0.6)},
    ]
    check_match(
        *run_both("AdamW8bit", options, shapes=[BIG, SMALL, (4096,)], groups=groups), {"lr": 3e-2}
    )


def test_bfloat16_parameters_round_to_nearest_as_torchao():
    options = {"lr": 1e-2}
    tparams, lparams, t_opt, l_opt, tracker = run_both("AdamW4bit", options, dtype="bfloat16")
    # bf16 rounding of the new parameter: one bf16 ulp (2^-8 relative) where float32
    # rounding before it tipped the other way; 3 ulps over the run
    check_match(tparams, lparams, t_opt, l_opt, tracker, options, atol=3 * 2**-7)
    assert lparams[0].data.dtype == jnp.bfloat16


def test_validation_is_torchaos():
    w = lucid.Parameter(jnp.zeros(3))
    t = torch.nn.Parameter(torch.zeros(3))
    for bad in ({"lr": -1.0}, {"eps": -1e-3}, {"betas": (1.0, 0.9)}, {"betas": (0.9, -0.1)}):
        with pytest.raises(ValueError) as theirs:
            ao.AdamW8bit([t], **bad)
        with pytest.raises(ValueError, match=f"^{theirs.value!s}$".replace("(", r"\(")):
            lucid.optim.torchao.AdamW8bit([w], **bad)
        with pytest.raises(ValueError, match=str(theirs.value).split(":")[0]):
            LT.adamw8bit(**bad)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="Invalid block_size"):
            lucid.optim.torchao.Adam4bit([w], block_size=bad)
    with pytest.raises(TypeError, match="maximize"):
        lucid.optim.torchao.Adam8bit([w], maximize=True)
    with pytest.raises(TypeError, match="weight_decay"):
        lucid.optim.torchao.Adam8bit([w], weight_decay="0.1")
    # positional order and defaults are torchao's
    import inspect

    for name in NAMES:
        theirs = inspect.signature(getattr(ao, name))
        mine = inspect.signature(getattr(lucid.optim.torchao, name))
        assert [(p.name, p.kind, p.default) for p in theirs.parameters.values()] == [
            (p.name, p.kind, p.default) for p in mine.parameters.values()
        ]
        functional = inspect.signature(FUNCTIONAL[name])
        assert list(functional.parameters) == list(theirs.parameters)[1:]


# ------------------------------------------------------------ jit, compile, the transform


def _lucid_run(name, options, shapes, steps, compiled=False):
    init, grads = _init(shapes), _grads(shapes, steps)
    params = [lucid.Parameter(jnp.asarray(x)) for x in init]
    opt = getattr(lucid.optim.torchao, name)(params, **options)
    runner = lucid.compile_optimizer(opt) if compiled else opt
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = jnp.asarray(g)
        runner.step()
    return params, runner


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", NAMES)
def test_a_nan_gradient_spoils_its_whole_block_as_in_torchao(name, compiled):
    """torchao's block scale is ``amax``, NaN for a block that holds a NaN, so from the
    next step on every parameter of that block reads NaN, and the others go on. (XLA:CPU
    reduces 4096 elements or more in a way that drops the NaN: lucid's scale must not.)"""
    shapes = [BIG, SMALL]
    init, grads = _init(shapes), _grads(shapes, 3)
    grads[0][0][1, 1000] = np.nan
    tparams = [torch.nn.Parameter(torch.tensor(x)) for x in init]
    t_opt = getattr(ao, name)(tparams, lr=1e-3)
    lparams = [lucid.Parameter(jnp.asarray(x)) for x in init]
    l_opt = getattr(lucid.optim.torchao, name)(lparams, lr=1e-3)
    runner = lucid.compile_optimizer(l_opt) if compiled else l_opt
    for gs in grads:
        for tp, lp, g in zip(tparams, lparams, gs):
            tp.grad, lp.grad = torch.tensor(g), jnp.asarray(g)
        t_opt.step()
        runner.step()
    theirs, ours = tparams[0].detach().numpy(), np.asarray(lparams[0].data)
    assert np.isnan(theirs).sum() == (128 if "4bit" in name else 256)  # the block
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_allclose(ours, theirs, atol=ATOL, equal_nan=True)
    np.testing.assert_allclose(np.asarray(lparams[1].data), tparams[1].detach().numpy(), atol=ATOL)


@pytest.mark.parametrize("name", ["Adam4bit"])
def test_compiled_step_gives_eager_numbers(name):
    options = {"lr": 1e-2, "weight_decay": 0.1}
    eager, e_opt = _lucid_run(name, options, [BIG, SMALL], 6)
    compiled, c_opt = _lucid_run(name, options, [BIG, SMALL], 6, compiled=True)
    for a, b in zip(eager, compiled):
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    e_sd, c_sd = e_opt.state_dict(), c_opt.state_dict()
    chex_equal(e_sd["state"], c_sd["state"])


def test_fused_step_gives_eager_numbers():
    """The fused step (forward, backward, update in one program) steps as `backward` and
    `step` do. The loss's gradients are exact in floating point (``x`` and ``2 p``), so both
    forms step from the same gradients: a nonlinear loss's gradient may differ in the last
    bit between the fused program and `backward`'s, and where a second moment is coded 0
    the update divides by that fresh gradient and magnifies the bit (measured: one of 8192
    parameters 1e-4 apart after three steps with ``tanh(p x)^2``)."""

    def loss(tree, x):
        return jnp.sum(tree[0] * x) + jnp.sum(tree[1] ** 2)

    x = jnp.asarray(_grads([BIG], 1)[0][0])
    runs = []
    for fused in (False, True):
        params = [lucid.Parameter(jnp.asarray(v)) for v in _init([BIG, SMALL])]
        opt = lucid.optim.torchao.AdamW8bit(params, lr=1e-2)
        step = lucid.optim.fused_step(loss, opt) if fused else None
        for _ in range(3):
            if fused:
                step(params, x)
            else:
                opt.zero_grad()
                lucid.backward(loss, params, x)
                opt.step()
        runs.append((params, opt.state_dict()["state"]))
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_allclose(np.asarray(a.data), np.asarray(b.data), rtol=1e-6, atol=1e-7)
    codes = [np.asarray(r[1][0]["exp_avg"]["codes"]) for r in runs]
    assert np.mean(codes[0] != codes[1]) <= FLIP_RATE


def chex_equal(a: Any, b: Any) -> None:
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_functional_transform_under_jit_gives_the_class_numbers():
    options = {"lr": 1e-2, "weight_decay": 0.1}
    shapes = [BIG, SMALL]
    params, opt = _lucid_run("AdamWFp8", options, shapes, 6)
    tree = {"a": jnp.asarray(_init(shapes)[0]), "b": jnp.asarray(_init(shapes)[1])}
    tx = LT.adamw_fp8(**options)
    state = tx.init(tree)
    update = jax.jit(tx.update)
    for gs in _grads(shapes, 6):
        updates, state = update({"a": jnp.asarray(gs[0]), "b": jnp.asarray(gs[1])}, state, tree)
        tree = optax.apply_updates(tree, updates)
    # constants in the transform, runtime values in the class: XLA may round one op apart
    np.testing.assert_allclose(
        np.asarray(tree["a"]), np.asarray(params[0].data), rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(tree["b"]), np.asarray(params[1].data), rtol=1e-6, atol=1e-6
    )
    shown = opt.state_dict()["state"][0]
    assert state.exp_avg["a"].dtype == jnp.float8_e4m3fn and state.exp_avg_scale["b"] is None
    np.testing.assert_array_equal(
        np.asarray(state.exp_avg["a"]).view(np.uint8),
        np.asarray(shown["exp_avg"]["codes"]).view(np.uint8),
    )
    # no float64 and no host callback in the float32 program
    text = (
        jax.jit(tx.update)
        .lower({"a": jnp.zeros(BIG, jnp.float32), "b": jnp.zeros(SMALL, jnp.float32)}, state, tree)
        .as_text()
    )
    assert "f64" not in text and "callback" not in text


def test_stored_bytes_per_parameter():
    """Measured from the arrays: codes and scales (and the 4-byte step)."""
    n = 1 << 16
    measured = {}
    for name, options in [
        ("AdamW8bit", {}),
        ("AdamWFp8", {}),
        ("AdamW4bit", {}),
        ("AdamW4bit", {"block_size": 256}),
    ]:
        w = lucid.Parameter(jnp.zeros((n // 1024, 1024)))
        compiled = lucid.compile_optimizer(getattr(lucid.optim.torchao, name)([w], **options))
        w.grad = jnp.ones_like(w.data)
        compiled.step()
        measured[name, options.get("block_size")] = (
            sum(compiled.state_bytes_per_device().values()) / n
        )
    assert measured["AdamW8bit", None] <= 2.05 and measured["AdamWFp8", None] <= 2.05
    assert measured["AdamW4bit", 256] <= 1.05
    # torchao's default 4-bit block of 128: half a byte of codes and a 4-byte scale per
    # 128 elements, for each of two moments
    assert math.isclose(measured["AdamW4bit", None], 2 * (0.5 + 4 / 128) + 4 / n)
    assert math.isclose(measured["AdamW8bit", None], 2 * (1 + 4 / 256) + 4 / n)


# ------------------------------------------------------------------------- checkpoints


def _continue(t_opt, tparams, l_opt, lparams, grads, name):
    tracker = Tracker(_form(name), lr=t_opt.param_groups[0]["lr"].item())
    for gs in grads:
        for tp, lp, g in zip(tparams, lparams, gs):
            tp.grad = torch.tensor(g)
            lp.grad = jnp.asarray(g)
        _steps(t_opt, tparams, l_opt, lparams, tracker)
    return tracker


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit", "AdamWFp8"])
def test_a_torchao_checkpoint_resumes_in_lucid(name):
    shapes, options = [BIG, SMALL], {"lr": 1e-2}
    init, grads = _init(shapes), _grads(shapes, 12)
    tparams = [torch.nn.Parameter(torch.tensor(x)) for x in init]
    t_opt = getattr(ao, name)(tparams, **options)
    for gs in grads[:6]:
        for tp, g in zip(tparams, gs):
            tp.grad = torch.tensor(g)
        t_opt.step()
    buffer = io.BytesIO()
    torch.save(t_opt.state_dict(), buffer)  # through a file, as a run resumes
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    lparams = [lucid.Parameter(jnp.array(tp.detach().numpy(), copy=True)) for tp in tparams]
    l_opt = getattr(lucid.optim.torchao, name)(lparams, lr=0.5)
    l_opt.load_state_dict(saved)
    assert l_opt.param_groups[0]["lr"] == pytest.approx(1e-2)
    tracker = _continue(t_opt, tparams, l_opt, lparams, grads[6:], name)
    check_match(tparams, lparams, t_opt, l_opt, tracker, options, steps=6)


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit", "AdamWFp8"])
def test_a_torchao_checkpoint_of_a_bfloat16_model_resumes_in_lucid(name):
    """torchao keeps a bfloat16 model's small parameters' moments as full-precision
    bfloat16 tensors (NumPy's issubdtype does not call bfloat16 a float): its saved
    state_dict loads, and so does lucid's own, and both runs go on as one."""
    shapes, options = [BIG, SMALL], {"lr": 1e-2}
    init, grads = _init(shapes), _grads(shapes, 8)
    tparams = [torch.nn.Parameter(torch.tensor(x).bfloat16()) for x in init]
    t_opt = getattr(ao, name)(tparams, **options)
    for gs in grads[:4]:
        for tp, g in zip(tparams, gs):
            tp.grad = torch.tensor(g).bfloat16()
        t_opt.step()
    buffer = io.BytesIO()
    torch.save(t_opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["state"][1]["exp_avg"].dtype == torch.bfloat16  # SMALL: full precision
    lparams = [
        lucid.Parameter(jnp.asarray(tp.detach().float().numpy(), jnp.bfloat16)) for tp in tparams
    ]
    l_opt = getattr(lucid.optim.torchao, name)(lparams, lr=0.5)
    l_opt.load_state_dict(saved)
    assert l_opt.state[lparams[1]]["exp_avg"].dtype == jnp.bfloat16
    again = getattr(lucid.optim.torchao, name)(
        [lucid.Parameter(jnp.array(lp.data)) for lp in lparams], lr=0.5
    )
    again.load_state_dict(l_opt.state_dict())  # lucid's own bfloat16 state_dict
    chex_equal(again.state_dict()["state"], l_opt.state_dict()["state"])
    tracker = Tracker(_form(name), lr=options["lr"])
    for gs in grads[4:]:
        for tp, lp, g in zip(tparams, lparams, gs):
            tp.grad = torch.tensor(g).bfloat16()
            lp.grad = jnp.asarray(g, jnp.bfloat16)
        _steps(t_opt, tparams, l_opt, lparams, tracker)
    check_match(tparams, lparams, t_opt, l_opt, tracker, options, steps=4, atol=3 * 2**-7)


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit", "AdamWFp8"])
def test_a_lucid_checkpoint_resumes_in_torchao(name, tmp_path):
    shapes, options = [BIG, SMALL], {"lr": 1e-2}
    init, grads = _init(shapes), _grads(shapes, 12)
    lparams = [lucid.Parameter(jnp.asarray(x)) for x in init]
    l_opt = getattr(lucid.optim.torchao, name)(lparams, **options)
    for gs in grads[:6]:
        for lp, g in zip(lparams, gs):
            lp.grad = jnp.asarray(g)
        l_opt.step()
    converted = lucid.optim.torchao.to_torchao(l_opt.state_dict())
    torch.save(converted, tmp_path / "opt.pt")
    converted = torch.load(tmp_path / "opt.pt", weights_only=True)
    assert isinstance(converted["state"][0]["exp_avg"], SUBCLASSES)
    assert type(converted["state"][1]["exp_avg"]) is torch.Tensor
    tparams = [torch.nn.Parameter(torch.tensor(np.asarray(lp.data))) for lp in lparams]
    t_opt = getattr(ao, name)(tparams, lr=0.5)
    t_opt.load_state_dict(converted)
    # torchao's state now holds lucid's codes exactly
    for moment in ("exp_avg", "exp_avg_sq"):
        theirs = t_opt.state[tparams[0]][moment]
        mine = l_opt.state_dict()["state"][0][moment]
        np.testing.assert_array_equal(
            theirs.codes.view(torch.uint8).numpy(), np.asarray(mine["codes"]).view(np.uint8)
        )
    tracker = _continue(t_opt, tparams, l_opt, lparams, grads[6:], name)
    check_match(tparams, lparams, t_opt, l_opt, tracker, options, steps=6)


def test_lucid_checkpoint_round_trip_and_compiled():
    params, opt = _lucid_run("Adam4bit", {"lr": 1e-2}, [BIG, SMALL], 3)
    saved = opt.state_dict()
    other = [lucid.Parameter(jnp.array(p.data)) for p in params]
    fresh = lucid.compile_optimizer(lucid.optim.torchao.Adam4bit(other, lr=1e-2))
    fresh.load_state_dict(saved)
    chex_equal(fresh.state_dict()["state"], saved["state"])
    for p, q in zip(params, other):
        p.grad = q.grad = jnp.ones_like(p.data)
    opt.step()
    fresh.step()
    for p, q in zip(params, other):
        np.testing.assert_array_equal(np.asarray(p.data), np.asarray(q.data))


def test_a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing():
    params, opt = _lucid_run("AdamW8bit", {"lr": 1e-2}, [BIG, SMALL], 2)
    before = opt.state_dict()
    _, four = _lucid_run("AdamW4bit", {"lr": 1e-2}, [BIG, SMALL], 2)
    with pytest.raises(ValueError, match="another format"):
        opt.load_state_dict(four.state_dict())
    _, other_block = _lucid_run("AdamW8bit", {"lr": 1e-2, "block_size": 128}, [BIG, SMALL], 2)
    wrong = other_block.state_dict()
    wrong["param_groups"][0]["block_size"] = 256
    with pytest.raises(ValueError, match="block_size"):
        opt.load_state_dict(wrong)
    plain = lucid.optim.AdamW(params)
    for p in params:
        p.grad = jnp.ones_like(p.data)
    plain.step()
    with pytest.raises(ValueError, match="saved by AdamW, not by torchao's AdamW8bit"):
        opt.load_state_dict(plain.state_dict())  # torch.optim's AdamW: another optimizer
    chex_equal(opt.state_dict()["state"], before["state"])


# ------------------------------------------------------------ bf16 stochastic rounding


def test_bf16_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    """torchao draws its random bits from torch's generator, so single results cannot
    match; the law can: each value goes to one of its two bfloat16 neighbours, up with
    probability (dropped bits) / 2^16, so the mean error is zero."""
    rng = np.random.default_rng(0)
    n = 1 << 16
    x = rng.normal(size=n).astype(np.float32)
    y = np.asarray(jax.jit(LT.bf16_stochastic_round)(jnp.asarray(x), jax.random.PRNGKey(1)))
    bits = x.view(np.uint32)
    down = (bits & 0xFFFF0000).view(np.float32)
    up = ((bits & 0xFFFF0000) + 0x10000).view(np.float32)
    y32 = y.astype(np.float32)
    assert np.all((y32 == down) | (y32 == up))
    p_up = (bits & 0xFFFF) / 65536.0
    # the fraction rounded up, against its expectation: a sum of n Bernoullis
    sigma = math.sqrt(np.sum(p_up * (1 - p_up)))
    assert abs(np.sum(y32 == up) - np.sum(p_up)) < 5 * sigma
    # the mean error, in units of each value's gap, is zero within 5 sigma
    error = (y32 - x) / (up - down)
    assert abs(error.mean()) < 5 * math.sqrt(np.mean(p_up * (1 - p_up)) / n)
    # torchao's rule on the same bits: reproduce it with lucid's random numbers
    theirs = quant_utils._fp32_to_bf16_sr(torch.tensor(x)).float().numpy()
    assert np.all((theirs == down) | (theirs == up))
    assert abs(np.mean(theirs == up) - np.mean(y32 == up)) < 10 * sigma / n


def test_stochastic_rounding_in_the_optimizer():
    """bf16 parameters with ``bf16_stochastic_round``: each new value is a bfloat16
    neighbour of the float32 update (the float32 run gives it), unbiased, and the
    key in the state advances, under jit and compile_optimizer alike."""
    x = np.asarray(jnp.asarray(_init([BIG])[0], jnp.bfloat16).astype(jnp.float32))
    g = _grads([BIG], 1)[0][0]
    w32 = lucid.Parameter(jnp.asarray(x))
    opt32 = lucid.optim.torchao.AdamW8bit([w32], lr=1e-2)
    w32.grad = jnp.asarray(g)
    opt32.step()
    target = np.asarray(w32.data)
    outcomes = []
    for compiled in (False, True):
        w = lucid.Parameter(jnp.asarray(x, jnp.bfloat16))
        opt = lucid.optim.torchao.AdamW8bit([w], lr=1e-2, bf16_stochastic_round=True)
        runner = lucid.compile_optimizer(opt) if compiled else opt
        w.grad = jnp.asarray(g, jnp.bfloat16)
        runner.step()
        outcomes.append(np.asarray(w.data.astype(jnp.float32)))
    bits = target.view(np.uint32)
    down = (bits & 0xFFFF0000).view(np.float32)
    up = ((bits & 0xFFFF0000) + 0x10000).view(np.float32)
    exact = down == target
    for y in outcomes:
        assert np.all((y == down) | (y == up))
        p_up = np.where(exact, 0.0, (bits & 0xFFFF) / 65536.0)
        sigma = math.sqrt(np.sum(p_up * (1 - p_up)))
        assert abs(np.sum(y == up) - np.sum(p_up)) < 5 * sigma
    np.testing.assert_array_equal(outcomes[0], outcomes[1])  # same key: same draws
    # torchao with the same options: same law (its bits from torch's generator)
    t = torch.nn.Parameter(torch.tensor(x).bfloat16())
    t_opt = ao.AdamW8bit([t], lr=1e-2, bf16_stochastic_round=True)
    t.grad = torch.tensor(g).bfloat16()
    t_opt.step()
    theirs = t.detach().float().numpy()
    near = (theirs == down) | (theirs == up)
    assert near.mean() > 0.999  # its bf16 grad differs from the float32 one in a few places


# ------------------------------------------------------------------------- convergence


def _convergence() -> Any:
    root = Path(__file__).resolve().parents[1] / "examples"
    sys.path.insert(0, str(root))
    try:
        import lowbit_convergence
    finally:
        sys.path.remove(str(root))
    return lowbit_convergence


def _relative_half_gap(bits: int) -> float:
    """The largest relative rounding error of a stored first-moment value at least 1%
    of its block's max: half the gap between neighbouring codes over their midpoint."""
    table = LT.qmap(bits, True).astype(np.float64)
    a, b = table[:-1], table[1:]
    keep = (a > 0) & (b >= 0.01)
    return float(((b - a) / (a + b))[keep].max())


@pytest.mark.parametrize("name, bits", [("8-bit AdamW", 8), ("fp8 AdamW", 8), ("4-bit AdamW", 4)])
def test_low_bit_training_reaches_the_float32_loss(name, bits):
    """The tolerance, derived: a stored moment is off by a relative error of at most
    ``eps`` (half a code gap; 11% for the 8-bit map, 71% for 4 bits; fp8's 3 mantissa
    bits give at most 6%, within the 8-bit bound). Were every update shrunk by that
    much, training would move as with a learning rate ``(1 - eps)`` times smaller,
    needing ``1 / (1 - eps)`` times the steps for the same loss. So each low-bit run
    must reach the float32 run's loss after T steps within ``T / (1 - eps)`` steps."""
    module = _convergence()
    steps = 150
    reference = module.train("32-bit AdamW", steps)[-1]
    eps = _relative_half_gap(bits)
    allowed = math.ceil(steps / (1 - eps))
    losses = module.train(name, allowed)
    assert np.all(np.isfinite(losses))
    reached = np.flatnonzero(losses <= reference)
    assert reached.size, (name, losses[-1], reference)
    assert reached[0] <= allowed
    # and the losses are not a trivial pass: the run started far above the target
    assert losses[0] > 10 * reference
