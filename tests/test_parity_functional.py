"""Every lucid.functional transform against torch.optim, option by option.

50 jitted steps on the same smooth loss, gradients computed natively on each
side. float64 must agree to 1e-10 relative; float32 to a tolerance measured in
the same test from torch's own rounding drift (float32 torch against float64
torch), so a wrong rule cannot hide behind a generous constant.
"""

from __future__ import annotations

import chex
import numpy as np
import pytest
import torch
from cases import CASES, case_id, functional
from oracle import (
    F32_RTOL_FLOOR,
    F64_RTOL,
    losses,
    problem,
    relative_error,
    run_lucid,
    run_torch,
    to_numpy,
)

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)

# torch keeps no step for SGD; lucid's functional SGD keeps one to trace the first step.
LUCID_ONLY_STATE = {"SGD": {"step"}}


def _transform(name: str, options: dict):
    return functional(name)(**options)


def _assert_state_matches(name, state, torch_state, dtype, rtol):
    keys = sorted(problem())
    for field in state._fields:
        value = getattr(state, field)
        if value is None or field in LUCID_ONLY_STATE.get(name, ()):
            continue
        for index, key in enumerate(keys):
            if value[key] is None:  # a field only some leaves have (Adafactor's row_var)
                assert field not in torch_state["state"][index], (field, key)
                continue
            expected = to_numpy(torch_state["state"][index][field])
            actual = np.asarray(value[key])
            assert actual.shape == expected.shape, (field, key)
            err = relative_error(actual, expected)
            assert err <= rtol, f"state {field}[{key}]: relative error {err:.3g} > {rtol:.3g}"
    for index, key in enumerate(keys):
        ours = {f for f in state._fields if getattr(state, f) is not None}
        ours = {f for f in ours if getattr(state, f)[key] is not None}
        ours -= LUCID_ONLY_STATE.get(name, set())
        assert ours == set(torch_state["state"].get(index, {})), "state names differ from torch's"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float64_matches_torch(case):
    name, options = case
    init = problem()
    expected, torch_state = run_torch(getattr(torch.optim, name), options, init, "float64")
    actual, state = run_lucid(_transform(name, options), init, "float64", loss=losses(options)[0])
    for key in expected:
        chex.assert_trees_all_close(actual[key], expected[key], rtol=F64_RTOL, atol=1e-13)
    _assert_state_matches(name, state, torch_state, "float64", 1e-9)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float32_matches_torch_within_its_own_rounding_drift(case):
    name, options = case
    init = problem()
    cls = getattr(torch.optim, name)
    exact, _ = run_torch(cls, options, init, "float64")
    expected, _ = run_torch(cls, options, init, "float32")
    actual, _ = run_lucid(_transform(name, options), init, "float32", loss=losses(options)[0])
    for key in expected:
        assert actual[key].dtype == np.float32
        drift = relative_error(expected[key], exact[key])  # torch float32 vs float64
        tolerance = max(4 * drift, F32_RTOL_FLOOR)
        err = relative_error(actual[key], expected[key])
        assert err <= tolerance, f"{key}: error {err:.3g} vs torch's drift {drift:.3g}"


@pytest.mark.parametrize("case", CASES[::3], ids=case_id)
def test_jit_and_eager_agree(case):
    name, options = case
    init = problem()
    loss = losses(options)[0]
    jitted, _ = run_lucid(_transform(name, options), init, "float64", steps=5, loss=loss)
    eager, _ = run_lucid(_transform(name, options), init, "float64", steps=5, loss=loss, jit=False)
    chex.assert_trees_all_close(jitted, eager, rtol=1e-12)
