"""PSGD Kron (``kron_torch.Kron``, kron-torch 0.3.3): a Kronecker-factored preconditioner
fitted by preconditioned stochastic gradient descent (Xi-Lin Li's PSGD).

A parameter's gradient ``g`` is first laid out as a tensor ``G`` of at most two axes
(``merge_dims``: a tensor of three or more axes becomes the matrix
``[prod(shape[:-1]), shape[-1]]``, or ``[shape[0], prod(shape[1:])]`` where that one is
the taller, as kron-torch chooses). Each axis ``i`` of size ``n_i`` has a factor ``Q_i``:
an upper-triangular ``n_i x n_i`` matrix, or a diagonal one (a vector) when ``n_i = 1``,
``n_i > max_size_triangular``, the parameter has fewer than ``min_ndim_triangular`` axes,
or ``memory_save_mode`` says so. Write ``X \\times_i M`` for the product of a matrix with
axis ``i`` (``(X \\times_i M)[..a..] = \\sum_n M[a, n] X[..n..]``). One step, ``t`` the
parameter's step, ``b_1`` the momentum, ``\\gamma`` the learning rate:

$$
\\begin{aligned}
m_t &= b_1 m_{t-1} + (1 - b_1) G, \\qquad \\hat m_t = m_t / (1 - b_1^t) \\\\
&\\text{if the preconditioner is updated this step, with } V \\sim \\mathcal N(0, I):\\\\
H &= X + \\sqrt{\\epsilon_{32}}\\,\\mathrm{mean}|X|\\,V, \\qquad X = \\hat m_t
   \\text{ (or } G \\text{ without momentum\\_into\\_precond\\_update)} \\\\
A &= H \\times_1 Q_1 \\cdots \\times_k Q_k, \\qquad
B = V \\times_1 Q_1^{-T} \\cdots \\times_k Q_k^{-T} \\\\
T_i &= A_{(i)} A_{(i)}^T - B_{(i)} B_{(i)}^T, \\qquad
S_i = A_{(i)} A_{(i)}^T + B_{(i)} B_{(i)}^T \\\\
Q_i &\\leftarrow Q_i - \\frac{\\eta}{\\lambda(S_i)}\\,\\mathrm{triu}(T_i)\\,Q_i
   \\quad\\text{(diagonal: } q_i \\leftarrow q_i - \\eta\\,\\mathrm{diag}(T_i)\\,q_i /
   \\max|\\mathrm{diag}(S_i)|) \\\\
P &= \\hat m_t' \\times_1 Q_1^T Q_1 \\cdots \\times_k Q_k^T Q_k, \\qquad
P \\leftarrow P \\min(1, 1.1 / (\\mathrm{RMS}(P) + 10^{-12})) \\\\
p &\\leftarrow p - \\gamma\\,(P + \\lambda_{wd}\\, p)
\\end{aligned}
$$

``A_{(i)}`` is ``A`` with axis ``i`` first and the others flattened, ``\\eta`` is
``precond_lr``, ``\\lambda(S)`` kron-torch's cheap lower bound of the spectral norm of
``S`` (one power-iteration step from its largest column, at least the dtype's smallest
normal number), ``\\epsilon_{32}`` float32's machine epsilon. ``\\hat m_t'`` is ``\\hat m_t``
with the probe noise added when ``H`` is the momentum and the preconditioner was updated
(kron-torch adds it in place), else ``\\hat m_t``. The weight decay applies to parameters
of two or more axes only. The preconditioner math runs in ``precond_dtype`` (float32 by
default, whatever the parameter's dtype), each triangular solve in float32, as
kron-torch's; the momentum in ``mu_dtype`` (default: the parameter's).

**When the preconditioner is updated.** kron-torch keeps two counters on the optimizer: the
number of steps taken ``n`` and the steps since the last update ``c``. At each step
``p_n = preconditioner_update_probability`` (a number, or a schedule of ``n``; the
default anneals ``min(1, max(0.03, exp(-0.001 (n - 500))))``), ``c \\leftarrow c + 1``, and
the preconditioner is updated iff ``c \\ge 1 / p_n`` (then ``c \\leftarrow 0``): a
deterministic rule, not a coin flip. Every hundredth update or so (a draw ``u < 0.01``),
the factors of a matrix are *balanced* first: each is scaled so that their largest
magnitudes share the geometric mean, which leaves their Kronecker product unchanged.

**lucid's state.** ``step``, ``momentum_buffer`` (in the merged shape) and ``Q`` (the factors
laid end to end: a diagonal one as its ``n_i`` values, a triangular one as its ``n_i^2``
entries, row by row) are kron-torch's; lucid keeps the two counters with each parameter
(``prob_step``, ``update_counter``), plus ``key``, the parameter's PRNG key, and
``diag``, which factors are diagonal. They match kron-torch's optimizer-wide counters as
long as every parameter has a gradient at every step (a parameter that misses steps
counts its own) and every group has the same update probability (kron-torch reads the
first group's only). A state_dict shows kron-torch's entries only; a loaded one starts the
counters at zero, as a kron-torch optimizer built to load it does.

**Random draws.** Where kron-torch draws ``V`` with ``torch.randn_like`` (the global torch
generator) and the balancing draw ``u`` with ``random.Random(42)``, lucid draws both from
the parameter's key: ``k = fold_in(key, t)``, ``V = normal(k_1)``, ``u = uniform(k_2)``
with ``(k_1, k_2) = split(k)`` (`draw_probes`). The key is made from the parameter's
initial bits (`first_key`), so a run is reproducible from the parameters alone, and two
parameters with the same initial value draw the same probes (harmless: each factor is fitted
to its own parameter's pairs ``(V, H)`` only). To replay other draws (kron-torch's, in the
tests), `with_draws` gives the rule with another ``draw`` function.

This rule reduces over whole parameters, so it is not elementwise: the compiled step updates
each parameter as itself, and the preconditioner's update is a ``lax.cond`` on the
counter inside the step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import string
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._apply import is_number, is_zero
from ._math import max_abs, one_minus_pow
from ._signature import Arg, Example, Signature, lr, transform_of
from .rule import Execution, FieldSpec, OptionSpec, Rule

__all__ = [
    "KronState",
    "ProbSchedule",
    "diagonal_axes",
    "draw_probes",
    "einsum_expressions",
    "first_key",
    "kron",
    "merged_shape",
    "precond_update_prob_schedule",
    "with_draws",
]

MEMORY_SAVE_MODES = (None, "smart_one_diag", "one_diag", "all_diag")
BALANCE_PROBABILITY = 0.01  # kron-torch: balance when rng.random() < 0.01 (and updating)
_LETTERS = string.ascii_lowercase + string.ascii_uppercase


class KronState(NamedTuple):
    """The state of one parameter (kron-torch's names, and lucid's counters).

    Attributes:
      step: updates done (float32; kron-torch keeps a Python int).
      momentum_buffer: m, in the merged shape, in ``mu_dtype`` (default: the parameter's).
      Q: the factors laid end to end in ``precond_dtype``: a diagonal factor's ``n``
        values, a triangular one's ``n * n`` entries row by row (kron-torch: a list).
      prob_step: steps counted for the update probability's schedule (kron-torch: the
        optimizer's ``_prob_step``); lucid's, not in the state_dict.
      update_counter: steps since the preconditioner was last updated (kron-torch: the
        optimizer's ``_update_counter``); lucid's, not in the state_dict.
      key: the parameter's ``uint32[2]`` PRNG key; lucid's, not in the state_dict.
      diag: ``int32``, one entry per axis of the merged shape, 1 where the factor is
        diagonal; lucid's, not in the state_dict.
    """

    step: Any
    momentum_buffer: Any
    Q: Any
    prob_step: Any
    update_counter: Any
    key: Any
    diag: Any


# ------------------------------------------------------------------ the schedule


@dataclasses.dataclass(frozen=True)
class ProbSchedule:
    """kron-torch's ``precond_update_prob_schedule``: an exponential anneal with a flat start,
    ``clamp(max_prob * exp(-decay * (n - flat_start)), min_prob, max_prob)`` in float32
    (the four numbers kept as their float32 values, as kron-torch's tensors hold them).

    Attributes:
      max_prob: the probability during the flat start.
      min_prob: the floor it anneals to.
      decay: the exponential rate per step.
      flat_start: steps before the anneal begins.
    """

    max_prob: float = 1.0
    min_prob: float = 0.03
    decay: float = 0.001
    flat_start: float = 500

    def __post_init__(self) -> None:
        # kron-torch keeps the four as float32 tensors: so does this, as Python floats
        for field in dataclasses.fields(self):
            value = float(np.float32(getattr(self, field.name)))
            object.__setattr__(self, field.name, value)

    def __call__(self, n: Any) -> jax.Array:
        """The probability at step ``n`` (steps taken before this one), float32."""
        return _prob(self.max_prob, self.min_prob, self.decay, self.flat_start, n)


def _prob(max_prob: Any, min_prob: Any, decay: Any, flat_start: Any, n: Any) -> jax.Array:
    """kron-torch's ``_schedule_fn`` in its float32 order of operations."""
    f32 = jnp.float32
    max_prob, min_prob, decay, flat_start, n = (
        jnp.asarray(v, f32) for v in (max_prob, min_prob, decay, flat_start, n)
    )
    prob = max_prob * jnp.exp(-decay * (n - flat_start))
    return jnp.minimum(jnp.maximum(prob, min_prob), max_prob)  # torch's clamp_(min, max)


def precond_update_prob_schedule(
    max_prob: float = 1.0, min_prob: float = 0.03, decay: float = 0.001, flat_start: float = 500
) -> ProbSchedule:
    """kron-torch's schedule of the preconditioner's update probability (its defaults keep
    1.0 for 500 steps, then anneal to 0.03 by about step 4000).

    Args:
      max_prob: the probability during the flat start.
      min_prob: the floor it anneals to.
      decay: the exponential rate per step.
      flat_start: steps before the anneal begins.

    Returns:
      A `ProbSchedule`, ``n -> probability`` (jit-traceable).

    Examples:
      >>> from lucid.functional.kron import precond_update_prob_schedule
      >>> schedule = precond_update_prob_schedule()
      >>> [round(float(schedule(n)), 4) for n in (0, 500, 1500, 10000)]
      [1.0, 1.0, 0.3679, 0.03]
    """
    return ProbSchedule(float(max_prob), float(min_prob), float(decay), float(flat_start))


def as_schedule(value: Any) -> Any:
    """A kron-torch ``ProbScheduler`` (from a torch state_dict: its four tensors) as the
    `ProbSchedule` it computes; anything else as given."""
    if isinstance(value, ProbSchedule) or not callable(value):
        return value
    names = ("max_prob", "min_prob", "decay", "flat_start")
    if all(hasattr(value, name) for name in names):
        return ProbSchedule(*(float(np.asarray(getattr(value, name))) for name in names))
    return value


# ------------------------------------------------------------------ the layout


def as_dtype(value: Any, option: str) -> np.dtype | None:
    """A dtype option (``None``, a jax/NumPy dtype or name, or a torch dtype) as a NumPy
    dtype.

    Raises:
      TypeError: not a floating dtype.
    """
    if value is None:
        return None
    text = str(value)
    # a torch dtype (torch.bfloat16, from a kron-torch state_dict) by its name
    name = text.removeprefix("torch.") if text.startswith("torch.") else value
    try:
        dtype = jnp.dtype(name)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{option} must be None or a floating dtype (jnp.float32, jnp.bfloat16, or torch's), "
            f"but got {value!r}"
        )
    return np.dtype(dtype)


def merged_shape(shape: Sequence[int], merge_dims: bool = True) -> tuple[int, ...]:
    """The shape kron-torch preconditions a parameter of ``shape`` in: with ``merge_dims``,
    a tensor of three or more axes as the matrix ``[prod(shape[:-1]), shape[-1]]``, or
    ``[shape[0], prod(shape[1:])]`` where that one's ``columns - rows`` is smaller (the
    taller of the two; kron-torch compares ``np.diff`` of the two, the first wins a tie).

    Args:
      shape: the parameter's shape.
      merge_dims: kron-torch's option.

    Returns:
      The shape of the momentum buffer and of the preconditioned gradient.

    Examples:
      >>> from lucid.functional.kron import merged_shape
      >>> merged_shape((2, 3, 4)), merged_shape((64, 3, 3)), merged_shape((2, 3, 4), False)
      ((6, 4), (192, 3), (2, 3, 4))
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) <= 2 or not merge_dims:
        return shape
    first = (math.prod(shape[:-1]), shape[-1])
    second = (shape[0], math.prod(shape[1:]))
    return first if first[1] - first[0] <= second[1] - second[0] else second


def diagonal_axes(
    shape: Sequence[int],
    max_size_triangular: int,
    min_ndim_triangular: int,
    memory_save_mode: str | None,
) -> tuple[bool, ...]:
    """Which axes of a (merged) ``shape`` get a diagonal factor, as kron-torch's
    ``_init_Q_exprs`` decides.

    Args:
      shape: the merged shape.
      max_size_triangular: larger axes are diagonal.
      min_ndim_triangular: a shape of fewer axes is all diagonal.
      memory_save_mode: ``None``; ``'smart_one_diag'`` (the largest axis, if strictly
        larger than the next); ``'one_diag'`` (the largest axis); ``'all_diag'``.

    Returns:
      One flag per axis, ``True`` for a diagonal factor.

    Raises:
      ValueError: an unknown ``memory_save_mode`` (kron-torch's message).

    Examples:
      >>> from lucid.functional.kron import diagonal_axes
      >>> diagonal_axes((6, 4), 8192, 2, None), diagonal_axes((6, 4), 5, 2, None)
      ((False, False), (True, False))
    """
    shape = tuple(int(s) for s in shape)
    if memory_save_mode not in MEMORY_SAVE_MODES:
        raise ValueError(
            f"Invalid memory_save_mode: {memory_save_mode}, must be one of "
            "[None, 'smart_one_diag', 'one_diag', 'all_diag']"
        )
    diag = [False] * len(shape)
    largest = int(np.argsort(shape)[::-1][0]) if shape else 0  # kron-torch's tie order
    if memory_save_mode == "smart_one_diag":
        ordered = sorted(shape)
        if len(shape) > 1 and ordered[-1] > ordered[-2]:
            diag[largest] = True
    elif memory_save_mode == "one_diag":
        diag[largest] = True
    elif memory_save_mode == "all_diag":
        diag = [True] * len(shape)
    return tuple(
        size == 1 or size > max_size_triangular or len(shape) < min_ndim_triangular or d
        for size, d in zip(shape, diag)
    )


def _offsets(shape: Sequence[int], diag: Sequence[bool]) -> list[tuple[int, int]]:
    """Each factor's ``(start, stop)`` in the packed ``Q``."""
    spans, start = [], 0
    for size, d in zip(shape, diag):
        stop = start + (size if d else size * size)
        spans.append((start, stop))
        start = stop
    return spans


def unpack(packed: jax.Array, shape: Sequence[int], diag: Sequence[bool]) -> list[jax.Array]:
    """The factors of a packed ``Q`` (a diagonal one as a vector, a triangular one as a
    matrix), in axis order."""
    return [
        packed[a:b] if d else packed[a:b].reshape(size, size)
        for (a, b), size, d in zip(_offsets(shape, diag), shape, diag)
    ]


def pack(factors: Sequence[jax.Array]) -> jax.Array:
    """Factors laid end to end (the inverse of `unpack`)."""
    return jnp.concatenate([jnp.ravel(q) for q in factors])


def einsum_expressions(diag: Sequence[bool]) -> tuple[str, tuple[str, ...], str]:
    """The einsum expressions kron-torch keeps in its state as ``exprs`` for a merged shape
    whose axes are ``diag`` (only a state_dict needs them: lucid computes without).

    Args:
      diag: one flag per axis, ``True`` for a diagonal factor.

    Returns:
      ``(exprA, exprGs, exprP)``, kron-torch's strings.

    Examples:
      >>> from lucid.functional.kron import einsum_expressions
      >>> einsum_expressions((False, True))
      ('an,b,nb->ab', ('nb,Ab->nA', 'ao,ao->o'), 'an,o,aA,o,Ao->no')
    """
    k = len(diag)
    if k == 0:
        return ",->", (",->",), ",,->"
    a_pieces, a_in, a_out = [], "", ""
    g_exprs: list[str] = []
    p_left, p_right, p_in, p_out = [], [], "", ""
    for i, d in enumerate(diag):
        x, y, z = _LETTERS[i], _LETTERS[i + 13], _LETTERS[i + 26]
        first = "".join(y if j == i else _LETTERS[j] for j in range(k))
        if d:
            a_pieces.append(x)
            a_in, a_out = a_in + x, a_out + x
            g_exprs.append(f"{first},{first}->{y}")
            p_left.append(y)
            p_right.append(y)
            p_in, p_out = p_in + y, p_out + y
        else:
            a_pieces.append(x + y)
            a_in, a_out = a_in + y, a_out + x
            second = "".join(z if j == i else _LETTERS[j] for j in range(k))
            g_exprs.append(f"{first},{second}->{y}{z}")
            p_left.append(x + y)
            p_right.append(x + z)
            p_in, p_out = p_in + z, p_out + y
    expr_a = ",".join(a_pieces) + "," + a_in + "->" + a_out
    expr_p = ",".join(p_left) + "," + ",".join(p_right) + "," + p_in + "->" + p_out
    return expr_a, tuple(g_exprs), expr_p


# ------------------------------------------------------------------ the draws


def first_key(param: Any) -> jax.Array:
    """A parameter's PRNG key (``uint32[2]``), made from its bits: two parameters of different
    values draw different streams, and a run is reproducible from its parameters.

    Args:
      param: the parameter's value.

    Returns:
      The raw key.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.kron import first_key
      >>> one, zero = first_key(jnp.ones(3)), first_key(jnp.zeros(3))
      >>> one.shape, bool((one == zero).all())
      ((2,), False)
    """
    value = jnp.asarray(param)
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        value = jnp.stack([jnp.real(value), jnp.imag(value)])
    bits = jax.lax.bitcast_convert_type(value.astype(jnp.float32), jnp.uint32)
    weights = jnp.arange(1, bits.size + 1, dtype=jnp.uint32).reshape(bits.shape)
    seed = jnp.sum(bits * jnp.uint32(2654435761) + weights * jnp.uint32(40503), dtype=jnp.uint32)
    return jax.random.fold_in(jax.random.PRNGKey(0), seed)


Draw = Callable[[jax.Array, jax.Array, tuple[int, ...], Any], tuple[jax.Array, jax.Array]]


def draw_probes(
    key: jax.Array, step: jax.Array, shape: tuple[int, ...], dtype: Any
) -> tuple[jax.Array, jax.Array]:
    """The draws of one step of one parameter: the probe ``V ~ N(0, I)`` (kron-torch:
    ``torch.randn_like``) and the balancing draw ``u ~ U[0, 1)`` (kron-torch:
    ``random.Random(42).random()``).

    Args:
      key: the parameter's key (`first_key`).
      step: the parameter's step (from 1).
      shape: the merged shape.
      dtype: ``precond_dtype``.

    Returns:
      ``(V, u)``: ``V`` of ``shape`` and ``dtype``, ``u`` a float32 scalar.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.kron import draw_probes, first_key
      >>> v, u = draw_probes(first_key(jnp.ones(3)), jnp.float32(1), (3,), jnp.float32)
      >>> v.shape, u.dtype
      ((3,), dtype('float32'))
    """
    step_key = jax.random.fold_in(key, jnp.asarray(step, jnp.float32).astype(jnp.uint32))
    probe_key, balance_key = jax.random.split(step_key)
    zero, one = jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)  # no float64 bounds
    u = jax.random.uniform(balance_key, (), jnp.float32, zero, one)
    return jax.random.normal(probe_key, shape, dtype), u


# ------------------------------------------------------------------ options


def _validate_kron(o: dict) -> None:
    """The checks of the options kron-torch reads (it checks none at construction; lucid
    refuses, at construction, values kron-torch would fail on at its first step)."""
    for name in ("mu_dtype", "precond_dtype"):
        as_dtype(o[name], name)
    probability = as_schedule(o["preconditioner_update_probability"])
    # (an array is checked by value with the other hyper-parameters)
    plain = probability is None or callable(probability) or is_number(probability)
    if not plain and getattr(probability, "shape", None) is None:
        raise TypeError(
            "preconditioner_update_probability must be None (kron-torch's schedule), "
            "a number, or a schedule n -> probability, but got "
            f"{type(probability).__name__}: {probability!r}"
        )
    for name in ("max_size_triangular", "min_ndim_triangular"):
        value = o[name]
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, but got {type(value).__name__}: {value!r}")


def _check_at_step(o: dict) -> None:
    """kron-torch's check at a parameter's first step, made before anything moves."""
    if o["memory_save_mode"] not in MEMORY_SAVE_MODES:
        raise ValueError(
            f"Invalid memory_save_mode: {o['memory_save_mode']}, must be one of "
            "[None, 'smart_one_diag', 'one_diag', 'all_diag']"
        )


def _split(o: dict) -> tuple[dict, dict]:
    probability = as_schedule(o["preconditioner_update_probability"])
    if probability is None:
        probability = precond_update_prob_schedule()
    hyper = {
        "lr": o["lr"],
        "b1": o["b1"],
        "weight_decay": o["weight_decay"],
        "precond_lr": o["precond_lr"],
        "precond_init_scale": o["precond_init_scale"],
    }
    schedule = None
    if isinstance(probability, ProbSchedule):  # its four numbers are runtime values
        hyper.update(
            prob_max=probability.max_prob,
            prob_min=probability.min_prob,
            prob_decay=probability.decay,
            prob_flat_start=probability.flat_start,
        )
    elif callable(probability):  # any other schedule: part of the program
        schedule = probability
    else:  # a constant probability p: the schedule clamp(p * exp(0), p, p) = p
        hyper.update(prob_max=probability, prob_min=probability, prob_decay=0.0)
        hyper["prob_flat_start"] = 0.0
    flags = {
        "max_size_triangular": int(o["max_size_triangular"]),
        "min_ndim_triangular": int(o["min_ndim_triangular"]),
        "memory_save_mode": o["memory_save_mode"],
        "momentum_into_precond_update": bool(o["momentum_into_precond_update"]),
        "merge_dims": bool(o["merge_dims"]),
        "mu_dtype": as_dtype(o["mu_dtype"], "mu_dtype"),
        "precond_dtype": as_dtype(o["precond_dtype"], "precond_dtype") or np.dtype(np.float32),
        "schedule": schedule,
        "use_weight_decay": not is_zero(o["weight_decay"]),
    }
    return hyper, flags


def factor_layout(shape: Sequence[int], flags: dict) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    shape = merged_shape(shape, flags["merge_dims"])
    diag = diagonal_axes(
        shape,
        flags["max_size_triangular"],
        flags["min_ndim_triangular"],
        flags["memory_save_mode"],
    )
    return shape, diag


def not_supported(shape: Sequence[int], merge_dims: bool) -> str | None:
    """kron-torch's failure for a parameter of ``shape``, in words, or ``None``."""
    if len(shape) == 0:
        return (
            "Kron does not support 0-d parameters (kron-torch 0.3.3 fails at its step in "
            "torch.permute); give scalars to another optimizer or reshape them to (1,)"
        )
    merged = merged_shape(shape, merge_dims)
    if len(merged) > 13:
        return f"Got tensor with dim {len(merged)}; Einstein runs out of letters!"
    return None


def _init(
    param,
    hyper,
    *,
    max_size_triangular,
    min_ndim_triangular,
    memory_save_mode,
    merge_dims,
    mu_dtype,
    precond_dtype,
    **_,
) -> KronState:
    error = not_supported(jnp.shape(param), merge_dims)
    if error is not None:
        raise (RuntimeError if len(jnp.shape(param)) == 0 else ValueError)(error)
    flags = {
        "max_size_triangular": max_size_triangular,
        "min_ndim_triangular": min_ndim_triangular,
        "memory_save_mode": memory_save_mode,
        "merge_dims": merge_dims,
    }
    shape, diag = factor_layout(jnp.shape(param), flags)
    # kron-torch: scale ** (1 / ndim) on the host, times ones or eye in precond_dtype
    scale = jnp.asarray(hyper["precond_init_scale"]) ** (1.0 / len(shape))
    factors = [
        (jnp.ones(size, precond_dtype) if d else jnp.eye(size, dtype=precond_dtype))
        * scale.astype(precond_dtype)
        for size, d in zip(shape, diag)
    ]
    zero = jnp.zeros((), jnp.float32)
    return KronState(
        step=zero,
        momentum_buffer=jnp.zeros(shape, mu_dtype or param.dtype),
        Q=pack(factors),
        prob_step=zero,
        update_counter=zero,
        key=first_key(param),
        diag=jnp.asarray(diag, jnp.int32),
    )


# ------------------------------------------------------------------ the update


def _axis_first(x: jax.Array, axis: int) -> jax.Array:
    """``x`` with ``axis`` first and the others flattened: ``(n_axis, rest)``."""
    return jnp.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


def _times(x: jax.Array, q: jax.Array, axis: int, *, transpose: bool = False) -> jax.Array:
    """``x`` times ``q`` along ``axis`` (``q`` a vector: elementwise; a matrix:
    ``sum_n q[a, n] x[..n..]``, or ``sum_n q[n, a] x[..n..]`` with ``transpose``)."""
    if q.ndim == 1:
        shape = [1] * x.ndim
        shape[axis] = q.shape[0]
        return x * q.reshape(shape)
    product = jnp.tensordot(q.T if transpose else q, x, axes=([1], [axis]))
    return jnp.moveaxis(product, 0, axis)


def _solve_right(x: jax.Array, q: jax.Array, axis: int, solve_dtype: Any) -> jax.Array:
    """``x`` times ``inv(q)`` from the right along ``axis`` (kron-torch's
    ``_solve_triangular_right``: ``q`` upper triangular, solved in float32)."""
    moved = jnp.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    solved = jax.lax.linalg.triangular_solve(
        q.astype(solve_dtype),
        rows.astype(solve_dtype),
        left_side=False,
        lower=False,
    ).astype(x.dtype)
    return jnp.moveaxis(solved.reshape(moved.shape), -1, axis)


def _gram(x: jax.Array, y: jax.Array, axis: int, diagonal: bool) -> jax.Array:
    """The contraction of ``x`` and ``y`` over every axis but ``axis`` (a vector of the
    diagonal only, for a diagonal factor)."""
    xa, ya = _axis_first(x, axis), _axis_first(y, axis)
    if diagonal:
        return jnp.sum(xa * ya, axis=1)
    return xa @ ya.T


def _lower_bound(s: jax.Array, max_abs_s: jax.Array) -> jax.Array:
    """kron-torch's ``_lb``: a cheap lower bound of the spectral norm of the symmetric
    ``s``, from one power-iteration step on its largest column."""
    s = s / max_abs_s
    column = jnp.argmax(jnp.sum(s * s, axis=0))
    x = s[:, column] @ s
    x = x / jnp.linalg.norm(x)
    return jnp.linalg.norm(s @ x) * max_abs_s


def _balance(factors: list[jax.Array]) -> list[jax.Array]:
    """kron-torch's ``_balance_Q``: each factor scaled so that the largest magnitudes
    share their geometric mean."""
    norms = jnp.stack([max_abs(q) for q in factors])
    mean = jnp.exp(jnp.mean(jnp.log(norms)))
    scales = mean / norms
    return [q * scales[i] for i, q in enumerate(factors)]


def _update_factors(
    factors: list[jax.Array],
    diag: Sequence[bool],
    h: jax.Array,
    v: jax.Array,
    precond_lr: jax.Array,
    solve_dtype: Any,
) -> list[jax.Array]:
    """One PSGD step of every factor from the pair ``(v, h)`` (kron-torch's
    ``_update_precond``, after the noise is added to ``h``)."""
    dtype = h.dtype
    tiny = jnp.asarray(jnp.finfo(dtype).tiny, dtype)
    a = h
    for i, q in enumerate(factors):
        a = _times(a, q, i)
    b = v
    for i, q in enumerate(factors):
        b = b / _broadcast(q, b.ndim, i) if diag[i] else _solve_right(b, q, i, solve_dtype)
    new = []
    for i, (q, d) in enumerate(zip(factors, diag)):
        aa, bb = _gram(a, a, i, d), _gram(b, b, i, d)
        term1, term2 = aa - bb, aa + bb
        term1 = term1 * precond_lr
        norm = max_abs(term2)
        if d:
            new.append(q - term1 * (q / jnp.maximum(norm, tiny)))
        else:
            bound = jnp.where(norm > 0, _lower_bound(term2, norm), norm)
            new.append(q - (jnp.triu(term1) / jnp.maximum(bound, tiny)) @ q)
    return new


def _broadcast(q: jax.Array, ndim: int, axis: int) -> jax.Array:
    shape = [1] * ndim
    shape[axis] = q.shape[0]
    return q.reshape(shape)


def _precondition(factors: list[jax.Array], g: jax.Array) -> jax.Array:
    """``g`` times ``Q_i^T Q_i`` along every axis (kron-torch's ``_precond_grad``)."""
    for i, q in enumerate(factors):
        if q.ndim == 1:
            g = g * _broadcast(q * q, g.ndim, i)
        else:
            g = _times(_times(g, q, i), q, i, transpose=True)
    return g


def _update(
    param,
    grad,
    state,
    h,
    *,
    max_size_triangular,
    min_ndim_triangular,
    memory_save_mode,
    momentum_into_precond_update,
    merge_dims,
    mu_dtype,
    precond_dtype,
    schedule,
    use_weight_decay,
    storage_dtype,
    draw: Draw = draw_probes,
    solve_dtype: Any = jnp.float32,
):
    flags = {
        "max_size_triangular": max_size_triangular,
        "min_ndim_triangular": min_ndim_triangular,
        "memory_save_mode": memory_save_mode,
        "merge_dims": merge_dims,
    }
    shape, diag = factor_layout(jnp.shape(param), flags)
    mu = np.dtype(mu_dtype or storage_dtype)
    pdtype = np.dtype(precond_dtype)
    # when the preconditioner is updated (kron-torch's optimizer-wide counters)
    n = state.prob_step.astype(jnp.float32)
    if schedule is not None:
        probability = jnp.asarray(schedule(n), jnp.float32)
    else:
        probability = _prob(h["prob_max"], h["prob_min"], h["prob_decay"], h["prob_flat_start"], n)
    counter = state.update_counter + 1
    do_update = counter.astype(jnp.float32) >= 1 / probability
    counter = jnp.where(do_update, jnp.zeros_like(counter), counter)
    step = state.step + 1
    t = step.astype(param.dtype)
    v, u = draw(state.key, step, shape, pdtype)
    balance = do_update & (u < BALANCE_PROBABILITY) if len(shape) > 1 else jnp.asarray(False)
    # the momentum, rounded to mu_dtype after each of kron-torch's in-place operations
    g = grad.reshape(shape)
    buf = (state.momentum_buffer * h["b1"]).astype(mu).astype(param.dtype)
    buf = (buf + h["one_minus_b1"] * g).astype(mu)
    debiased = (buf / one_minus_pow(h["one_minus_b1"], t)).astype(mu).astype(pdtype)
    factors = unpack(state.Q.astype(pdtype), shape, diag)  # arrives in the compute dtype

    def updated(factors: list[jax.Array]) -> tuple[list[jax.Array], jax.Array]:
        factors = jax.lax.cond(balance, _balance, lambda f: list(f), factors)
        target = debiased if momentum_into_precond_update else g.astype(pdtype)
        eps = jnp.sqrt(jnp.asarray(np.finfo(np.float32).eps, pdtype))
        noisy = target + eps * jnp.mean(jnp.abs(target)) * v
        new = _update_factors(factors, diag, noisy, v, h["precond_lr"].astype(pdtype), solve_dtype)
        # kron-torch adds the noise to its momentum in place: the step preconditions it
        return new, noisy if momentum_into_precond_update else debiased

    def kept(factors: list[jax.Array]) -> tuple[list[jax.Array], jax.Array]:
        return list(factors), debiased

    factors, direction = jax.lax.cond(do_update, updated, kept, factors)
    pre = _precondition(factors, direction)
    one = jnp.ones((), pdtype)
    rms = jnp.sqrt(jnp.mean(jnp.square(pre)))
    pre = pre * jnp.minimum(one, 1.1 / (rms + jnp.asarray(1e-12, pdtype)))
    pre = pre.reshape(param.shape)
    if use_weight_decay and param.ndim >= 2:  # kron-torch: pre.add_(p, alpha=wd), in place
        wide = jnp.promote_types(pdtype, param.dtype)
        pre = (pre.astype(wide) + h["weight_decay"].astype(wide) * param).astype(pdtype)
    # kron-torch: p.add_(pre.to(p.dtype), alpha=-lr)
    new_param = param + (-h["lr"]) * pre.astype(storage_dtype).astype(param.dtype)
    new_state = KronState(
        step=step,
        momentum_buffer=buf,
        Q=pack(factors),
        prob_step=state.prob_step + 1,
        update_counter=counter,
        key=state.key,
        diag=state.diag,
    )
    return new_param, new_state


KRON = Rule(
    name="Kron",
    state=KronState,
    options=OptionSpec(
        validate=_validate_kron,
        split=_split,
        complements=("b1",),
        check_at_step=_check_at_step,
    ),
    init=_init,
    update=_update,
    fields=FieldSpec(
        scalar=("step", "prob_step", "update_counter"),
        hidden={"prob_step": 0.0, "update_counter": 0.0},
    ),
    supports_complex=False,
    storage_dtype=True,
    execution=Execution(
        elementwise=False,
        whole_per_device=True,
    ),
)


def with_draws(draw: Draw, *, solve_dtype: Any = jnp.float32) -> Rule:
    """The Kron rule drawing through ``draw`` instead of `draw_probes` (a separate rule, so
    nothing compiled for one is reused for the other): the seam through which the tests
    replay kron-torch's draws, in every form.

    Args:
      draw: ``draw(key, step, shape, dtype) -> (V, u)``, as `draw_probes`; jit-traceable.
      solve_dtype: the dtype of the triangular solves (kron-torch: float32; the tests'
        float64 comparison solves in float64 on both sides).

    Returns:
      A `Rule` for `lucid.functional.rule.transform`, or as a `lucid.optim.Kron`
      subclass's ``rule``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from lucid.functional.kron import with_draws
      >>> def zeros(key, step, shape, dtype):
      ...     return jnp.zeros(shape, dtype), jnp.float32(1.0)
      >>> with_draws(zeros).name
      'Kron'
    """
    return dataclasses.replace(
        KRON, update=functools.partial(_update, draw=draw, solve_dtype=solve_dtype)
    )


def _as_probability(value: Any) -> Any:
    """``None`` as kron-torch's default schedule (the constructor stores it in the group),
    a kron-torch ``ProbScheduler`` as the same `ProbSchedule`."""
    return precond_update_prob_schedule() if value is None else as_schedule(value)


KRON_SIGNATURE = Signature(
    (
        lr(0.0003),
        Arg("b1", 0.9, Any, "b₁, the momentum: `m ← b₁ m + (1 - b₁) g`, debiased."),
        Arg(
            "weight_decay",
            0.0,
            Any,
            "λ_wd: `p ← p - γ (P + λ_wd p)` for parameters of two or more axes "
            "(coupled to the preconditioned step, after its clipping).",
        ),
        Arg(
            "preconditioner_update_probability",
            None,
            Any,
            "how often the preconditioner is updated: a number p (every ⌈1/p⌉ steps), a "
            "schedule `n -> p` (jit-traceable), or `None`: kron-torch's "
            "`precond_update_prob_schedule()` (1.0 for 500 steps, annealed to 0.03), which "
            "the group then holds.",
            convert=_as_probability,
        ),
        Arg(
            "max_size_triangular",
            8192,
            int,
            "axes larger than this get a diagonal factor instead of a triangular one.",
        ),
        Arg(
            "min_ndim_triangular",
            2,
            int,
            "a parameter of fewer axes (after merging) gets diagonal factors only.",
        ),
        Arg(
            "memory_save_mode",
            None,
            str | None,
            "`None` (every factor triangular), `'smart_one_diag'` (the largest axis "
            "diagonal if strictly larger than the next), `'one_diag'` (the largest axis "
            "diagonal) or `'all_diag'`.",
        ),
        Arg(
            "momentum_into_precond_update",
            True,
            bool,
            "fit the preconditioner to the debiased momentum rather than the gradient.",
        ),
        Arg("precond_lr", 0.1, Any, "η, the preconditioner's step size."),
        Arg(
            "precond_init_scale",
            1.0,
            Any,
            "each factor starts as `s^(1/k)` times the identity (k axes).",
        ),
        Arg(
            "merge_dims",
            True,
            bool,
            "precondition a tensor of three or more axes as a matrix: `[prod(shape[:-1]), "
            "shape[-1]]` or `[shape[0], prod(shape[1:])]`, kron-torch's choice.",
        ),
        Arg(
            "mu_dtype",
            None,
            Any,
            "the momentum buffer's dtype (`None`: the parameter's); jax's or torch's dtypes.",
        ),
        Arg(
            "precond_dtype",
            None,
            Any,
            "the preconditioner's dtype (`None`: float32, whatever the parameter's); its "
            "triangular solves run in float32 as kron-torch's.",
        ),
    ),
    # the preconditioner's update draws random probes (jax's random bits, which differ
    # between jax 0.4 and later): the example steps with the initial preconditioner
    Example(
        "lr=0.1, preconditioner_update_probability=0.0",
        "[[1.0, -2.0], [0.5, 3.0]]",
        "[[1.0, 0.0], [0.0, 1.0]]",
        "Array([[ 0.9      , -2.       ],\n       [ 0.5      ,  2.8999999]], dtype=float32)",
    ),
)

kron = transform_of(
    KRON,
    KRON_SIGNATURE,
    "kron",
    "PSGD Kron (`kron_torch.Kron`, kron-torch 0.3.3) as an optax transformation.\n\n"
    "Draws come from each parameter's key (`draw_probes`); `with_draws` replays others.",
    raises="RuntimeError: `init` refuses a 0-d parameter (kron-torch fails on one at its "
    "step); ValueError: also an unknown `memory_save_mode`, or more than 13 axes with "
    "`merge_dims=False` (kron-torch's messages).",
)
