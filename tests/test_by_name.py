"""torch checkpoints matched by name, with per-parameter layouts (issue: a torch script
ported to flax.nnx or equinox): a torch run resumes in lucid with the same next steps,
and back, with lucid's parameters in other layouts and another order."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

RNG = np.random.default_rng(0)
WEIGHT = RNG.normal(size=(4, 3))  # torch: Linear(3, 4).weight, (out, in)
BIAS = RNG.normal(size=(4,))
GRADS = [(RNG.normal(size=(4, 3)), RNG.normal(size=(4,))) for _ in range(5)]
RENAME = {"fc.weight": "fc.kernel"}
LAYOUTS = {
    "fc.weight": lucid.optim.StateLayout.transpose(),  # nnx's kernel is (in, out)
    "fc.bias": lucid.optim.StateLayout.reshape((4, 1, 1), (4,)),  # equinox's conv bias
}


def _torch(steps):
    w, b = torch.tensor(WEIGHT, requires_grad=True), torch.tensor(BIAS, requires_grad=True)
    opt = torch.optim.Adam([("fc.weight", w), ("fc.bias", b)], lr=0.1, amsgrad=True)
    for gw, gb in GRADS[:steps]:
        w.grad, b.grad = torch.tensor(gw), torch.tensor(gb)
        opt.step()
    return w, b, opt


def _lucid():
    # lucid's own order and layouts: the bias first, reshaped; the weight transposed
    bias = lucid.Parameter(jnp.zeros((4, 1, 1)))
    kernel = lucid.Parameter(jnp.zeros((3, 4)))
    opt = lucid.optim.Adam([("fc.bias", bias), ("fc.kernel", kernel)], lr=0.1, amsgrad=True)
    return kernel, bias, opt


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_a_torch_run_resumes_in_lucid_by_name_and_back(mode):
    w, b, topt = _torch(2)
    kernel, bias, opt = _lucid()
    if mode == "compiled":
        lucid.compile_optimizer(opt)
    # copies: on the CPU, jax may share a NumPy view's memory, which torch updates in place
    kernel.data = jnp.array(w.detach().numpy().T, copy=True)
    bias.data = jnp.array(b.detach().numpy().reshape(4, 1, 1), copy=True)
    opt.load_state_dict(
        lucid.optim.from_torch(topt.state_dict(), opt, rename=RENAME, layouts=LAYOUTS)
    )
    for gw, gb in GRADS[2:4]:
        w.grad, b.grad = torch.tensor(gw), torch.tensor(gb)
        topt.step()
        kernel.grad, bias.grad = jnp.asarray(gw.T), jnp.asarray(gb.reshape(4, 1, 1))
        opt.step()
        chex.assert_trees_all_close(np.asarray(kernel.data), w.detach().numpy().T, rtol=1e-12)
        chex.assert_trees_all_close(np.asarray(bias.data).ravel(), b.detach().numpy(), rtol=1e-12)
    # and back: a fresh torch optimizer resumes from lucid's state
    back = lucid.optim.to_torch_by_name(opt.state_dict(), rename=RENAME, layouts=LAYOUTS)
    w2 = torch.tensor(np.asarray(kernel.data).T.copy(), requires_grad=True)
    b2 = torch.tensor(np.asarray(bias.data).ravel().copy(), requires_grad=True)
    fresh = torch.optim.Adam([("fc.bias", b2), ("fc.weight", w2)], lr=0.5, amsgrad=True)
    fresh.load_state_dict(back)
    gw, gb = GRADS[4]
    for pair in ((w, b, topt), (w2, b2, fresh)):
        pair[0].grad, pair[1].grad = torch.tensor(gw), torch.tensor(gb)
        pair[2].step()
    chex.assert_trees_all_close(w2.detach().numpy(), w.detach().numpy(), rtol=1e-12)
    chex.assert_trees_all_close(b2.detach().numpy(), b.detach().numpy(), rtol=1e-12)


def test_names_that_do_not_correspond_and_wrong_layouts_are_clear_errors():
    _, _, topt = _torch(1)
    kernel, bias, opt = _lucid()
    sd = topt.state_dict()
    with pytest.raises(ValueError, match="do not correspond"):
        lucid.optim.from_torch(sd, opt, layouts=LAYOUTS)  # fc.weight is fc.kernel here
    with pytest.raises(ValueError, match="its layout"):
        lucid.optim.from_torch(sd, opt, rename=RENAME, layouts={"fc.weight": LAYOUTS["fc.bias"]})
    with pytest.raises(ValueError, match="shape"):  # no layout: the load's own check
        opt.load_state_dict(lucid.optim.from_torch(sd, opt, rename=RENAME))
    unnamed = lucid.optim.Adam([kernel, bias], lr=0.1)
    with pytest.raises(ValueError, match="named parameters"):
        lucid.optim.from_torch(sd, unnamed, rename=RENAME, layouts=LAYOUTS)
    assert opt.state_dict()["state"] == {}  # nothing was loaded
