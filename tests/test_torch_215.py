"""torch 2.15's changes to the optimizer shell, which lucid follows, against torch 2.13.

torch 2.13 is the oracle of the suite, so each change is tested against what 2.13
computes the same way (docs/optimizers/index.md, "torch 2.15", lists them all):

* a bare ``set`` of parameters: 2.15 warns (``FutureWarning``) and goes on as 2.13 does,
  with the parameters in the set's order;
* Adam and AdamW take the first two of a longer ``betas`` (2.13 stored it whole and
  failed at the first step): the same numbers as 2.13 given those two.

The other changes are tested beside their optimizers: Muon (``tests/test_muon.py``),
LBFGS (``tests/test_lbfgs.py``, ``tests/test_lbfgs_functional.py``), ASGD's checks
(``tests/test_validation.py``), and ``lucid.optim.functional``
(``tests/test_optim_functional.py``).
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

SET_WARNING = "optimizer parameters need to be organized in ordered collections"


@pytest.mark.parametrize("name", ["SGD", "Adam", "LBFGS", "Muon"])
def test_a_set_of_parameters_warns_as_torch_215_and_is_taken_as_torch_213_takes_it(name):
    """torch 2.13 takes a set silently, in the set's order; 2.15 says the order changes
    between runs. The warning points at the caller's line."""
    p, q = lucid.Parameter(jnp.ones((2, 2))), lucid.Parameter(jnp.zeros((2, 2)))
    tp, tq = torch.ones(2, 2, requires_grad=True), torch.zeros(2, 2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        theirs = getattr(torch.optim, name)({tp, tq})  # torch 2.13: not a word
    with pytest.warns(FutureWarning, match=SET_WARNING) as record:
        ours = getattr(lucid.optim, name)({p, q})
    assert len(record) == 1 and record[0].filename == __file__
    assert len(theirs.param_groups[0]["params"]) == 2
    assert set(ours.param_groups[0]["params"]) == {p, q}
    expected = {k: v for k, v in theirs.param_groups[0].items() if k != "params"}
    if name == "LBFGS":
        expected["maximize"] = False  # torch 2.15's key (tests/test_lbfgs.py)
    if name == "Muon":
        expected["batched_matrices"] = False  # lucid's keyword (tests/test_muon_batched.py)
    assert {k: v for k, v in ours.param_groups[0].items() if k != "params"} == expected


def test_a_list_or_a_set_in_a_group_is_as_in_torch_213():
    """No warning for a list; a set as a group's ``params`` is a TypeError in both."""
    p = lucid.Parameter(jnp.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lucid.optim.SGD([p], lr=0.1)
        lucid.optim.SGD((p,), lr=0.1)
    with pytest.raises(TypeError, match=SET_WARNING):
        torch.optim.SGD([{"params": {torch.ones(2, requires_grad=True)}}])
    with pytest.raises(TypeError, match=SET_WARNING):
        lucid.optim.SGD([{"params": {p}}])


def _adam_steps(library, name, betas, steps=4):
    rng = np.random.default_rng(3)
    init, grads = rng.normal(size=5), [rng.normal(size=5) for _ in range(steps)]
    if library == "torch":
        w = torch.tensor(init, requires_grad=True)
        opt = getattr(torch.optim, name)([w], lr=0.1, betas=betas)
        for g in grads:
            w.grad = torch.tensor(g)
            opt.step()
        return w.detach().numpy(), opt.param_groups[0]["betas"]
    w = lucid.Parameter(jnp.asarray(init))
    opt = getattr(lucid.optim, name)([w], lr=0.1, betas=betas)
    for g in grads:
        w.grad = jnp.asarray(g)
        opt.step()
    return np.asarray(w.data), opt.param_groups[0]["betas"]


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("betas", [(0.8, 0.99, 0.5), [0.8, 0.99, 0.5, 0.1]], ids=["tuple", "list"])
def test_adam_takes_the_first_two_of_longer_betas_as_torch_215(name, betas):
    """torch 2.13 given the first two computes what 2.15 computes given them all."""
    expected, theirs = _adam_steps("torch", name, tuple(betas[:2]))
    actual, ours = _adam_steps("lucid", name, betas)
    assert ours == theirs == tuple(betas[:2]) and type(ours) is tuple
    np.testing.assert_allclose(actual, expected, rtol=1e-12)
    # torch 2.13 itself stores them all and fails at the first step
    assert len(torch.optim.Adam([torch.ones(2)], betas=betas).param_groups[0]["betas"]) > 2
    with pytest.raises(ValueError, match="too many values"):
        _adam_steps("torch", name, betas)


def test_the_functional_adam_takes_the_first_two_as_its_class():
    import lucid.functional as LF

    params = {"w": jnp.asarray([1.0, -2.0])}
    grads = {"w": jnp.asarray([0.5, -1.0])}
    for factory in (LF.adam, LF.adamw):
        longer, two = factory(betas=(0.8, 0.9, 0.1)), factory(betas=(0.8, 0.9))
        ours, _ = longer.update(grads, longer.init(params), params)
        theirs, _ = two.update(grads, two.init(params), params)
        np.testing.assert_array_equal(ours["w"], theirs["w"])


def test_other_optimizers_still_refuse_longer_betas_before_stepping():
    """Only Adam and AdamW changed: torch 2.15's Adamax, NAdam, RAdam and SparseAdam fail
    at the first step as 2.13's do; lucid refuses at construction (docs/bad_input.md)."""
    for name in ("Adamax", "NAdam", "RAdam"):
        with pytest.raises(ValueError, match="betas must be a pair"):
            getattr(lucid.optim, name)([lucid.Parameter(jnp.ones(2))], betas=(0.9, 0.99, 0.5))
