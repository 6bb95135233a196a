"""Run the same problem through torch.optim and through lucid, for parity tests.

The problem is a small regression with two parameter tensors and a smooth,
non-convex loss; each side computes its gradients natively (jax.grad and
torch.autograd), so the comparison also covers the noise of two independent
gradient implementations.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

STEPS = 50

# float64: the contract (DESIGN.md) is 1e-10 relative.
F64_RTOL = 1e-10
# float32: the tests allow 4x torch's own float32-vs-float64 drift measured on
# the same run, and never less than this floor. Typical drift over 50 steps is
# 1e-7..2e-6, but where a second moment gets tiny (RMSprop's square_avg ~1e-5)
# rounding differences double every step and two correct float32
# implementations part by ~4e-6 while torch happens to stay closer to float64.
# The float64 tests (1e-10) are what pin the math; float32 bounds the drift.
F32_RTOL_FLOOR = 1e-5


def problem(seed: int = 0) -> dict[str, np.ndarray]:
    """Initial parameters: a (5, 3) weight and a (3,) bias, in float64."""
    rng = np.random.default_rng(seed)
    return {"b": rng.normal(size=(3,)) * 0.5, "w": rng.normal(size=(5, 3))}


_DATA = np.random.default_rng(1234).normal(size=(8, 5))
_TARGET = np.random.default_rng(4321).normal(size=(8, 3))


def loss_jax(params: dict[str, jax.Array]) -> jax.Array:
    w, b = params["w"], params["b"]
    x = jnp.asarray(_DATA, w.dtype)
    y = jnp.asarray(_TARGET, w.dtype)
    pred = jnp.tanh(x @ w + b)
    return jnp.mean((pred - y) ** 2) + 0.05 * jnp.sum(w**4) + 0.1 * jnp.sum(jnp.sin(3 * b))


def loss_torch(params: dict[str, torch.Tensor]) -> torch.Tensor:
    w, b = params["w"], params["b"]
    x = torch.as_tensor(_DATA, dtype=w.dtype)
    y = torch.as_tensor(_TARGET, dtype=w.dtype)
    pred = torch.tanh(x @ w + b)
    return torch.mean((pred - y) ** 2) + 0.05 * torch.sum(w**4) + 0.1 * torch.sum(torch.sin(3 * b))


def losses(options: dict[str, Any]) -> tuple[Callable, Callable]:
    """(jax loss, torch loss) for ``options``; with ``maximize`` the objective is
    the negated loss, so ascent stays bounded and mirrors the descent problem."""
    if options.get("maximize", False):
        return (lambda p: -loss_jax(p)), (lambda p: -loss_torch(p))
    return loss_jax, loss_torch


TORCH_DTYPE = {"float64": torch.float64, "float32": torch.float32}


@contextlib.contextmanager
def torch_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch keeps 0-d state (ASGD's eta, NAdam's mu_product) in the default dtype;
    float64 runs set it to float64 so torch's reference is float64 throughout."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def run_torch(
    cls: type,
    options: dict[str, Any],
    init: dict[str, np.ndarray],
    dtype: str,
    steps: int = STEPS,
    loss: Callable | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``steps`` steps of ``cls(**options)``; returns final params and state_dict."""
    tdtype = TORCH_DTYPE[dtype]
    loss = loss or losses(options)[1]
    with torch_default_dtype(tdtype if dtype == "float64" else torch.float32):
        params = {
            k: torch.tensor(v, dtype=tdtype, requires_grad=True) for k, v in sorted(init.items())
        }
        opt = cls(list(params.values()), **options)
        for _ in range(steps):
            opt.zero_grad()
            loss(params).backward()
            opt.step()
        final = {k: v.detach().numpy().copy() for k, v in params.items()}
        return final, opt.state_dict()


def run_lucid(
    tx: optax.GradientTransformation,
    init: dict[str, np.ndarray],
    dtype: str,
    steps: int = STEPS,
    loss: Callable = loss_jax,
    jit: bool = True,
) -> tuple[dict[str, np.ndarray], Any]:
    """``steps`` updates of ``tx`` with gradients of ``loss``; final params and state."""
    params = {k: jnp.asarray(v, dtype) for k, v in init.items()}
    state = tx.init(params)

    def step(params: Any, state: Any) -> tuple[Any, Any]:
        grads = jax.grad(loss)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    if jit:
        step = jax.jit(step)
    for _ in range(steps):
        params, state = step(params, state)
    return {k: np.asarray(v) for k, v in params.items()}, state


def error_of(make: Callable[[], Any]) -> tuple[type, str] | None:
    """``(exception type, message)`` of the ValueError/TypeError ``make()`` raises, or None."""
    try:
        make()
    except (ValueError, TypeError) as error:
        return type(error), str(error)
    return None


# Keywords torch 2.15 added to a constructor that torch 2.13 (the oracle) lacks, each
# appended to the end of 2.13's signature as (kind, default); lucid follows 2.15
# (docs/optimizers/index.md, "torch 2.15").
TORCH_215_KEYWORDS: dict[str, dict[str, tuple[Any, Any]]] = {
    "LBFGS": {"maximize": (inspect.Parameter.KEYWORD_ONLY, False)},
}


# Keywords lucid adds to torch's signature (keyword-only, at the end, their defaults
# torch's behaviour), each as (kind, default).
LUCID_KEYWORDS: dict[str, dict[str, tuple[Any, Any]]] = {
    "Muon": {"batched_matrices": (inspect.Parameter.KEYWORD_ONLY, False)},
}


def torch_215_parameters(name: str, theirs: Mapping[str, Any]) -> dict[str, Any]:
    """torch 2.13's signature ``theirs`` (``inspect`` parameters) with torch 2.15's
    added keywords of optimizer ``name`` appended, then lucid's own: the signature
    lucid must have."""
    expected = dict(theirs)
    added = {**TORCH_215_KEYWORDS.get(name, {}), **LUCID_KEYWORDS.get(name, {})}
    for keyword, (kind, default) in added.items():
        assert keyword not in expected, f"torch has {name}'s {keyword} now: drop it here"
        expected[keyword] = inspect.Parameter(keyword, kind, default=default)
    return expected


def assert_signature_is_torchs(cls: type, torch_cls: type, factory: Callable) -> None:
    """The class's and the functional factory's keywords, kinds and defaults are torch's
    (torch 2.13's, with the keywords torch 2.15 added)."""
    ours = inspect.signature(cls.__init__).parameters
    theirs = torch_215_parameters(
        torch_cls.__name__, inspect.signature(torch_cls.__init__).parameters
    )
    fn = inspect.signature(factory).parameters
    assert list(ours) == list(theirs)
    for name in theirs:
        if name in ("self", "params"):
            continue
        assert (ours[name].kind, ours[name].default) == (theirs[name].kind, theirs[name].default)
        assert (fn[name].kind, fn[name].default) == (theirs[name].kind, theirs[name].default)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Max elementwise error relative to the expected array's scale."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(np.max(np.abs(expected)), 1e-30)
    return float(np.max(np.abs(actual - expected)) / scale) if expected.size else 0.0


def to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def run_shell(
    cls: type,
    options: dict[str, Any],
    init: dict[str, np.ndarray],
    dtype: str,
    steps: int = STEPS,
    loss: Callable | None = None,
    compile_at: int | None = None,
) -> tuple[dict[str, np.ndarray], Any]:
    """``steps`` steps of the lucid.optim class ``cls``; final params and the optimizer.

    With ``compile_at`` the optimizer is compiled before that step (0: from the
    start; later: the compiled step adopts the state eager steps built)."""
    import lucid

    loss = loss or losses(options)[0]
    params = {k: lucid.Parameter(jnp.asarray(v, dtype)) for k, v in sorted(init.items())}
    opt = cls(list(params.values()), **options)
    for step in range(steps):
        if step == compile_at:
            lucid.compile_optimizer(opt)
        opt.zero_grad()
        lucid.backward(loss, params)
        opt.step()
    return {k: np.asarray(p.data) for k, p in params.items()}, opt


@contextlib.contextmanager
def count_compiles() -> Iterator[list[str]]:
    """Collect one entry per XLA backend compilation inside the block."""
    compiled: list[str] = []

    def listener(name: str, secs: float, **kwargs: Any) -> None:
        if name == "/jax/core/compile/backend_compile_duration":
            compiled.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiled
    finally:
        _unregister(listener)


def _unregister(listener: Callable) -> None:
    from jax._src import monitoring

    listeners = monitoring._event_duration_secs_listeners
    if listener in listeners:
        listeners.remove(listener)
