"""Hyper-parameter validation: lucid raises exactly when torch raises, with torch's words.

Hypothesis draws values around every boundary torch checks (negative, zero,
one, beyond one); the constructor of torch's class is the oracle, and both
lucid's class and its functional transform must agree with it.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
from cases import functional
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import error_of

import lucid

number = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 0.5, 1e-8, 2.0, -1e-8]),
    st.floats(min_value=-3.0, max_value=3.0, allow_nan=False),
)
pair = st.tuples(number, number)

HYPERS = {
    "SGD": {
        "lr": number,
        "momentum": number,
        "dampening": number,
        "weight_decay": number,
        "nesterov": st.booleans(),
    },
    "Adam": {"lr": number, "betas": pair, "eps": number, "weight_decay": number},
    "AdamW": {"lr": number, "betas": pair, "eps": number, "weight_decay": number},
    "RMSprop": {
        "lr": number,
        "alpha": number,
        "eps": number,
        "weight_decay": number,
        "momentum": number,
    },
    "Adagrad": {
        "lr": number,
        "lr_decay": number,
        "weight_decay": number,
        "initial_accumulator_value": number,
        "eps": number,
    },
    "Adadelta": {"lr": number, "rho": number, "eps": number, "weight_decay": number},
    "Adamax": {"lr": number, "betas": pair, "eps": number, "weight_decay": number},
    "RAdam": {"lr": number, "betas": pair, "eps": number, "weight_decay": number},
    "NAdam": {
        "lr": number,
        "betas": pair,
        "eps": number,
        "weight_decay": number,
        "momentum_decay": number,
    },
    "ASGD": {"lr": number, "lambd": number, "alpha": number, "t0": number, "weight_decay": number},
    "Rprop": {"lr": number, "etas": pair, "step_sizes": pair},
    "SparseAdam": {"lr": number, "betas": pair, "eps": number},
    "LBFGS": {"lr": number},
}


@pytest.mark.parametrize("name", sorted(HYPERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_lucid_refuses_exactly_what_torch_refuses(name, data):
    options = data.draw(st.fixed_dictionaries({}, optional=HYPERS[name]))
    expected = error_of(
        lambda: getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **options)
    )
    assert error_of(lambda: functional(name)(**options)) == expected
    shell = error_of(lambda: getattr(lucid.optim, name)([lucid.Parameter(jnp.zeros(2))], **options))
    assert shell == expected


@pytest.mark.parametrize("name", sorted(HYPERS))
def test_unknown_keywords_are_type_errors(name):
    with pytest.raises(TypeError):
        functional(name)(learning_rate=0.1)
    with pytest.raises(TypeError):
        getattr(lucid.optim, name)([lucid.Parameter(jnp.zeros(2))], learning_rate=0.1)
