"""Bad input: torch's error at torch's moment, with nothing changed.

Each class of bad input is tried in every form it can reach lucid (the
functional factory, the class, ``add_param_group``, ``load_state_dict``, a hand
edit of ``param_groups``; eager and compiled). torch, given the same input,
is the oracle for the exception type; the tests also check that lucid's
message names the problem and that the optimizer's state, groups and
parameters are exactly as before the failed call.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from cases import functional
from jax.experimental import sparse

import lucid

# ------------------------------------------------------------------ helpers


def _error_type(run):
    try:
        run()
    except Exception as error:  # the type is what is compared
        return type(error)
    return None


def _to_torch_value(value):
    """The torch counterpart of a hyper-parameter value (jax/NumPy arrays as tensors)."""
    if isinstance(value, jnp.ndarray | np.ndarray):
        return torch.tensor(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_to_torch_value(v) for v in value)
    return value


def _plain(value):
    """A comparable copy: arrays as NumPy, containers element by element."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.detach().numpy().copy()
    if hasattr(value, "shape") and not isinstance(value, lucid.Parameter):
        return np.array(value.todense() if hasattr(value, "todense") else value)
    return value


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True) and a.dtype == np.asarray(b).dtype
    return a is b or a == b


def _snapshot(opt, params):
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return _plain(
        {
            "state_dict": opt.state_dict(),
            "groups": groups,
            "data": [p.data for p in params],
            "grad": [p.grad for p in params],
        }
    )


def _assert_unchanged(before, opt, params, skip_groups=False):
    after = _snapshot(opt, params)
    if skip_groups:  # the caller wrote the bad value into the groups itself
        for snap in (before, after):
            snap.pop("groups")
            snap["state_dict"].pop("param_groups")
    assert _same(before, after)


def _stepped(name, options, compiled=False, shape=(2,), dtype="float32"):
    """An optimizer over two parameters that has taken one step."""
    params = [lucid.Parameter(jnp.arange(1.0, 3.0, dtype=dtype).reshape(shape)) for _ in "ab"]
    opt = getattr(lucid.optim, name)(params, **options)
    if compiled:
        opt = lucid.compile_optimizer(opt)
    for p in params:
        p.grad = jnp.full(shape, 0.5, dtype)
    if name == "LBFGS":
        opt.step(lambda: 1.0)
    else:
        opt.step()
    return opt, params


# ------------------------------------------------ 1. hyper-parameter values

LR_CASES = {
    "str": "0.01",
    "none": None,
    "list": [0.1, 0.2],
    "complex": 1j,
    "negative-jax": jnp.array(-1.0),
    "negative-numpy": np.array(-1.0),
    "negative-torch": torch.tensor(-1.0),
    "two-element-jax": jnp.array([0.1, 0.2]),
    "two-element-torch": torch.tensor([0.1, 0.2]),
}
BETAS_CASES = {
    "str": "ab",
    "str-element": (0.9, "0.99"),
    "none": None,
    "float-and-array": (0.9, jnp.array(0.99)),
    "array-out-of-range": (jnp.array(1.0), jnp.array(0.9)),
    "two-element-beta": (jnp.array([0.9, 0.8]), jnp.array(0.9)),
}
OPTIMIZERS = ["SGD", "Adam", "LBFGS", "Adagrad", "RMSprop"]


def _torch_error(name, key, value):
    param = torch.zeros(2, requires_grad=True)
    return _error_type(lambda: getattr(torch.optim, name)([param], **{key: _to_torch_value(value)}))


# deliberate difference (docs/bad_input.md): torch's range check of a multi-element beta
# fails with "Boolean value of Tensor with more than one value is ambiguous"; lucid
# raises the ValueError torch gives a multi-element lr
DIFFERS = {("betas", "two-element-beta"): (RuntimeError, ValueError)}


def _cases():
    for name in OPTIMIZERS:
        for case in LR_CASES:
            yield pytest.param(name, "lr", LR_CASES[case], case, id=f"{name}-lr-{case}")
    for case in BETAS_CASES:
        yield pytest.param("Adam", "betas", BETAS_CASES[case], case, id=f"Adam-betas-{case}")


def _message_names(error, key):
    text = str(error)
    assert key in text or {"lr": "learning rate", "betas": "beta"}[key] in text, text


@pytest.mark.parametrize(("name", "key", "value", "case"), list(_cases()))
def test_bad_hyper_parameters_fail_like_torchs_constructor_everywhere(name, key, value, case):
    expected = _torch_error(name, key, value)
    if (key, case) in DIFFERS:
        theirs, expected = DIFFERS[key, case]
        assert _torch_error(name, key, value) is theirs
    assert expected in (TypeError, ValueError), expected  # torch refuses every case
    # the functional factory and the class
    with pytest.raises(expected) as error:
        functional(name)(**{key: value})
    _message_names(error.value, key)
    with pytest.raises(expected):
        getattr(lucid.optim, name)([lucid.Parameter(jnp.zeros(2))], **{key: value})

    for compiled in (False, True):
        if name == "LBFGS" and compiled:
            continue  # compiled LBFGS has its own state: the eager forms cover its checks
        opt, params = _stepped(name, {}, compiled)
        before = _snapshot(opt, params)
        # add_param_group (LBFGS refuses a second group whatever it holds)
        if name != "LBFGS":
            extra = lucid.Parameter(jnp.zeros(2))
            with pytest.raises(expected):
                opt.add_param_group({"params": [extra], key: value})
            _assert_unchanged(before, opt, params)
        # load_state_dict's groups
        sd = opt.state_dict()
        sd["param_groups"][0][key] = value
        with pytest.raises(expected):
            opt.load_state_dict(sd)
        _assert_unchanged(before, opt, params)
        # a hand edit: checked at the next step, before anything moves
        good = opt.param_groups[0][key]
        opt.param_groups[0][key] = value
        for p in params:
            p.grad = jnp.ones(2, jnp.float32)
        before = _snapshot(opt, params)
        with pytest.raises(expected) as error:
            opt.step(lambda: 1.0) if name == "LBFGS" else opt.step()
        _message_names(error.value, key)
        _assert_unchanged(before, opt, params, skip_groups=True)
        opt.param_groups[0][key] = good


def test_an_array_lr_is_validated_then_used_by_value():
    """A valid one-element array lr (any kind) works as its number, in every form."""
    results = []
    for lr in (0.1, jnp.array(0.1), np.array([0.1]), torch.tensor(0.1)):
        p = lucid.Parameter(jnp.ones(2))
        opt = lucid.optim.SGD([p], lr=lr)
        p.grad = jnp.ones(2)
        opt.step()
        tx = lucid.functional.sgd(lr=lr)
        updates, _ = tx.update(jnp.ones(2), tx.init(jnp.ones(2)), jnp.ones(2))
        results.append((np.asarray(p.data), np.asarray(updates)))
    for data, updates in results:
        np.testing.assert_allclose(data, [0.9, 0.9], rtol=1e-6)
        np.testing.assert_allclose(updates, [-0.1, -0.1], rtol=1e-6)


def test_lbfgs_refuses_a_two_element_lr_instead_of_applying_it_elementwise():
    with pytest.raises(ValueError, match="1-element"):
        lucid.optim.LBFGS([lucid.Parameter(jnp.zeros(2))], lr=jnp.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-element"):
        torch.optim.LBFGS([torch.zeros(2, requires_grad=True)], lr=torch.tensor([1.0, 2.0]))


def test_a_traced_lr_is_checked_for_size_and_type_not_value():
    import jax

    @jax.jit
    def run(lr):
        tx = lucid.functional.adam(lr=lr)
        return tx.update(jnp.ones(2), tx.init(jnp.ones(2)), jnp.ones(2))[0]

    assert np.asarray(run(jnp.array(0.1))).shape == (2,)
    with pytest.raises(ValueError, match="1-element"):
        run(jnp.array([0.1, 0.2]))
    with pytest.raises(TypeError, match="lr"):
        run(jnp.array(0.1 + 1j))


# ------------------------------------------------------ 2. gradient types

GRAD_CASES = {"list": [0.1, 0.2], "str": "ab", "float": 0.1, "dict": {"g": 1.0}}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_gradient_of_the_wrong_python_type_is_a_type_error_at_assignment(case, compiled):
    value = GRAD_CASES[case]
    tensor = torch.zeros(2, requires_grad=True)
    assert _error_type(lambda: setattr(tensor, "grad", value)) is TypeError  # torch
    opt, params = _stepped("Adam", {}, compiled)
    before = _snapshot(opt, params)
    with pytest.raises(TypeError) as error:
        params[0].grad = value
    assert "(2,)" in str(error.value) and "float32" in str(error.value)
    assert type(value).__name__ in str(error.value)
    _assert_unchanged(before, opt, params)
    opt.step()  # and the optimizer still works


# ---------------------------------------------------- 3. sparse gradients

SPARSE_CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("SGD", {"lr": 0.1, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.1, "maximize": True, "initial_accumulator_value": 0.2}),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1}),
    ("SparseAdam", {"lr": 0.1}),
    ("Adam", {}),
    ("AdamW", {}),
    ("Adamax", {}),
    ("NAdam", {}),
    ("RAdam", {}),
    ("RMSprop", {}),
    ("Adadelta", {}),
    ("ASGD", {}),
    ("Rprop", {}),
]
INDICES, VALUES = [[0], [2], [2]], [1.0, 2.0, 0.5]  # index 2 twice: summed, as coalesce does


def _torch_sparse():
    indices = torch.tensor(INDICES).T
    values = torch.tensor(VALUES, dtype=torch.float64)
    return torch.sparse_coo_tensor(indices, values, (4,), check_invariants=True)


def _lucid_sparse():
    return sparse.BCOO((jnp.asarray(VALUES, jnp.float64), jnp.asarray(INDICES)), shape=(4,))


def _torch_run(name, options, steps=2):
    p = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    opt = getattr(torch.optim, name)([p], **options)
    try:
        for _ in range(steps):
            p.grad = _torch_sparse()
            opt.step()
    except Exception as error:
        return type(error), None
    return None, p.detach().numpy()


# torch's sparse Adagrad builds its own sparse tensor without saying whether to check its
# invariants, and torch warns once about that: expected here, torch's doing
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled:UserWarning")
@pytest.mark.parametrize(("name", "options"), SPARSE_CASES, ids=lambda v: str(v))
def test_sparse_gradients_follow_torchs_support_per_optimizer(name, options):
    expected, torch_result = _torch_run(name, options)
    for compiled in (False, True):
        params = [lucid.Parameter(jnp.asarray([1.0, 2.0, 3.0, 4.0], jnp.float64))]
        opt = getattr(lucid.optim, name)(params, **options)
        if compiled:
            opt = lucid.compile_optimizer(opt)
        if expected is None:
            for _ in range(2):
                params[0].grad = _lucid_sparse()
                opt.step()
            np.testing.assert_allclose(np.asarray(params[0].data), torch_result, rtol=1e-12)
            continue
        params[0].grad = jnp.ones(4, jnp.float64)  # a dense step first: there is state
        opt.step()
        params[0].grad = _lucid_sparse()
        before = _snapshot(opt, params)
        with pytest.raises(expected) as error:
            opt.step()
        assert "sparse" in str(error.value)
        _assert_unchanged(before, opt, params)
    # the functional form
    tx = functional(name)(**options)
    param = jnp.asarray([1.0, 2.0, 3.0, 4.0], jnp.float64)
    state = tx.init(param)
    if expected is None:
        for _ in range(2):
            updates, state = tx.update(_lucid_sparse(), state, param)
            param = param + updates
        np.testing.assert_allclose(np.asarray(param), torch_result, rtol=1e-12)
    else:
        with pytest.raises(expected, match="sparse"):
            tx.update(_lucid_sparse(), state, param)


def test_lbfgs_reads_a_sparse_gradient_densified_like_torch():
    def run(lib):
        if lib == "torch":
            p = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([p], max_iter=3)

            def closure():
                p.grad = _torch_sparse()
                return torch.tensor(1.0)

            opt.step(closure)
            return p.detach().numpy()
        p = lucid.Parameter(jnp.asarray([1.0, 2.0, 3.0, 4.0], jnp.float64))
        opt = lucid.optim.LBFGS([p], max_iter=3)

        def closure():
            p.grad = _lucid_sparse()
            return 1.0

        opt.step(closure)
        return np.asarray(p.data)

    np.testing.assert_allclose(run("lucid"), run("torch"), rtol=1e-12)
    # the compiled and functional forms (the Barzilai-Borwein step) take it as torch does
    p = lucid.Parameter(jnp.asarray([1.0, 2.0, 3.0, 4.0], jnp.float64))
    compiled = lucid.compile_optimizer(lucid.optim.LBFGS([p]))
    p.grad = _lucid_sparse()
    compiled.step()
    expected = [1.0 - 1.0, 2.0, 3.0 - 2.5, 4.0]
    np.testing.assert_allclose(np.asarray(p.data), expected, rtol=1e-12)


@pytest.mark.parametrize("form", ["eager", "compiled", "functional"])
def test_sparse_adam_refuses_an_out_of_bounds_index_like_torch(form):
    p = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SparseAdam([p])
    p.grad = torch.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,), check_invariants=False)
    with pytest.raises(IndexError):
        opt.step()

    bad = sparse.BCOO((jnp.asarray([1.0, 2.0]), jnp.asarray([[0], [5]])), shape=(3,))
    if form == "functional":
        tx = lucid.functional.sparse_adam()
        with pytest.raises(IndexError, match="out of bounds"):
            tx.update(bad, tx.init(jnp.zeros(3)), jnp.zeros(3))
        return
    params = [lucid.Parameter(jnp.zeros(3))]
    opt = lucid.optim.SparseAdam(params)
    if form == "compiled":
        opt = lucid.compile_optimizer(opt)
    params[0].grad = sparse.BCOO.fromdense(jnp.asarray([1.0, 0.0, 1.0]))
    opt.step()
    params[0].grad = bad
    before = _snapshot(opt, params)
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        opt.step()
    _assert_unchanged(before, opt, params)


def test_jax_padding_in_a_sparse_gradient_is_not_an_error():
    """``bcoo_sum_duplicates`` under jit pads with out-of-bounds indices holding zero."""
    padded = sparse.BCOO((jnp.asarray([1.0, 0.0]), jnp.asarray([[0], [3]])), shape=(3,))
    params = [lucid.Parameter(jnp.zeros(3))]
    opt = lucid.optim.SparseAdam(params, lr=0.1)
    params[0].grad = padded
    opt.step()
    np.testing.assert_allclose(np.asarray(params[0].data), [-0.1, 0.0, 0.0], rtol=1e-5)


# ------------------------------------------------------- 4. checkpoints

DTYPES = ["float16", "bfloat16", "float32", "float64"]


def _torch_adam(dtype):
    p = torch.tensor([1.0, -2.0, 3.0], dtype=getattr(torch, dtype), requires_grad=True)
    opt = torch.optim.Adam([p], lr=0.1)
    for _ in range(2):
        p.grad = torch.tensor([0.5, 0.25, -1.0], dtype=p.dtype)
        opt.step()
    return p, opt


def _state_bits(sd):
    return {
        i: {k: np.asarray(lucid._arrays.to_array(v)).astype(np.float64) for k, v in s.items()}
        for i, s in sd["state"].items()
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_checkpoints_of_every_shared_float_dtype_load_both_ways(dtype, compiled):
    tp, topt = _torch_adam(dtype)
    p = lucid.Parameter(jnp.asarray(np.asarray(tp.detach().float().numpy()), dtype))
    opt = lucid.optim.Adam([p], lr=0.1)
    if compiled:
        opt = lucid.compile_optimizer(opt)
    opt.load_state_dict(topt.state_dict())  # torch -> lucid
    ours = opt.state_dict()
    assert str(ours["state"][0]["exp_avg"].dtype) == dtype
    assert _same(_state_bits(ours), _state_bits(topt.state_dict()))

    converted = lucid.optim.to_torch(ours)  # lucid -> torch, and through torch.save
    buffer = io.BytesIO()
    torch.save(converted, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded["state"][0]["exp_avg"].dtype == getattr(torch, dtype)
    fresh = torch.optim.Adam([tp], lr=0.1)
    fresh.load_state_dict(loaded)
    assert _same(_state_bits(fresh.state_dict()), _state_bits(ours))
    opt.load_state_dict(loaded)  # and back into lucid
    assert _same(_state_bits(opt.state_dict()), _state_bits(ours))


@pytest.mark.parametrize("how", ["pickle", "numpy"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_state_dict_saved_with_pickle_or_numpy_reloads(tmp_path, how, compiled):
    opt, _ = _stepped("Adam", {"amsgrad": True}, compiled, dtype="bfloat16")
    sd = opt.state_dict()
    path = tmp_path / "ckpt.npy"
    if how == "pickle":
        path.write_bytes(pickle.dumps(sd))
        loaded = pickle.loads(path.read_bytes())
    else:
        np.save(path, sd, allow_pickle=True)
        loaded = np.load(path, allow_pickle=True).item()
    other, _ = _stepped("Adam", {"amsgrad": True}, compiled, dtype="bfloat16")
    other.load_state_dict(loaded)
    assert _same(_plain(other.state_dict()), _plain(sd))


def test_a_lucid_state_dict_without_to_torch_is_refused_by_weights_only_loading():
    """torch's rule, stated in the docs: weights_only=True reads tensors and plain values."""
    opt, _ = _stepped("Adam", {})
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "dtype",
    ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "bfloat16", "float16"],
)
def test_every_float_dtype_torch_and_jax_share_converts_exactly(dtype):
    if not hasattr(jnp, dtype) or not hasattr(torch, dtype):
        pytest.skip(f"{dtype} is not in both libraries here")
    t = torch.tensor([0.5, -1.0, 2.0, 0.0]).to(getattr(torch, dtype))
    array = lucid._arrays.to_array(t)
    assert array.dtype == jnp.dtype(getattr(jnp, dtype))
    back = lucid.optim.to_torch({"x": jnp.asarray(array)})["x"]
    assert back.dtype == t.dtype and torch.equal(back.view(torch.uint8), t.view(torch.uint8))


# ---------------------------------------------- 5. float64 without x64

_X64_SCRIPT = textwrap.dedent(
    """
    import warnings
    import numpy as np
    import torch
    import lucid

    def warned(data):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lucid.Parameter(data)
        return [str(w.message) for w in caught]

    for data in (np.zeros(2), np.float64(1.0), torch.zeros(2, dtype=torch.float64)):
        messages = warned(data)
        assert len(messages) == 1 and "jax_enable_x64" in messages[0], messages
    for data in (0.5, [0.5, 1.5], np.zeros(2, np.float32)):
        assert warned(data) == [], data
    print("ok")
    """
)


def test_a_float64_parameter_without_x64_warns_how_to_enable_it(tmp_path):
    script = tmp_path / "x64.py"
    script.write_text(_X64_SCRIPT)
    env = {**os.environ, "JAX_ENABLE_X64": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_a_sparse_array_is_not_a_parameter():
    with pytest.raises(ValueError, match="dense"):
        lucid.Parameter(sparse.BCOO.fromdense(jnp.ones(3)))


def test_deepcopy_of_a_group_with_an_array_lr_survives_state_dict():
    p = lucid.Parameter(jnp.zeros(2))
    opt = lucid.optim.SGD([p], lr=jnp.array(0.5))
    sd = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(sd)
    p.grad = jnp.ones(2)
    opt.step()
    np.testing.assert_allclose(np.asarray(p.data), [-0.5, -0.5])
