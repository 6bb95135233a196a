"""bitsandbytes' block-wise 8-bit quantizer (`lucid.functional.bnb.quantize_blockwise`) against
bitsandbytes' own at its edges: every one of the 65536 table bins, the midpoints between codes
(the rounding boundaries) and their float32 neighbours, zeros, NaN, infinities, subnormals,
all-equal blocks and a partial last block, in the compiled (jitted) form the optimizers use.

One documented difference: XLA flushes subnormal float32 numbers to zero, so a block whose
values are all subnormal has absmax 0 and codes 0 in lucid (bitsandbytes keeps its subnormal
absmax); subnormals inside a block with a normal absmax are coded as bitsandbytes codes them.
(Likewise a block whose absmax exceeds 2**126 has a subnormal reciprocal, flushed to zero.)
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from lucid.functional.bnb import dynamic_map, quantize_blockwise

bnbF = pytest.importorskip("bitsandbytes.functional")
warnings.filterwarnings("ignore", message=".*kernels.*")


def _edge_values(signed: bool) -> np.ndarray:
    """Blocks of 256 whose absmax is 1 (a leading 1.0 in each), so that each value is its
    own scaled value: the table's grid, the codes' midpoints and their neighbours."""
    code = dynamic_map(signed)
    grid = np.float32(-1.0) + np.float32(2.0) * np.arange(65536, dtype=np.float32) / np.float32(
        65535
    )
    mids = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    values = np.concatenate(
        [
            grid,
            mids,
            np.nextafter(mids, np.float32(-2)),
            np.nextafter(mids, np.float32(2)),
            code,
            [0.0, -0.0, 1e-45, -1e-45, 1e-39, -1e-39, 1e-38, 0.5, -0.5],  # subnormals
        ]
    ).astype(np.float32)
    if not signed:
        values = np.abs(values)
    rows = -(-values.size // 255)
    padded = np.zeros(rows * 255, np.float32)
    padded[: values.size] = values
    blocks = np.concatenate([np.ones((rows, 1), np.float32), padded.reshape(rows, 255)], axis=1)
    return blocks.reshape(-1)


def _special_blocks(signed: bool) -> np.ndarray:
    rng = np.random.default_rng(7)
    zeros = np.zeros(256, np.float32)
    equal = np.full(256, -0.37 if signed else 0.37, np.float32)
    with_nan = rng.uniform(-1, 1, 256).astype(np.float32)
    with_nan[[3, 100]] = np.nan
    with_inf = rng.uniform(-1, 1, 256).astype(np.float32)
    with_inf[5] = np.inf
    huge = (rng.uniform(-1, 1, 256) * 3e37).astype(np.float32)  # 1/absmax still normal
    all_nan = np.full(256, np.nan, np.float32)
    partial = rng.uniform(-2, 2, 77).astype(np.float32)  # a partial last block
    x = np.concatenate([zeros, equal, with_nan, with_inf, huge, all_nan, partial])
    return np.abs(x) if not signed else x


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("values", [_edge_values, _special_blocks])
def test_codes_and_absmax_equal_bitsandbytes_at_the_edges(signed, values):
    x = values(signed)
    codes, absmax = jax.jit(quantize_blockwise, static_argnums=1)(jnp.asarray(x), signed)
    code = bnbF.create_dynamic_map(signed=signed)
    theirs, state = bnbF.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=256)
    np.testing.assert_array_equal(np.asarray(absmax), state.absmax.numpy())
    np.testing.assert_array_equal(np.asarray(codes), theirs.numpy())


@pytest.mark.parametrize("signed", [True, False])
def test_a_block_of_only_subnormals_is_stored_as_zeros(signed):
    rng = np.random.default_rng(8)
    tiny = (rng.uniform(-1, 1, 256) * 1e-40).astype(np.float32)
    x = np.abs(tiny) if not signed else tiny
    codes, absmax = jax.jit(quantize_blockwise, static_argnums=1)(jnp.asarray(x), signed)
    code = bnbF.create_dynamic_map(signed=signed)
    _, state = bnbF.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=256)
    assert float(state.absmax[0]) > 0.0  # bitsandbytes keeps the subnormal absmax
    np.testing.assert_array_equal(np.asarray(absmax), [0.0])
    np.testing.assert_array_equal(np.asarray(codes), np.zeros(256, np.uint8))
