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


class TinyGPT(torch.nn.Module):
    """nanoGPT's shape of things: a square projection, a rectangular one, biases, and
    AdamW over two groups built from bare parameters (no `param_names` saved)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(3, 3)  # square: (3, 3)
        self.fc = torch.nn.Linear(3, 4)  # (out, in) = (4, 3)

    def groups(self):
        named = dict(self.named_parameters())
        decay = [n for n, p in named.items() if p.dim() >= 2]
        no_decay = [n for n, p in named.items() if p.dim() < 2]
        groups = [
            {"params": [named[n] for n in decay], "weight_decay": 0.1},
            {"params": [named[n] for n in no_decay], "weight_decay": 0.0},
        ]
        return groups, decay + no_decay


def _torch_gpt(steps):
    model = TinyGPT().double()
    groups, names = model.groups()
    opt = torch.optim.AdamW(groups, lr=0.05)
    rng = np.random.default_rng(3)
    grads = [{n: rng.normal(size=tuple(p.shape)) for n, p in model.named_parameters()}]
    grads = grads * 2 + [
        {n: rng.normal(size=tuple(p.shape)) for n, p in model.named_parameters()} for _ in range(2)
    ]
    for g in grads[:steps]:
        for n, p in model.named_parameters():
            p.grad = torch.tensor(g[n])
        opt.step()
    return model, opt, names, grads


def _lucid_gpt(model, layout_of):
    """The port: nnx-style kernels (torch's weights transposed), lucid's own names and
    order, the same two groups."""
    params = {}
    for n, p in model.named_parameters():
        value = p.detach().numpy()
        lucid_name = n.replace("weight", "kernel")
        params[lucid_name] = lucid.Parameter(jnp.array(layout_of(n, value), copy=True))
    decay = [(n, p) for n, p in params.items() if p.data.ndim >= 2][::-1]
    no_decay = [(n, p) for n, p in params.items() if p.data.ndim < 2][::-1]
    opt = lucid.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=0.05,
    )
    return params, opt


def _transposed(name, value):
    return value.T if value.ndim == 2 else value


GPT_RENAME = {"proj.weight": "proj.kernel", "fc.weight": "fc.kernel"}


def _step_both_and_compare(model, topt, params, opt, grads) -> None:
    """Step torch's GPT and lucid's (transposed weights) on the same gradients; then
    lucid's parameters must be torch's, transposed."""
    for g in grads:
        for n, p in model.named_parameters():
            p.grad = torch.tensor(g[n])
            params[GPT_RENAME.get(n, n)].grad = jnp.asarray(_transposed(n, g[n]))
        topt.step()
        opt.step()
    for n, p in model.named_parameters():
        expected = _transposed(n, p.detach().numpy())
        chex.assert_trees_all_close(np.asarray(params[GPT_RENAME.get(n, n)].data), expected)


def test_a_checkpoint_without_param_names_loads_with_torchs_names_given():
    model, topt, names, grads = _torch_gpt(2)
    saved = topt.state_dict()
    assert all("param_names" not in g for g in saved["param_groups"])
    params, opt = _lucid_gpt(model, _transposed)
    with pytest.raises(ValueError, match=r"Pass names=.*named_parameters\(\)") as caught:
        lucid.optim.from_torch(saved, opt, rename=GPT_RENAME)
    assert "build the optimizer from" not in str(caught.value)  # torch's names are missing
    with pytest.raises(ValueError, match="holds 3 names, but the torch state_dict's groups"):
        lucid.optim.from_torch(saved, opt, names=names[:3], rename=GPT_RENAME)
    layouts = {"proj.weight": lucid.optim.StateLayout.transpose()}
    layouts["fc.weight"] = lucid.optim.StateLayout.transpose()
    opt.load_state_dict(
        lucid.optim.from_torch(saved, opt, names=names, rename=GPT_RENAME, layouts=layouts)
    )
    _step_both_and_compare(model, topt, params, opt, grads[2:])
    named = torch.optim.AdamW([("a", torch.nn.Parameter(torch.ones(2)))])
    one = lucid.optim.AdamW([("a", lucid.Parameter(jnp.ones(2)))])
    with pytest.raises(ValueError, match="saved the names"):  # names other than the saved
        lucid.optim.from_torch(named.state_dict(), one, names=["b"])


def test_a_square_weight_without_a_layout_is_refused_in_words():
    """A forgotten layout for a rectangular weight fails the load's shape check; for a
    square one it would load the moments transposed without a word: refused."""
    model, topt, names, grads = _torch_gpt(2)
    saved = topt.state_dict()
    params, opt = _lucid_gpt(model, _transposed)
    rect_only = {"fc.weight": lucid.optim.StateLayout.transpose()}
    with pytest.raises(ValueError, match=r"'proj.weight' has shape \(3, 3\)") as caught:
        lucid.optim.from_torch(saved, opt, names=names, rename=GPT_RENAME, layouts=rect_only)
    assert "StateLayout.transpose()" in str(caught.value) and "default_layout" in str(caught.value)
    assert opt.state_dict()["state"] == {}
    # every parameter transposed (a bias to itself): default_layout says it once
    everything = lucid.optim.StateLayout.transpose()
    opt.load_state_dict(
        lucid.optim.from_torch(
            saved, opt, names=names, rename=GPT_RENAME, default_layout=everything
        )
    )
    _step_both_and_compare(model, topt, params, opt, grads[2:])
    # and back: the same rule for lucid -> torch
    with pytest.raises(ValueError, match=r"'proj.weight' has shape \(3, 3\)"):
        lucid.optim.to_torch_by_name(opt.state_dict(), rename=GPT_RENAME, layouts=rect_only)
    back = lucid.optim.to_torch_by_name(
        opt.state_dict(), rename=GPT_RENAME, default_layout=everything
    )
    assert back["param_groups"][0]["param_names"][0] == "fc.weight"
    assert tuple(back["state"][0]["exp_avg"].shape) == (4, 3)  # torch's layout


def test_a_model_in_torchs_layouts_says_so_with_the_identity_layout():
    model, topt, names, grads = _torch_gpt(2)
    params, opt = _lucid_gpt(model, lambda n, value: value)  # equinox keeps (out, in)
    same = {"proj.weight": lucid.optim.StateLayout.identity()}
    opt.load_state_dict(
        lucid.optim.from_torch(topt.state_dict(), opt, names=names, rename=GPT_RENAME, layouts=same)
    )
    for g in grads[2:]:
        for n, p in model.named_parameters():
            p.grad = torch.tensor(g[n])
            params[GPT_RENAME.get(n, n)].grad = jnp.asarray(g[n])
        topt.step()
        opt.step()
    for n, p in model.named_parameters():
        chex.assert_trees_all_close(
            np.asarray(params[GPT_RENAME.get(n, n)].data), p.detach().numpy()
        )
