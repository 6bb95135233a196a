"""Sparse gradients in every stateful form give torch's numbers (float64, against torch).

torch's sparse paths change only the entries a sparse gradient stores, and run the rule
at a stored zero: SparseAdam decays its moments there, Adagrad divides ``0/0`` there when
``eps`` and the accumulator are zero, and neither touches an entry never stored. The
compiled step lays a group's gradients out in one flat buffer, so a sparse gradient
reaches its program dense, with the mask of its stored entries
(`lucid.functional._apply.Present`); these tests hold it to the eager step and to torch
where the dense rule would differ: a stored zero after nonzero values (SparseAdam), and
entries no gradient ever stores with ``eps=0`` (Adagrad). The three parameters share one
group, so the compiled step updates them in one flat buffer: two take sparse gradients
(one with duplicate entries), one a dense gradient (SparseAdam, which refuses dense
gradients: a sparse one storing every entry).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental import sparse

import lucid

SHAPES = [(4, 3), (6,), (2, 5)]
SPARSE = {0, 1}  # which parameters take sparse gradients
STEPS = 4
# per step, per sparse parameter: stored indices and values; a zero stored where an
# earlier step stored a nonzero value, and index (3, 2) / 5 / the whole last rows never
ENTRIES = [
    {0: ([[0, 1], [2, 0]], [0.5, -0.25]), 1: ([[0], [3], [3]], [0.3, 0.1, 0.2])},
    {0: ([[0, 1], [1, 2]], [0.0, 0.7]), 1: ([[0], [1]], [0.0, -0.4])},
    {0: ([[2, 0]], [0.0]), 1: ([[3]], [0.0])},
    {0: ([[0, 1], [2, 0], [1, 2]], [0.2, 0.0, -0.1]), 1: ([[1], [0]], [0.6, 0.0])},
]
CASES = [
    ("SparseAdam", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "eps": 0.0}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.5}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
]


def _init() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal(shape) for shape in SHAPES]


def _dense(step: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(100 + step).standard_normal(shape)


def _torch_run(name: str, options: dict) -> list[np.ndarray]:
    params = [torch.tensor(x, requires_grad=True) for x in _init()]
    opt = getattr(torch.optim, name)(params, **options)
    with torch.sparse.check_sparse_tensor_invariants():  # torch's own sparse tensors too
        for step in range(STEPS):
            for i, p in enumerate(params):
                if i in SPARSE:
                    indices, values = ENTRIES[step][i]
                    p.grad = torch.sparse_coo_tensor(
                        torch.tensor(indices).T, torch.tensor(values, dtype=torch.float64), p.shape
                    )
                else:  # (SparseAdam takes sparse gradients only: every entry stored)
                    grad = torch.from_numpy(_dense(step, p.shape))
                    p.grad = grad.to_sparse() if name == "SparseAdam" else grad
            opt.step()
    return [p.detach().numpy() for p in params]


def _lucid_run(name: str, options: dict, compiled: bool) -> list[np.ndarray]:
    params = [lucid.Parameter(jnp.asarray(x)) for x in _init()]
    opt = getattr(lucid.optim, name)(params, **options)
    runner = lucid.compile_optimizer(opt) if compiled else opt
    for step in range(STEPS):
        for i, p in enumerate(params):
            if i in SPARSE:
                indices, values = ENTRIES[step][i]
                p.grad = sparse.BCOO((jnp.asarray(values), jnp.asarray(indices)), shape=p.shape)
            else:
                grad = jnp.asarray(_dense(step, p.shape))
                p.grad = sparse.BCOO.fromdense(grad) if name == "SparseAdam" else grad
        runner.step()
    return [np.asarray(p.data) for p in params]


@pytest.mark.fast
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_sparse_gradients_change_what_torchs_sparse_path_changes(name, options, compiled):
    expected = _torch_run(name, options)
    actual = _lucid_run(name, options, compiled)
    for i, (ours, theirs) in enumerate(zip(actual, expected)):
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs), err_msg=f"param {i}")
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14, err_msg=f"param {i}")


def test_entries_never_stored_keep_their_values_in_the_compiled_step():
    """With ``eps=0`` the dense Adagrad rule divides ``0/0`` at every entry a sparse
    gradient does not store; the compiled step leaves them as they were."""
    init = _init()
    compiled = _lucid_run("Adagrad", {"lr": 0.1, "eps": 0.0}, compiled=True)
    np.testing.assert_array_equal(compiled[0][3], init[0][3])  # row 3: never stored
    np.testing.assert_array_equal(compiled[1][2], init[1][2])
    np.testing.assert_array_equal(compiled[1][4:], init[1][4:])
