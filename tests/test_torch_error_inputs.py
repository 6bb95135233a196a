"""torch's own list of bad optimizer inputs, replayed on lucid.

``optim_error_inputs_func`` in ``torch.testing._internal.common_optimizers`` is
the list torch's test suite feeds every optimizer. Each input is run on torch
here (torch is the oracle, so its outcome is observed, not copied from the
list) and on lucid with the same inputs converted (tensors become Parameters or
jax arrays; one tensor used twice becomes one Parameter used twice). Both must
fail with the same exception type at the same moment: building the optimizer,
or its first step. The few deliberate differences are named in ``DIFFERENCES``
and explained in docs/bad_input.md.
"""

from __future__ import annotations

import copy
import re
import sys
import types
import unittest
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

try:  # torch's test helpers import expecttest only for their TestCase base class
    import expecttest  # noqa: F401
except ImportError:
    sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase)

from torch.testing._internal.common_optimizers import (
    OptimizerErrorEnum,
    optim_db,
)

# (optimizer, torch's description of the input) -> why lucid answers differently
DIFFERENCES = {
    "a param group cannot have duplicate parameters": (
        "torch warns and steps the parameter twice; lucid refuses the group (ValueError)"
    ),
    "dense params required": (
        "lucid refuses a sparse array already when the Parameter is made (ValueError)"
    ),
    "dense params required in param_groups": (
        "lucid refuses a sparse array already when the Parameter is made (ValueError)"
    ),
}

LUCID = set(lucid.optim.__all__)
CASES = [
    pytest.param(info, error, id=f"{info.optim_cls.__name__}-{i}")
    for info in optim_db
    if info.optim_cls.__name__ in LUCID and info.optim_error_inputs_func is not None
    for i, error in enumerate(info.optim_error_inputs_func(device="cpu", dtype=torch.float32))
]


def _outcome(build_params, construct, step):
    """``(moment, exception type, message)`` of the first failure (or warning), or
    ``("ok", None, "")``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for moment, run in (("params", build_params), ("construction", construct), ("step", step)):
            try:
                run()
            except Exception as error:  # the type, the moment and the words are compared
                return moment, type(error), str(error)
    return "ok", None, ""


def _sample_param():
    return torch.nn.Parameter(torch.randn(1, 1))


class _Run:
    """One error input, replayed on one library."""

    def __init__(self, optim_name, error_input, to_lucid):
        # a copy: torch's add_param_group rewrites the group dicts it is given
        self.name, self.input = optim_name, copy.deepcopy(error_input)
        self.to_lucid = to_lucid
        self.params = self.kwargs = self.optimizer = None

    def build(self):
        params = self.input.params
        if params is None:  # torch's list leaves the params to the test
            params = [_sample_param()]
        self.kwargs = self.input.kwargs
        if self.to_lucid:
            memo = {}
            params, self.kwargs = _convert(params, memo), _convert(self.kwargs, memo)
        self.params = params

    def construct(self):
        library = lucid.optim if self.to_lucid else torch.optim
        self.optimizer = getattr(library, self.name)(self.params, **self.kwargs)

    def step(self):
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p = p[1] if isinstance(p, tuple) else p
                if self.to_lucid:
                    p.grad = jnp.ones(p.shape, p.dtype)
                else:
                    p.grad = torch.ones_like(p)
        if self.name == "LBFGS":
            self.optimizer.step(lambda: 1.0 if self.to_lucid else torch.tensor(1.0))
        else:
            self.optimizer.step()


def _convert(value, memo):
    """torch inputs as lucid's: a tensor as a Parameter (one per tensor) in params, as
    a jax array in options; containers element by element."""
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            if value.is_sparse:
                from jax.experimental import sparse

                dense = jnp.asarray(value.to_dense().numpy())
                memo[id(value)] = lucid.Parameter(sparse.BCOO.fromdense(dense))
            else:
                memo[id(value)] = lucid.Parameter(jnp.asarray(value.detach().numpy()))
        return memo[id(value)]
    if isinstance(value, dict):
        return {
            k: (_convert_option(v) if k != "params" else _convert(v, memo))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_convert(v, memo) for v in value)
    return value


def _convert_option(value):
    if isinstance(value, torch.Tensor):
        return jnp.asarray(value.numpy())
    if isinstance(value, tuple):
        return tuple(_convert_option(v) for v in value)
    return value


@pytest.mark.parametrize(("info", "error"), CASES)
def test_lucid_fails_like_torch_on_torchs_error_inputs(info, error):
    name = info.optim_cls.__name__
    theirs = _Run(name, error.optimizer_error_input, to_lucid=False)
    expected = _outcome(theirs.build, theirs.construct, theirs.step)
    # the harness replays torch's list faithfully: torch fails where the list says
    moment = "construction" if error.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR else "step"
    assert expected[0] == moment and issubclass(expected[1], error.error_type), expected
    assert re.search(error.error_regex, expected[2]), (error.error_regex, expected[2])

    ours = _Run(name, error.optimizer_error_input, to_lucid=True)
    got = _outcome(ours.build, ours.construct, ours.step)
    desc = error.optimizer_error_input.desc
    if desc in DIFFERENCES:
        assert got[:2] != expected[:2] and got[1] is ValueError, (desc, got)
    else:
        assert got[:2] == expected[:2], (desc, got, expected)
        # torch's words, where a user's except clause or a test matches them
        assert re.search(error.error_regex, got[2]), (desc, error.error_regex, got[2])


def test_the_deliberate_differences_are_documented():
    import pathlib

    doc = (pathlib.Path(__file__).parent.parent / "docs" / "bad_input.md").read_text()
    for desc in DIFFERENCES:
        assert desc in doc, desc
    assert len(DIFFERENCES) < 10


def test_torch_scalar_tensors_are_accepted_as_hyper_parameters_too():
    """The replay hands lucid jax arrays; torch's own 0-d tensors work the same."""
    p = lucid.Parameter(jnp.zeros(2))
    opt = lucid.optim.Adam([p], lr=torch.tensor(0.1), betas=(torch.tensor(0.9), torch.tensor(0.9)))
    p.grad = jnp.ones(2)
    opt.step()
    np.testing.assert_allclose(np.asarray(p.data), [-0.1, -0.1], rtol=1e-6)
    with pytest.raises(ValueError, match="1-element"):
        lucid.optim.Adam([p], lr=torch.tensor([0.1, 0.1]))
