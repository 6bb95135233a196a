"""State for a parameter that no param group lists: torch's `state_dict()` raises `KeyError`
(it cannot give such a key an index), for your own Optimizer subclass and for a built-in
optimizer whose parameter was removed from its group by hand; lucid raises it too instead of
dropping the state without a word.

These tests need the change to `Optimizer.state_dict` described in issue 20's part 6 report
(lucid/optim/optimizer.py); they fail until it is made."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch

import lucid


class TorchMine(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["steps"] = self.state[p].get("steps", 0) + 1


class LucidMine(lucid.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["steps"] = self.state[p].get("steps", 0) + 1


@pytest.mark.parametrize("entry", ["values", "empty"])
def test_your_own_optimizer_with_state_for_a_parameter_in_no_group_raises_keyerror(entry):
    w, stray = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    lw, lstray = lucid.Parameter(jnp.zeros(2)), lucid.Parameter(jnp.zeros(3))
    theirs, ours = TorchMine([w]), LucidMine([lw])
    theirs.step()
    ours.step()
    if entry == "values":
        theirs.state[stray]["momentum"] = torch.ones(3)
        ours.state[lstray]["momentum"] = jnp.ones(3)
    else:  # reading a missing entry of the defaultdict makes an empty one, in both
        assert theirs.state[stray] == {} and ours.state[lstray] == {}
    with pytest.raises(KeyError):
        theirs.state_dict()
    with pytest.raises(KeyError, match="in no parameter group"):
        ours.state_dict()
    # once the stray state is gone, both save again, the same entries
    del theirs.state[stray]
    del ours.state[lstray]
    assert ours.state_dict()["state"] == theirs.state_dict()["state"] == {0: {"steps": 1}}


def test_your_own_optimizer_with_a_parameter_removed_from_its_group_raises_keyerror():
    tparams = [torch.zeros(2, requires_grad=True) for _ in range(2)]
    params = [lucid.Parameter(jnp.zeros(2)) for _ in range(2)]
    theirs, ours = TorchMine(tparams), LucidMine(params)
    theirs.step()
    ours.step()
    del theirs.param_groups[0]["params"][1]
    del ours.param_groups[0]["params"][1]
    with pytest.raises(KeyError):
        theirs.state_dict()
    with pytest.raises(KeyError, match="in no parameter group"):
        ours.state_dict()


def test_a_built_in_optimizer_with_a_parameter_removed_from_its_group_raises_keyerror():
    tparams = [torch.zeros(2, requires_grad=True) for _ in range(2)]
    params = [lucid.Parameter(jnp.zeros(2)) for _ in range(2)]
    theirs, ours = torch.optim.Adam(tparams), lucid.optim.Adam(params)
    for tp, p in zip(tparams, params):
        tp.grad = torch.ones(2)
        p.grad = jnp.ones(2)
    theirs.step()
    ours.step()
    del theirs.param_groups[0]["params"][1]
    del ours.param_groups[0]["params"][1]
    with pytest.raises(KeyError):
        theirs.state_dict()
    with pytest.raises(KeyError, match="in no parameter group"):
        ours.state_dict()
