"""Compiling changes speed, never numbers, clipping included: a clipped AdamW loop in
float32 (a small GPT in two weight-decay groups, torch's clip_grad_norm_ at 1.0) gives
bitwise the same parameters eager, compiled and fused."""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import lucid

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import gpt_model

CFG = gpt_model.SMALL
WEIGHTS = gpt_model.init_weights(CFG)
BATCHES = [jnp.asarray(b) for b in gpt_model.make_batches(CFG, 10)]
LOSS = gpt_model.make_jax_loss(CFG)


# the order clip_grad_norm_ is given the parameters in: the optimizer's (its groups one
# after the other, as the compiled step lays them out), the model's (the groups' members
# interleaved, as a port passes `model.parameters()`), and a shuffled one
ORDERS = ["groups", "model", "shuffled"]


def _train(mode: str, order: str = "groups") -> dict[str, np.ndarray]:
    params = {k: lucid.Parameter(jnp.asarray(v, jnp.float32)) for k, v in WEIGHTS.items()}
    decay = [p for p in params.values() if p.ndim == 2]
    rest = [p for p in params.values() if p.ndim != 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    opt = lucid.optim.AdamW(groups, lr=1e-3)
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    clip = lucid.functional.clip_grad_norm(max_norm=1.0)
    fused = lucid.fused_step(LOSS, opt, clip) if mode == "fused" else None
    for tokens in BATCHES:
        if fused is not None:
            fused(params, tokens)
        else:
            opt.zero_grad()
            lucid.backward(LOSS, params, tokens)
            lucid.nn.utils.clip_grad_norm_(_in_order(order, opt, params), 1.0)
            opt.step()
    return {k: np.asarray(p.data) for k, p in params.items()}


def _in_order(order: str, opt, params: dict) -> list:
    if order == "groups":
        return list(opt.parameters())
    listed = list(params.values())
    if order == "shuffled":
        rng = np.random.default_rng(0)
        listed = [listed[i] for i in rng.permutation(len(listed))]
    return listed


def _assert_bitwise(eager: dict, other: dict) -> None:
    differing = {k: int((eager[k] != other[k]).sum()) for k in eager}
    assert all(v == 0 for v in differing.values()), differing
    assert eager["h.0.attn.qkv.weight"].dtype == np.float32


@pytest.mark.parametrize("order", ORDERS)
def test_a_compiled_loop_clipped_in_any_order_is_bitwise_the_eager_one(order):
    _assert_bitwise(_train("eager", order), _train("compiled", order))


def test_a_fused_clipped_float32_loop_is_bitwise_the_eager_one():
    _assert_bitwise(_train("eager"), _train("fused"))
