"""fused_step: forward, backward and update as one executable, equal to the
eager loop and to torch."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from oracle import count_compiles, loss_jax, loss_torch, problem
from test_shell import _assert_params_close, _lucid_step

import lucid


def _params():
    return {k: lucid.Parameter(jnp.asarray(v)) for k, v in sorted(problem().items())}


@pytest.mark.parametrize(
    "name,options",
    [
        ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
        ("Adam", {"lr": 0.01, "amsgrad": True}),
        ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
        ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.5}),
    ],
)
def test_fused_step_matches_torch_and_returns_the_loss(name, options):
    params = _params()
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in sorted(problem().items())}
    opt = getattr(lucid.optim, name)(list(params.values()), **options)
    topt = getattr(torch.optim, name)(list(tparams.values()), **options)
    fused = lucid.optim.fused_step(loss_jax, opt)
    assert fused.compiled is lucid.compile_optimizer(opt)
    for _ in range(30):
        before = {k: p.data for k, p in params.items()}
        loss = fused(params)
        assert float(loss) == pytest.approx(float(loss_jax(before)), rel=1e-12)
        topt.zero_grad()
        loss_torch(tparams).backward()
        topt.step()
        _assert_params_close(params, tparams)  # .data is current after every call
    sd, tsd = opt.state_dict(), topt.state_dict()
    for index, state in tsd["state"].items():
        for key, value in state.items():
            chex.assert_trees_all_close(
                np.asarray(sd["state"][index][key]), value.numpy(), rtol=1e-9
            )


def test_fused_step_compiles_once_under_a_scheduler_and_mixes_with_plain_opt_steps():
    """Fused calls and `opt.step()` on the same (compiled) optimizer share one state:
    a plain step after 21 fused ones continues the eager reference exactly."""
    params = _params()
    opt = lucid.optim.Adam(list(params.values()), lr=0.01)
    sched = lucid.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    fused = lucid.optim.fused_step(loss_jax, opt)
    fused(params)
    sched.step()
    with count_compiles() as compiled:
        for _ in range(20):
            fused(params)
            sched.step()
    assert len(compiled) == 0
    reference = _params()
    ref_opt = lucid.optim.Adam(list(reference.values()), lr=0.01)
    ref_sched = lucid.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=20)
    for _ in range(21):
        _lucid_step(ref_opt, reference)
        ref_sched.step()
    _lucid_step(opt, params)  # an ordinary step on the same compiled optimizer
    _lucid_step(ref_opt, reference)
    for k in params:
        chex.assert_trees_all_close(params[k].data, reference[k].data, rtol=1e-12)


def test_fused_step_with_extra_arguments_and_constants():
    w = lucid.Parameter(jnp.ones(3))
    frozen = lucid.Parameter(jnp.full(3, 2.0))  # not in the optimizer: a constant
    opt = lucid.optim.SGD([w], lr=0.1)
    fused = lucid.optim.fused_step(
        lambda m, x, scale=1.0: scale * jnp.sum((m[0] * m[1] - x) ** 2), opt
    )
    x = jnp.asarray([1.0, 2.0, 3.0])
    fused((w, frozen), x, scale=0.5)
    expected = 1.0 - 0.1 * 0.5 * 2 * (2.0 - x) * 2.0
    chex.assert_trees_all_close(w.data, expected, rtol=1e-12)
    chex.assert_trees_all_close(frozen.data, jnp.full(3, 2.0))


@pytest.mark.parametrize("shared", [False, True], ids=["fused", "shared-params-fallback"])
def test_fused_step_with_torchs_clipping_matches_a_torch_loop(shared):
    """fused_step(grad_transform=LF.clip_grad_norm(...)) against torch's
    backward + clip_grad_norm_ + step; .grad stays as it was."""
    params = _params()
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in sorted(problem().items())}
    opt = lucid.optim.AdamW(list(params.values()), lr=0.05)
    topt = torch.optim.AdamW(list(tparams.values()), lr=0.05)
    if shared:  # another compiled optimizer holds the parameters: the fused step borrows
        lucid.compile_optimizer(lucid.optim.SGD(list(params.values()), lr=0.0))
    fused = lucid.optim.fused_step(
        loss_jax, opt, grad_transform=lucid.functional.clip_grad_norm(0.5)
    )
    params["b"].grad = jnp.ones(3)
    for _ in range(8):
        fused(params)
        topt.zero_grad()
        loss_torch(tparams).backward()
        torch.nn.utils.clip_grad_norm_(list(tparams.values()), 0.5)
        topt.step()
        _assert_params_close(params, tparams)
    np.testing.assert_array_equal(np.asarray(params["b"].grad), np.ones(3))
    assert params["w"].grad is None


@pytest.mark.parametrize("accumulate", [None, 2])
def test_a_transformed_fused_step_fences_its_gradients_where_something_computes_with_them(
    monkeypatch, accumulate
):
    """With a ``grad_transform``, the gradients' program only returns them (an output is
    rounded to its dtype anyway): no fence there, one in the transform's program. With
    ``accumulate`` the program adds micro-batches' gradients, so they are fenced there
    too (torch adds each one rounded). The numbers are the eager loop's either way
    (`test_fused_step_with_torchs_clipping_matches_a_torch_loop`,
    `tests/test_clip_bitwise.py`)."""
    from lucid.optim._engine import programs

    fenced = []
    real = programs.rounded
    monkeypatch.setattr(
        programs, "rounded", lambda tree, zero: fenced.append(1) or real(tree, zero)
    )
    params = _params()
    opt = lucid.optim.AdamW(list(params.values()), lr=0.05)

    def loss(p, x):  # a loss of its own: traced here, never taken from a cache
        return loss_jax(p) * x.mean()

    fused = lucid.optim.fused_step(
        loss, opt, grad_transform=lucid.functional.clip_grad_norm(0.5), accumulate=accumulate
    )
    x = jnp.ones(3) if accumulate is None else jnp.ones((accumulate, 3))
    fused(params, x)
    assert len(fenced) == (1 if accumulate is None else 2)


def test_lucid_clip_grad_norm_transform_is_torchs_formula_not_optaxs():
    grads = {"w": jnp.array([3.0, 4.0]), "b": jnp.array([0.0, 12.0])}  # total norm 13
    tw, tb = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    tw.grad, tb.grad = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 12.0])
    torch.nn.utils.clip_grad_norm_([tw, tb], 13.0)  # 13 / (13 + 1e-6) < 1: torch scales
    updates, _ = lucid.functional.clip_grad_norm(13.0).update(grads, None)
    np.testing.assert_allclose(np.asarray(updates["w"]), tw.grad.numpy(), rtol=1e-7)
    assert float(updates["w"][0]) < 3.0  # optax's clip_by_global_norm would leave 3.0


def test_a_stateless_grad_transform_begins_from_shapes_and_a_stateful_one_from_values(
    monkeypatch,
):
    """clip_grad_norm's state holds no array: the fused step begins it from the shapes, so
    its first call cuts no parameter out of the flat buffers (each cut is a compilation per
    distinct shape, at start-up); optax.trace's state is begun from the values, and both
    steps are backward, the transform and step one after another."""
    from lucid.optim._engine import flat_store

    cuts: list[tuple] = []
    real = flat_store._read
    monkeypatch.setattr(flat_store, "_read", lambda *a: cuts.append(a[2:]) or real(*a))

    def loss(params):
        return sum((p**3).sum() * (i + 1) for i, p in enumerate(params))

    for transform, by_hand, reads in [
        (lucid.functional.clip_grad_norm(0.5), None, False),
        (optax.trace(decay=0.5), 0.5, True),
    ]:
        params = [lucid.Parameter(jnp.asarray(v)) for v in problem().values()]
        ref_params = [lucid.Parameter(jnp.asarray(v)) for v in problem().values()]
        fused = lucid.fused_step(loss, lucid.optim.Adam(params, lr=0.1), transform)
        ref = lucid.optim.Adam(ref_params, lr=0.1)
        cuts.clear()
        fused(params)
        assert bool(cuts) == reads
        fused(params)
        traces = [jnp.zeros_like(p.data) for p in ref_params]
        for _ in range(2):
            ref.zero_grad()
            lucid.backward(loss, ref_params)
            if by_hand is None:
                lucid.nn.utils.clip_grad_norm_(ref_params, 0.5)
            else:
                traces = [p.grad + by_hand * t for p, t in zip(ref_params, traces)]
                for p, t in zip(ref_params, traces):
                    p.grad = t
            ref.step()
        for ours, theirs in zip(params, ref_params):
            chex.assert_trees_all_close(ours.data, theirs.data, rtol=1e-12)
