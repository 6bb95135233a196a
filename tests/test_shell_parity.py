"""Every lucid.optim class against torch.optim through the stateful API.

Same option sets as the functional parity tests (tests/cases.py); here the
comparison covers the parameters *and* every state_dict entry, in torch's
format.
"""

from __future__ import annotations

import chex
import numpy as np
import pytest
import torch
from cases import CASES, case_id
from oracle import F32_RTOL_FLOOR, F64_RTOL, problem, relative_error, run_shell, run_torch, to_numpy

import lucid

pytestmark = pytest.mark.fast  # in `pytest -m fast` (tests/conftest.py)


def _compare_state_dicts(ours: dict, theirs: dict, rtol: float) -> None:
    assert len(ours["param_groups"]) == len(theirs["param_groups"])
    for group, torch_group in zip(ours["param_groups"], theirs["param_groups"]):
        assert group == torch_group
    assert set(ours["state"]) == set(theirs["state"])
    for index, torch_state in theirs["state"].items():
        state = ours["state"][index]
        assert set(state) == set(torch_state), f"state names of parameter {index}"
        for name, expected in torch_state.items():
            actual = np.asarray(state[name])
            expected = to_numpy(expected)
            assert actual.shape == expected.shape, name
            if actual.ndim:  # 0-d step: float32 in lucid, the default dtype in torch
                assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
            err = relative_error(actual, expected)
            assert err <= rtol, f"state {name} of parameter {index}: {err:.3g} > {rtol:.3g}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float64_shell_matches_torch(case):
    name, options = case
    init = problem()
    expected, torch_sd = run_torch(getattr(torch.optim, name), options, init, "float64")
    actual, opt = run_shell(getattr(lucid.optim, name), options, init, "float64")
    for key in expected:
        chex.assert_trees_all_close(actual[key], expected[key], rtol=F64_RTOL, atol=1e-13)
    _compare_state_dicts(opt.state_dict(), torch_sd, 1e-9)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float32_shell_matches_torch(case):
    name, options = case
    init = problem()
    cls = getattr(torch.optim, name)
    exact, _ = run_torch(cls, options, init, "float64")
    expected, torch_sd = run_torch(cls, options, init, "float32")
    actual, opt = run_shell(getattr(lucid.optim, name), options, init, "float32")
    worst_drift = 0.0
    for key in expected:
        assert actual[key].dtype == np.float32
        drift = relative_error(expected[key], exact[key])
        worst_drift = max(worst_drift, drift)
        tolerance = max(4 * drift, F32_RTOL_FLOOR)
        err = relative_error(actual[key], expected[key])
        assert err <= tolerance, f"{key}: error {err:.3g} vs torch's drift {drift:.3g}"
    _compare_state_dicts(opt.state_dict(), torch_sd, max(40 * worst_drift, 1e-4))
