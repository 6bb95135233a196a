"""Hyper-parameter validation: lucid raises exactly when torch raises, with torch's words.

Hypothesis draws values around every boundary torch checks (negative, zero,
one, beyond one); the constructor of torch's class is the oracle, and both
lucid's class and its functional transform must agree with it. Where torch 2.15 added a
check (ASGD's ``lambd`` and ``alpha``), lucid follows 2.15: ``torch_215_error`` adds it to
torch 2.13's answer, and ``test_asgd_checks_lambd_and_alpha_as_torch_215`` pins the order.
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


def torch_215_error(name: str, options: dict):
    """torch's error for these constructor options: torch 2.13's (the oracle), except for
    the checks torch 2.15 added, which come first where 2.15 puts them: ASGD's ``lambd``
    and ``alpha`` (``0 <= value``), after ``lr`` and before ``weight_decay``."""
    expected = error_of(
        lambda: getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **options)
    )
    if name != "ASGD" or error_of(
        lambda: torch.optim.ASGD([torch.zeros(2, requires_grad=True)], lr=options.get("lr", 1e-2))
    ):
        return expected  # not ASGD, or its lr check (torch 2.13's first) fails first
    for key in ("lambd", "alpha"):
        if key in options and not options[key] >= 0.0:
            return ValueError, f"Invalid {key} value: {options[key]}"
    return expected


@pytest.mark.parametrize("name", sorted(HYPERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_lucid_refuses_exactly_what_torch_refuses(name, data):
    options = data.draw(st.fixed_dictionaries({}, optional=HYPERS[name]))
    expected = torch_215_error(name, options)
    assert error_of(lambda: functional(name)(**options)) == expected
    shell = error_of(lambda: getattr(lucid.optim, name)([lucid.Parameter(jnp.zeros(2))], **options))
    assert shell == expected


@pytest.mark.parametrize("name", sorted(HYPERS))
def test_unknown_keywords_are_type_errors(name):
    with pytest.raises(TypeError):
        functional(name)(learning_rate=0.1)
    with pytest.raises(TypeError):
        getattr(lucid.optim, name)([lucid.Parameter(jnp.zeros(2))], learning_rate=0.1)


@pytest.mark.parametrize(
    "options,first",
    [
        ({"lr": -1.0, "lambd": -1.0, "alpha": -1.0, "weight_decay": -1.0}, "lr"),
        ({"lambd": -1.0, "alpha": -1.0, "weight_decay": -1.0}, "lambd"),
        ({"alpha": -0.5, "weight_decay": -1.0}, "alpha"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"lambd": 0.0, "alpha": 0.0}, None),
    ],
)
def test_asgd_checks_lambd_and_alpha_as_torch_215(options, first):
    """torch 2.15's order: lr, lambd, alpha, weight_decay. torch 2.13 checks lr and
    weight_decay only: its errors are the oracle for those two."""
    theirs = error_of(lambda: torch.optim.ASGD([torch.zeros(2, requires_grad=True)], **options))
    if first == "lambd":
        expected = (ValueError, f"Invalid lambd value: {options['lambd']}")
    elif first == "alpha":
        expected = (ValueError, f"Invalid alpha value: {options['alpha']}")
    else:
        expected = theirs  # lr, weight_decay or nothing: torch 2.13 answers the same
    assert (first in ("lambd", "alpha")) == (expected != theirs)  # 2.13 misses just these
    assert error_of(lambda: lucid.optim.ASGD([lucid.Parameter(jnp.zeros(2))], **options)) == (
        expected
    )
    assert error_of(lambda: functional("ASGD")(**options)) == expected
