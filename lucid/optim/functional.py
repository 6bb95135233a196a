"""torch 2.15's ``torch.optim.functional``: the 14 functional optimizers over lists of arrays.

Each function has torch's name, arguments, keyword names, kinds and defaults
(``adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, ...,
*, amsgrad, beta1, beta2, lr, weight_decay, eps, maximize)``), takes one entry per
parameter in each list, and computes torch's update with the same rule as every other
form of the optimizer (`lucid.functional`, the `lucid.optim` classes, the compiled
step).

**The one difference: nothing is updated in place.** torch's functions write the new
parameters and state into the tensors they are given and return ``None``; JAX arrays
are immutable, so each function here returns the new lists instead, ``(params, *the
state lists torch updates)`` in the order of the arguments:

```python
# torch
torch.optim.functional.adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, **kw)
# lucid
params, exp_avgs, exp_avg_sqs, _, steps = lucid.optim.functional.adam(
    params, grads, exp_avgs, exp_avg_sqs, [], steps, **kw
)
```

The caller keeps the state, as with torch's (start it as torch's classes do: zeros,
``state_steps`` at 0; Adagrad's sums at its ``initial_accumulator_value``, Rprop's step
sizes at its ``lr``, ASGD's ``eta`` at ``lr`` and ``mu`` at 1). ``state_steps`` come back
counting this update, as torch increments them, except ``sparse_adam``'s, which torch
reads (the caller counts first) and which come back as given. SGD's
``momentum_buffer_list`` may hold ``None``: that parameter's buffer starts from this
gradient, as torch's does, and comes back as an array.

Other points, each as torch's classes have them in lucid:

- Hyper-parameters are Python numbers or one-element arrays (traced ones too: every
  function is pure and runs under ``jax.jit``, with the flags (``amsgrad``,
  ``maximize``, ...) static). Types are checked, values are not (torch's functions do
  not check ranges either; the classes do).
- ``foreach``, ``fused``, ``capturable``, ``has_complex`` and ``has_sparse_grad`` are
  accepted and ignored (complex parameters and sparse gradients are read from the
  arrays); ``differentiable=True``, a ``grad_scale`` or a ``found_inf`` (torch's fused
  mixed-precision kernels) is a ``ValueError``.
- A list whose length is not the number of parameters, or an entry of another shape than
  the state the rule keeps, is a ``ValueError`` naming it (torch indexes or broadcasts).
- ``muon`` refuses an unknown ``adjust_lr_fn`` with the class's ``ValueError`` (torch's
  function silently uses a ratio of 1).
- ``sparse_adam`` also takes a dense gradient, whose nonzero entries are the present ones
  (torch's takes sparse ones only); ``sgd`` and ``adagrad`` take ``BCOO`` gradients.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from lucid.optim import functional as F
  >>> params, grads = [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])]
  >>> exp_avgs, exp_avg_sqs, steps = [jnp.zeros(2)], [jnp.zeros(2)], [jnp.zeros(())]
  >>> @jax.jit
  ... def step(params, grads, exp_avgs, exp_avg_sqs, steps, lr):
  ...     return F.adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
  ...                   beta1=0.9, beta2=0.999, lr=lr, weight_decay=0.0, eps=1e-8,
  ...                   maximize=False)
  >>> params, exp_avgs, exp_avg_sqs, _, steps = step(
  ...     params, grads, exp_avgs, exp_avg_sqs, steps, 0.1)
  >>> params[0], steps[0]
  (Array([ 0.9, -1.9], dtype=float32), Array(1., dtype=float32))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from ..functional.adadelta import ADADELTA, ADADELTA_SIGNATURE
from ..functional.adafactor import ADAFACTOR, ADAFACTOR_SIGNATURE
from ..functional.adagrad import ADAGRAD, ADAGRAD_SIGNATURE
from ..functional.adam import ADAM, ADAM_SIGNATURE, ADAMW, ADAMW_SIGNATURE
from ..functional.adamax import ADAMAX, ADAMAX_SIGNATURE
from ..functional.asgd import ASGD, ASGD_SIGNATURE
from ..functional.muon import ADJUST_LR_FNS, MUON, MUON_SIGNATURE
from ..functional.nadam import NADAM, NADAM_SIGNATURE
from ..functional.radam import RADAM, RADAM_SIGNATURE
from ..functional.rmsprop import RMSPROP, RMSPROP_SIGNATURE
from ..functional.rprop import RPROP, RPROP_SIGNATURE
from ..functional.sgd import SGD, SGD_SIGNATURE
from ..functional.sparse_adam import SPARSE_ADAM, SPARSE_ADAM_SIGNATURE
from ._list_form import ListForm

__all__ = [
    "adadelta",
    "adafactor",
    "adagrad",
    "adam",
    "adamax",
    "adamw",
    "asgd",
    "muon",
    "nadam",
    "radam",
    "rmsprop",
    "rprop",
    "sgd",
    "sparse_adam",
]

Array = jax.Array
Arrays = Sequence[Any]  # one array (or number) per parameter
Lists = tuple[list[Any], ...]  # (params, *state lists), new

_LR = "γ, the learning rate: a float or a one-element array (a traced one under `jax.jit` too)."
_BETAS = {
    "beta1": "β₁, the decay rate of the gradient's average (the class's `betas[0]`).",
    "beta2": "β₂, the decay rate of the squared gradient's average (the class's `betas[1]`).",
}
_MAXIMIZE = {"maximize": "ascend the objective instead of descending (the gradient is negated)."}


def _options(arguments: dict[str, Any], *names: str, **renamed: Any) -> dict[str, Any]:
    """The class's options: ``names`` taken as they are, ``renamed`` given."""
    return {**{name: arguments[name] for name in names}, **renamed}


def _betas(a: dict[str, Any]) -> tuple[Any, Any]:
    return (a["beta1"], a["beta2"])


_ADADELTA = ListForm(
    "adadelta",
    ADADELTA,
    ADADELTA_SIGNATURE,
    (("square_avgs", "square_avg"), ("acc_deltas", "acc_delta"), ("state_steps", "step")),
    lambda a: _options(a, "lr", "rho", "eps", "weight_decay", "maximize"),
    own={"lr": _LR},
)


def adadelta(
    params: Arrays,
    grads: Arrays,
    square_avgs: Arrays,
    acc_deltas: Arrays,
    state_steps: Arrays,
    capturable: bool = False,
    foreach: bool | None = None,
    differentiable: bool = False,
    has_complex: bool = False,
    *,
    lr: Any,
    rho: Any,
    eps: Any,
    weight_decay: Any,
    maximize: bool,
) -> Lists:
    return _ADADELTA(locals())


_ADADELTA.document(
    adadelta,
    """torch's ``adadelta`` functional form (`lucid.optim.Adadelta`'s rule), returning the
    new lists.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> new = F.adadelta([jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])],
      ...                  [jnp.zeros(2)], [jnp.zeros(2)], [jnp.zeros(())],
      ...                  lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False)
      >>> params, square_avgs, acc_deltas, state_steps = new
      >>> [round(x, 4) for x in params[0].tolist()], float(state_steps[0])
      ([0.9968, -1.9968], 1.0)""",
)

_ADAFACTOR = ListForm(
    "adafactor",
    ADAFACTOR,
    ADAFACTOR_SIGNATURE,
    (
        ("row_vars", "row_var"),
        ("col_vars", "col_var"),
        ("variances", "variance"),
        ("state_steps", "step"),
    ),
    lambda a: _options(
        a, "lr", "beta2_decay", "d", "weight_decay", "maximize", eps=(a["eps1"], a["eps2"])
    ),
    own={
        "lr": _LR,
        "eps1": "ε₁, the floor of the second-moment estimate (`None`: the parameter dtype's "
        "machine epsilon; the class's `eps[0]`).",
        "eps2": "ε₂, the floor of the parameter's RMS (the class's `eps[1]`).",
        **_MAXIMIZE,
    },
)


def adafactor(
    params: Arrays,
    grads: Arrays,
    row_vars: Arrays,
    col_vars: Arrays,
    variances: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    grad_scale: Any = None,
    found_inf: Any = None,
    has_complex: bool = False,
    *,
    d: Any,
    lr: Any,
    beta2_decay: Any,
    weight_decay: Any,
    eps1: Any,
    eps2: Any,
    maximize: bool,
) -> Lists:
    return _ADAFACTOR(locals())


_ADAFACTOR.document(
    adafactor,
    """torch's ``adafactor`` functional form (`lucid.optim.Adafactor`'s rule), returning
    the new lists. A matrix keeps `row_var` and `col_var` (torch's keepdim shapes), a vector
    its `variance`; the other entries may be `None` and come back as given.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, grads = [jnp.ones((2, 3)), jnp.ones(3)], [jnp.full((2, 3), 0.5), jnp.full(3, 0.5)]
      >>> row_vars, col_vars = [jnp.zeros((2, 1)), None], [jnp.zeros((1, 3)), None]
      >>> variances, steps = [None, jnp.zeros(3)], [jnp.zeros(()), jnp.zeros(())]
      >>> params, row_vars, col_vars, variances, steps = F.adafactor(
      ...     params, grads, row_vars, col_vars, variances, steps, d=1.0, lr=1e-2,
      ...     beta2_decay=-0.8, weight_decay=0.0, eps1=None, eps2=1e-3, maximize=False)
      >>> [round(x, 4) for x in params[1].tolist()], row_vars[0].shape, variances[0]
      ([0.99, 0.99, 0.99], (2, 1), None)""",
)

_ADAGRAD = ListForm(
    "adagrad",
    ADAGRAD,
    ADAGRAD_SIGNATURE,
    (("state_sums", "sum"), ("state_steps", "step")),
    lambda a: _options(
        a, "lr", "lr_decay", "weight_decay", "eps", "maximize", initial_accumulator_value=0.0
    ),
    own={"lr": _LR},
)


def adagrad(
    params: Arrays,
    grads: Arrays,
    state_sums: Arrays,
    state_steps: Arrays,
    fused: bool | None = None,
    grad_scale: Any = None,
    found_inf: Any = None,
    has_sparse_grad: bool = False,
    foreach: bool | None = None,
    differentiable: bool = False,
    has_complex: bool = False,
    *,
    lr: Any,
    weight_decay: Any,
    lr_decay: Any,
    eps: Any,
    maximize: bool,
) -> Lists:
    return _ADAGRAD(locals())


_ADAGRAD.document(
    adagrad,
    """torch's ``adagrad`` functional form (`lucid.optim.Adagrad`'s rule), returning the
    new lists. A sparse (`BCOO`) gradient changes only its stored entries, as torch's does.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, state_sums, state_steps = F.adagrad(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(())], lr=0.1, weight_decay=0.0, lr_decay=0.0, eps=1e-10,
      ...     maximize=False)
      >>> params[0], state_sums[0]
      (Array([ 0.9, -1.9], dtype=float32), Array([0.25, 1.  ], dtype=float32))""",
)

_ADAM_LISTS = (
    ("exp_avgs", "exp_avg"),
    ("exp_avg_sqs", "exp_avg_sq"),
    ("max_exp_avg_sqs", "max_exp_avg_sq"),
    ("state_steps", "step"),
)
_ADAM_OPTIONS = ("lr", "eps", "weight_decay", "amsgrad", "maximize")
_ADAM = ListForm(
    "adam",
    ADAM,
    ADAM_SIGNATURE,
    _ADAM_LISTS,
    lambda a: _options(a, *_ADAM_OPTIONS, "decoupled_weight_decay", betas=_betas(a)),
    own={"lr": _LR, **_BETAS},
)


def adam(
    params: Arrays,
    grads: Arrays,
    exp_avgs: Arrays,
    exp_avg_sqs: Arrays,
    max_exp_avg_sqs: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    capturable: bool = False,
    differentiable: bool = False,
    fused: bool | None = None,
    grad_scale: Any = None,
    found_inf: Any = None,
    has_complex: bool = False,
    decoupled_weight_decay: bool = False,
    *,
    amsgrad: bool,
    beta1: Any,
    beta2: Any,
    lr: Any,
    weight_decay: Any,
    eps: Any,
    maximize: bool,
) -> Lists:
    return _ADAM(locals())


_ADAM.document(
    adam,
    """torch's ``adam`` functional form (`lucid.optim.Adam`'s rule), returning the new
    lists. `max_exp_avg_sqs` may be empty without `amsgrad`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = F.adam(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(2)], [jnp.zeros(2)], [jnp.zeros(())], amsgrad=True, beta1=0.9,
      ...     beta2=0.999, lr=0.1, weight_decay=0.0, eps=1e-8, maximize=False)
      >>> params[0], max_exp_avg_sqs[0].round(6)
      (Array([ 0.9, -1.9], dtype=float32), Array([0.00025, 0.001  ], dtype=float32))""",
)

_ADAMW = ListForm(
    "adamw",
    ADAMW,
    ADAMW_SIGNATURE,
    _ADAM_LISTS,
    lambda a: _options(a, *_ADAM_OPTIONS, betas=_betas(a), decoupled_weight_decay=True),
    own={"lr": _LR, **_BETAS},
)


def adamw(
    params: Arrays,
    grads: Arrays,
    exp_avgs: Arrays,
    exp_avg_sqs: Arrays,
    max_exp_avg_sqs: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    capturable: bool = False,
    differentiable: bool = False,
    fused: bool | None = None,
    grad_scale: Any = None,
    found_inf: Any = None,
    has_complex: bool = False,
    *,
    amsgrad: bool,
    beta1: Any,
    beta2: Any,
    lr: Any,
    weight_decay: Any,
    eps: Any,
    maximize: bool,
) -> Lists:
    return _ADAMW(locals())


_ADAMW.document(
    adamw,
    """torch's ``adamw`` functional form (`lucid.optim.AdamW`'s rule: Adam with decoupled
    weight decay), returning the new lists.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, *_ = F.adamw(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(2)], [], [jnp.zeros(())], amsgrad=False, beta1=0.9,
      ...     beta2=0.999, lr=0.1, weight_decay=1e-2, eps=1e-8, maximize=False)
      >>> params[0]
      Array([ 0.899, -1.898], dtype=float32)""",
)

_ADAMAX = ListForm(
    "adamax",
    ADAMAX,
    ADAMAX_SIGNATURE,
    (("exp_avgs", "exp_avg"), ("exp_infs", "exp_inf"), ("state_steps", "step")),
    lambda a: _options(a, "lr", "eps", "weight_decay", "maximize", betas=_betas(a)),
    own={"lr": _LR, **_BETAS},
)


def adamax(
    params: Arrays,
    grads: Arrays,
    exp_avgs: Arrays,
    exp_infs: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    maximize: bool = False,
    differentiable: bool = False,
    capturable: bool = False,
    has_complex: bool = False,
    *,
    eps: Any,
    beta1: Any,
    beta2: Any,
    lr: Any,
    weight_decay: Any,
) -> Lists:
    return _ADAMAX(locals())


_ADAMAX.document(
    adamax,
    """torch's ``adamax`` functional form (`lucid.optim.Adamax`'s rule), returning the new
    lists.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, exp_avgs, exp_infs, state_steps = F.adamax(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(2)], [jnp.zeros(())], eps=1e-8, beta1=0.9, beta2=0.999, lr=0.1,
      ...     weight_decay=0.0)
      >>> params[0], exp_infs[0]
      (Array([ 0.9, -1.9], dtype=float32), Array([0.5, 1. ], dtype=float32))""",
)

_ASGD = ListForm(
    "asgd",
    ASGD,
    ASGD_SIGNATURE,
    (("axs", "ax"), ("mus", "mu"), ("etas", "eta"), ("state_steps", "step")),
    lambda a: _options(a, "lr", "lambd", "alpha", "t0", "weight_decay", "maximize"),
    own={"lr": _LR, **_MAXIMIZE},
)


def asgd(
    params: Arrays,
    grads: Arrays,
    axs: Arrays,
    mus: Arrays,
    etas: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    maximize: bool = False,
    differentiable: bool = False,
    capturable: bool = False,
    has_complex: bool = False,
    *,
    lambd: Any,
    lr: Any,
    t0: Any,
    alpha: Any,
    weight_decay: Any,
) -> Lists:
    return _ASGD(locals())


_ASGD.document(
    asgd,
    """torch's ``asgd`` functional form (`lucid.optim.ASGD`'s rule), returning the new
    lists. Start `etas` at `lr` and `mus` at 1, as torch's class does.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, axs, mus, etas, state_steps = F.asgd(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.ones(())], [jnp.asarray(0.1)], [jnp.zeros(())], lambd=1e-4, lr=0.1,
      ...     t0=1e6, alpha=0.75, weight_decay=0.0)
      >>> params[0], etas[0].round(6)
      (Array([ 0.94999, -1.89998], dtype=float32), Array(0.099999, dtype=float32))""",
)


def _check_muon(a: dict[str, Any]) -> None:
    """torch's function refuses ``foreach`` and complex parameters; an unknown
    ``adjust_lr_fn`` it takes as a ratio of 1, which lucid refuses as the class does."""
    if a["foreach"]:
        raise RuntimeError("Foreach is not supported for Muon yet")
    if a["has_complex"]:
        raise ValueError("Complex parameters are not supported")
    if a["adjust_lr_fn"] not in ADJUST_LR_FNS:
        raise ValueError(f"Adjust learning rate function {a['adjust_lr_fn']} is not supported")


_MUON = ListForm(
    "muon",
    MUON,
    MUON_SIGNATURE,
    (("muon_momentum_bufs", "momentum_buffer"),),
    lambda a: _options(
        a,
        "lr",
        "weight_decay",
        "momentum",
        "nesterov",
        "ns_coefficients",
        "eps",
        "ns_steps",
        "adjust_lr_fn",
        batched_matrices=False,  # torch's function: 2-D only
    ),
    steps="none",
    own={
        "lr": _LR,
        "foreach": "torch's multi-tensor kernels, which its Muon does not have: `True` "
        "raises torch's `RuntimeError`.",
        "has_complex": "whether a parameter is complex: `True` raises torch's `ValueError` "
        "(Muon takes real matrices).",
    },
    check=_check_muon,
    raises={
        "ValueError": "Also torch's for Muon: a gradient that is not 2-D, `ns_steps >= 100`, "
        "coefficients that are not three, `has_complex=True`; and an unknown `adjust_lr_fn`.",
        "RuntimeError": "Also `foreach=True`, as torch's.",
    },
)


def muon(
    params: Arrays,
    grads: Arrays,
    muon_momentum_bufs: Arrays,
    *,
    foreach: bool | None = None,
    lr: Any,
    weight_decay: Any,
    momentum: Any,
    nesterov: bool,
    ns_coefficients: tuple[Any, Any, Any],
    ns_steps: int,
    eps: Any,
    adjust_lr_fn: str | None,
    has_complex: bool,
) -> Lists:
    return _MUON(locals())


_MUON.document(
    muon,
    """torch's ``muon`` functional form (`lucid.optim.Muon`'s rule, torch 2.15's: the
    buffer is never rescaled, `'spectral_unclamped'` is known), returning the new lists.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, bufs = F.muon(
      ...     [jnp.array([[1.0, -2.0], [0.5, 3.0]])], [jnp.eye(2)], [jnp.zeros((2, 2))],
      ...     lr=0.1, weight_decay=0.1, momentum=0.95, nesterov=True,
      ...     ns_coefficients=(3.4445, -4.775, 2.0315), ns_steps=5, eps=1e-7,
      ...     adjust_lr_fn=None, has_complex=False)
      >>> [[round(x, 2) for x in row] for row in params[0].tolist()]
      [[0.88, -1.98], [0.5, 2.86]]
      >>> [[round(x, 3) for x in row] for row in bufs[0].tolist()]
      [[0.05, 0.0], [0.0, 0.05]]""",
)

_NADAM = ListForm(
    "nadam",
    NADAM,
    NADAM_SIGNATURE,
    (
        ("exp_avgs", "exp_avg"),
        ("exp_avg_sqs", "exp_avg_sq"),
        ("mu_products", "mu_product"),
        ("state_steps", "step"),
    ),
    lambda a: _options(
        a,
        "lr",
        "eps",
        "weight_decay",
        "momentum_decay",
        "decoupled_weight_decay",
        "maximize",
        betas=_betas(a),
    ),
    own={"lr": _LR, **_BETAS},
)


def nadam(
    params: Arrays,
    grads: Arrays,
    exp_avgs: Arrays,
    exp_avg_sqs: Arrays,
    mu_products: Arrays,
    state_steps: Arrays,
    decoupled_weight_decay: bool = False,
    foreach: bool | None = None,
    capturable: bool = False,
    differentiable: bool = False,
    has_complex: bool = False,
    maximize: bool = False,
    *,
    beta1: Any,
    beta2: Any,
    lr: Any,
    weight_decay: Any,
    momentum_decay: Any,
    eps: Any,
) -> Lists:
    return _NADAM(locals())


_NADAM.document(
    nadam,
    """torch's ``nadam`` functional form (`lucid.optim.NAdam`'s rule), returning the new
    lists. Start `mu_products` at 1, as torch's class does.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, exp_avgs, exp_avg_sqs, mu_products, state_steps = F.nadam(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(2)], [jnp.ones(())], [jnp.zeros(())], beta1=0.9, beta2=0.999,
      ...     lr=0.1, weight_decay=0.0, momentum_decay=4e-3, eps=1e-8)
      >>> [round(x, 4) for x in params[0].tolist()], round(float(mu_products[0]), 4)
      ([0.8944, -1.8944], 0.4501)""",
)

_RADAM = ListForm(
    "radam",
    RADAM,
    RADAM_SIGNATURE,
    (("exp_avgs", "exp_avg"), ("exp_avg_sqs", "exp_avg_sq"), ("state_steps", "step")),
    lambda a: _options(
        a, "lr", "eps", "weight_decay", "decoupled_weight_decay", "maximize", betas=_betas(a)
    ),
    own={"lr": _LR, **_BETAS},
)


def radam(
    params: Arrays,
    grads: Arrays,
    exp_avgs: Arrays,
    exp_avg_sqs: Arrays,
    state_steps: Arrays,
    decoupled_weight_decay: bool = False,
    foreach: bool | None = None,
    differentiable: bool = False,
    capturable: bool = False,
    has_complex: bool = False,
    maximize: bool = False,
    *,
    beta1: Any,
    beta2: Any,
    lr: Any,
    weight_decay: Any,
    eps: Any,
) -> Lists:
    return _RADAM(locals())


_RADAM.document(
    radam,
    """torch's ``radam`` functional form (`lucid.optim.RAdam`'s rule), returning the new
    lists.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, exp_avgs, exp_avg_sqs, state_steps = F.radam(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(2)], [jnp.zeros(())], beta1=0.9, beta2=0.999, lr=0.1,
      ...     weight_decay=0.0, eps=1e-8)
      >>> params[0], exp_avgs[0]
      (Array([ 0.95, -1.9 ], dtype=float32), Array([ 0.05, -0.1 ], dtype=float32))""",
)

_RMSPROP = ListForm(
    "rmsprop",
    RMSPROP,
    RMSPROP_SIGNATURE,
    (
        ("square_avgs", "square_avg"),
        ("grad_avgs", "grad_avg"),
        ("momentum_buffer_list", "momentum_buffer"),
        ("state_steps", "step"),
    ),
    lambda a: _options(a, "lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"),
    own={"lr": _LR, **_MAXIMIZE},
)


def rmsprop(
    params: Arrays,
    grads: Arrays,
    square_avgs: Arrays,
    grad_avgs: Arrays,
    momentum_buffer_list: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    maximize: bool = False,
    differentiable: bool = False,
    capturable: bool = False,
    has_complex: bool = False,
    *,
    lr: Any,
    alpha: Any,
    eps: Any,
    weight_decay: Any,
    momentum: Any,
    centered: bool,
) -> Lists:
    return _RMSPROP(locals())


_RMSPROP.document(
    rmsprop,
    """torch's ``rmsprop`` functional form (`lucid.optim.RMSprop`'s rule), returning the new
    lists. `grad_avgs` may be empty unless `centered`, `momentum_buffer_list` unless
    `momentum > 0`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, square_avgs, grad_avgs, bufs, state_steps = F.rmsprop(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)], [], [],
      ...     [jnp.zeros(())], lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0,
      ...     momentum=0.0, centered=False)
      >>> params[0].round(4), square_avgs[0], grad_avgs
      (Array([ 0.9, -1.9], dtype=float32), Array([0.0025, 0.01  ], dtype=float32), [])""",
)

_RPROP = ListForm(
    "rprop",
    RPROP,
    RPROP_SIGNATURE,
    (("prevs", "prev"), ("step_sizes", "step_size"), ("state_steps", "step")),
    lambda a: _options(
        a,
        "maximize",
        # the class's lr only starts the step sizes, which the caller gives here
        lr=0.0,
        etas=(a["etaminus"], a["etaplus"]),
        step_sizes=(a["step_size_min"], a["step_size_max"]),
    ),
    own={
        "step_size_min": "the smallest step size (the class's `step_sizes[0]`).",
        "step_size_max": "the largest step size (the class's `step_sizes[1]`).",
        "etaminus": "η₋, the factor of a step size where the gradient's sign flips (the "
        "class's `etas[0]`).",
        "etaplus": "η₊, the factor of a step size where the gradient's sign holds (the "
        "class's `etas[1]`).",
        **_MAXIMIZE,
    },
)


def rprop(
    params: Arrays,
    grads: Arrays,
    prevs: Arrays,
    step_sizes: Arrays,
    state_steps: Arrays,
    foreach: bool | None = None,
    capturable: bool = False,
    maximize: bool = False,
    differentiable: bool = False,
    has_complex: bool = False,
    *,
    step_size_min: Any,
    step_size_max: Any,
    etaminus: Any,
    etaplus: Any,
) -> Lists:
    return _RPROP(locals())


_RPROP.document(
    rprop,
    """torch's ``rprop`` functional form (`lucid.optim.Rprop`'s rule), returning the new
    lists. Start `step_sizes` at the class's `lr`, `prevs` at 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, prevs, step_sizes, state_steps = F.rprop(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [jnp.zeros(2)],
      ...     [jnp.full(2, 0.1)], [jnp.zeros(())], step_size_min=1e-6, step_size_max=50.0,
      ...     etaminus=0.5, etaplus=1.2)
      >>> params[0], step_sizes[0]
      (Array([ 0.9, -1.9], dtype=float32), Array([0.1, 0.1], dtype=float32))""",
)

_SGD = ListForm(
    "sgd",
    SGD,
    SGD_SIGNATURE,
    (("momentum_buffer_list", "momentum_buffer"),),
    lambda a: _options(a, "lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    grads="d_p_list",
    lazy=("momentum_buffer_list",),
    own={
        "lr": _LR,
        "momentum_buffer_list": "each parameter's `momentum_buffer`, or `None` where it has "
        "none yet (it then starts from this gradient, as torch's does); may be empty "
        "without momentum.",
    },
)


def sgd(
    params: Arrays,
    d_p_list: Arrays,
    momentum_buffer_list: Sequence[Any | None],
    has_sparse_grad: bool = False,
    foreach: bool | None = None,
    fused: bool | None = None,
    grad_scale: Any = None,
    found_inf: Any = None,
    *,
    weight_decay: Any,
    momentum: Any,
    lr: Any,
    dampening: Any,
    nesterov: bool,
    maximize: bool,
) -> Lists:
    return _SGD(locals())


_SGD.document(
    sgd,
    """torch's ``sgd`` functional form (`lucid.optim.SGD`'s rule), returning the new lists.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, bufs = F.sgd(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, -1.0])], [None], weight_decay=0.0,
      ...     momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False)
      >>> params[0], bufs[0]
      (Array([ 0.95, -1.9 ], dtype=float32), Array([ 0.5, -1. ], dtype=float32))""",
)

_SPARSE_ADAM = ListForm(
    "sparse_adam",
    SPARSE_ADAM,
    SPARSE_ADAM_SIGNATURE,
    (("exp_avgs", "exp_avg"), ("exp_avg_sqs", "exp_avg_sq"), ("state_steps", "step")),
    lambda a: _options(a, "lr", "eps", "maximize", betas=_betas(a)),
    steps="read",
    own={
        "lr": _LR,
        "state_steps": "each parameter's step, already counting this update (torch's "
        "`sparse_adam` reads it and does not increment it): a number or 0-d array.",
        **_BETAS,
        **_MAXIMIZE,
    },
)


def sparse_adam(
    params: Arrays,
    grads: Arrays,
    exp_avgs: Arrays,
    exp_avg_sqs: Arrays,
    state_steps: Sequence[Any],
    *,
    eps: Any,
    beta1: Any,
    beta2: Any,
    lr: Any,
    maximize: bool,
) -> Lists:
    return _SPARSE_ADAM(locals())


_SPARSE_ADAM.document(
    sparse_adam,
    """torch's ``sparse_adam`` functional form (`lucid.optim.SparseAdam`'s rule), returning
    the new lists: the moments and the parameter change at the gradient's present entries
    only (a `BCOO` gradient's stored ones, or a dense gradient's nonzero ones).

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.optim import functional as F
      >>> params, exp_avgs, exp_avg_sqs, state_steps = F.sparse_adam(
      ...     [jnp.array([1.0, -2.0])], [jnp.array([0.5, 0.0])], [jnp.zeros(2)],
      ...     [jnp.zeros(2)], [1], eps=1e-8, beta1=0.9, beta2=0.999, lr=0.1,
      ...     maximize=False)
      >>> params[0].round(4), exp_avgs[0], state_steps
      (Array([ 0.9, -2. ], dtype=float32), Array([0.05, 0.  ], dtype=float32), [1])""",
)
