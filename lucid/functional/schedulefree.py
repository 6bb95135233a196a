"""Schedule-Free SGD, AdamW and RAdam (the `schedulefree` package, 1.4.1).

Schedule-Free training (Defazio et al., 2024) replaces the learning-rate schedule by an
average. Three sequences live side by side: $z$, the base optimizer's iterate; $x$, a
weighted average of the $z$s (the weights to evaluate); and $y$, the point between them
where the gradient is taken. With $c_{k+1}$ the averaging weight and $\\beta$ the
momentum (`momentum` for SGD, `betas[0]` for the Adam forms):

$$
\\begin{aligned}
y_k &= (1-\\beta)\\, z_k + \\beta\\, x_k \\\\
d_k &= \\nabla f(y_k) + \\lambda y_k
    \\quad\\text{(SGD; the Adam forms take } \\hat g_k / (\\sqrt{v_k/(1-\\beta_2^{k+1})}+\\epsilon)
    + \\lambda y_k) \\\\
z_{k+1} &= z_k - \\gamma_k\\, d_k \\\\
x_{k+1} &= (1-c_{k+1})\\, x_k + c_{k+1}\\, z_{k+1}
\\end{aligned}
$$

with $v_k = \\beta_2 v_{k-1} + (1-\\beta_2) g_k^2$. The package's default classes keep
$y$ in the parameters and update it without forming $x$:
$y \\leftarrow \\mathrm{lerp}(y, z, c_{k+1}) + \\gamma_k(\\beta(1-c_{k+1})-1)\\, d_k$, and
`eval()` moves the parameters to $x = \\mathrm{lerp}(y, z, 1-1/\\beta)$ (`train()` back,
$y = \\mathrm{lerp}(x, z, 1-\\beta)$). The `...Closure` classes keep $x$ in the parameters and
move to $y$ around the closure.

The step size and the weights are host scalars of each parameter group, as the package
computes them in Python before every step, from the group's `k` (steps done), `lr_max`
and `weight_sum`:

$$
\\begin{aligned}
\\gamma_k &= \\gamma \\cdot \\min\\!\\big(1, (k+1)/\\text{warmup\\_steps}\\big)
    \\quad\\text{(RAdam: } \\gamma \\cdot \\text{rect}_k\\text{, RAdam's rectification)} \\\\
\\gamma_{\\max} &= \\max(\\gamma_{\\max}, \\gamma_k), \\qquad
w_{k+1} = (k+1)^{r}\\, \\gamma_{\\max}^{\\,\\text{weight\\_lr\\_power}} \\\\
W_{k+1} &= W_k + w_{k+1}, \\qquad c_{k+1} = w_{k+1} / W_{k+1}\\ (0 \\text{ when } W_{k+1}=0)
\\end{aligned}
$$

RAdam's rectification: with $\\rho_\\infty = 2/(1-\\beta_2) - 1$ and
$\\rho_t = \\rho_\\infty - 2t\\beta_2^t/(1-\\beta_2^t)$ at $t = k+1$, the step is
adaptive (divided by $\\sqrt{v}$) when $\\rho_t > 4$, with
$\\text{rect} = \\sqrt{(\\rho_t-4)(\\rho_t-2)\\rho_\\infty /
((\\rho_\\infty-4)(\\rho_\\infty-2)\\rho_t)}$;
before that it is plain SGD with $\\text{rect} = 1$, or no step at all
($\\text{rect} = 0$) with `silent_sgd_phase` (the default).

The package's other forms. `AdamWScheduleFreePaper` (the paper's experiments) puts the
bias correction in the step size and none in the direction:
$\\gamma_k = \\gamma \\cdot \\min(1, (k+1)/\\text{warmup\\_steps}) \\cdot
\\sqrt{1-\\beta_2^{k+1}}$ (in `scheduled_lr`, `lr_max` and the weights too) and
$d_k = g_k/(\\sqrt{v_k}+\\epsilon) + \\lambda y_k$; the rest is `AdamWScheduleFree`'s rule,
shared. The Reference forms (`SGDScheduleFreeReference`, `AdamWScheduleFreeReference`)
have the same scalars and keep $x$ and $y$ in the state beside $z$, forming $x$ at every
step in the package's order (products, not lerps):

$$
\\begin{aligned}
z &\\leftarrow z - \\gamma_k \\lambda\\, (y \\text{, or } z \\text{ with decay\\_at\\_z)}
    \\quad\\text{(AdamW; SGD adds } \\lambda y \\text{ to the gradient)} \\\\
z &\\leftarrow z - \\gamma_k\\, d_k, \\qquad
x \\leftarrow (1-c_{k+1})\\, x + c_{k+1}\\, z, \\qquad
y \\leftarrow \\beta x + (1-\\beta)\\, z
\\end{aligned}
$$

with $d_k$ AdamW's $g_k/(\\sqrt{v_k/(1-\\beta_2^{k+1})}+\\epsilon)$ (the same code as the
default form's) or SGD's $g_k + \\lambda y_k$; the parameters are $y$.

In a pure pipeline the transforms below hold $y$ in the parameters, as the package's
default classes do; [eval_params][lucid.functional.schedulefree.eval_params] gives $x$
(the weights to evaluate or save) and
[train_params][lucid.functional.schedulefree.train_params] goes back.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from . import _validate
from ._apply import (
    apply_leaf,
    as_hyper,
    check_complex,
    check_same_structure,
    compute_dtype,
    host_float,
    is_zero,
    pack,
    resolve,
)
from ._math import lerp, one_minus_pow, power
from ._signature import Arg, Example, Signature, docstring, entry, record_factory
from .rule import FieldSpec, OptionSpec, Rule

Array = jax.Array

__all__ = [
    "ScheduleFreeReferenceState",
    "ScheduleFreeState",
    "ScheduleFreeTransformState",
    "adamw_schedulefree",
    "adamw_schedulefree_paper",
    "adamw_schedulefree_reference",
    "eval_params",
    "radam_schedulefree",
    "sgd_schedulefree",
    "sgd_schedulefree_reference",
    "train_params",
]


class ScheduleFreeState(NamedTuple):
    """One parameter's Schedule-Free state (the package's names).

    Attributes:
      z: the base optimizer's iterate $z$ (the package's `state['z']`).
      exp_avg_sq: $v$, the average of the squared gradient (AdamW and RAdam; `None`
        for SGD, which keeps none).
      started: lucid only, not in the state_dict: `None` until the parameter's first
        step, which takes $z$ from the parameter (the package clones it then), 1 after. A
        change of structure, not a value: the steps after the first read $z$ alone (no
        select against the parameter), so an in-place compiled step needs no copies.
    """

    z: Any
    exp_avg_sq: Any
    started: Any


class ScheduleFreeTransformState(NamedTuple):
    """The state of a Schedule-Free transform: the group's counters and the per-parameter
    sequences.

    Attributes:
      k: steps done (the package's group entry `k`), an int32 scalar.
      lr_max: the largest scheduled step size so far (the group's `lr_max`, starting
        at -1 as the package's).
      weight_sum: the sum of the averaging weights so far (the group's `weight_sum`).
      z: $z$, a pytree shaped like the parameters.
      exp_avg_sq: $v$, a pytree shaped like the parameters (`None` for SGD).
      x: the average $x$, a pytree shaped like the parameters (the Reference forms
        only; `None` for the others, which never form it).
      y: $y$ as the Reference forms keep it (equal to the parameters they update);
        `None` for the others.
    """

    k: Any
    lr_max: Any
    weight_sum: Any
    z: Any
    exp_avg_sq: Any
    x: Any = None
    y: Any = None


# -- the group's host scalars, as the package computes them before each step ---------------


class _Host:
    """Python arithmetic (the package's, bit for bit)."""

    @staticmethod
    def maximum(a: Any, b: Any) -> Any:
        return max(a, b)

    @staticmethod
    def select(cond: Any, a: Callable[[], Any], b: Callable[[], Any]) -> Any:
        return a() if cond else b()

    @staticmethod
    def ratio(weight: Any, total: Any) -> Any:
        try:
            return weight / total
        except ZeroDivisionError:
            return 0

    @staticmethod
    def pow(beta: Any, t: Any) -> Any:
        return beta**t

    @staticmethod
    def one_minus_pow(beta: Any, t: Any) -> Any:
        return 1 - beta**t

    @staticmethod
    def sqrt(x: Any) -> Any:
        return math.sqrt(x)


class _Traced:
    """The same arithmetic in a jitted graph (the functional transforms); ``beta**t``
    and ``1 - beta**t`` in the forms that keep float32 accurate for beta near 1."""

    @staticmethod
    def maximum(a: Any, b: Any) -> Any:
        return jnp.maximum(a, b)

    @staticmethod
    def select(cond: Any, a: Callable[[], Any], b: Callable[[], Any]) -> Any:
        return jnp.where(cond, a(), b())

    @staticmethod
    def ratio(weight: Any, total: Any) -> Any:
        zero = total == 0
        return jnp.where(zero, jnp.zeros_like(weight), weight / jnp.where(zero, 1, total))

    @staticmethod
    def pow(beta: Any, t: Any) -> Any:
        return power(1 - beta, t)

    @staticmethod
    def one_minus_pow(beta: Any, t: Any) -> Any:
        return one_minus_pow(1 - beta, t)

    @staticmethod
    def sqrt(x: Any) -> Any:
        return jnp.sqrt(x)


def _advance(kind: str, o: Mapping[str, Any], ops: Any) -> dict[str, Any]:
    """One step's scalars from a group's values before the step: the scheduled `lr`,
    the averaging weight `ckp1`, the group's new `lr_max` and `weight_sum` (and, for the
    Adam forms, `bias_correction2`; for RAdam whether the step is `adaptive`, 1 or 0).

    ``o`` holds `lr, k, lr_max, weight_sum, r, weight_lr_power`, the betas (Adam forms)
    and `warmup_steps` (SGD, AdamW) or `silent_sgd_phase` (RAdam), as Python numbers
    (``ops=_Host``: the package's own expressions) or some as arrays (``ops=_Traced``)."""
    k = o["k"]
    step = k + 1
    out: dict[str, Any] = {}
    if kind == "radam":
        beta2 = o["betas"][1]
        beta2_t = ops.pow(beta2, step)
        bias_correction2 = ops.one_minus_pow(beta2, step)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2_t / bias_correction2
        adaptive = rho_t > 4.0
        fallback = float(not o["silent_sgd_phase"])

        def rectified() -> Any:
            ratio = (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
            if ops is _Traced:  # the branch not taken must not be a NaN's square root
                return jnp.sqrt(jnp.where(adaptive, ratio, 1.0))
            return ratio**0.5

        lr = o["lr"] * ops.select(adaptive, rectified, lambda: fallback)
        out["bias_correction2"] = bias_correction2
        out["adaptive"] = ops.select(adaptive, lambda: 1.0, lambda: 0.0)
    else:
        warmup = o["warmup_steps"]
        lr = o["lr"] * ops.select(k < warmup, lambda: step / warmup, lambda: 1.0)
        if kind in ("adamw", "paper"):
            out["bias_correction2"] = ops.one_minus_pow(o["betas"][1], step)
        if kind == "paper":  # the paper's version: the bias correction is in the step size
            lr = lr * ops.sqrt(out["bias_correction2"])
    lr_max, weight, weight_sum = averaging_weight(
        lr, step, o["lr_max"], o["weight_sum"], o["r"], o["weight_lr_power"], ops
    )
    out.update(lr=lr, lr_max=lr_max, weight_sum=weight_sum, ckp1=ops.ratio(weight, weight_sum))
    return out


def averaging_weight(
    lr: Any,
    step: Any,
    lr_max: Any,
    weight_sum: Any,
    r: Any,
    weight_lr_power: Any,
    ops: Any = _Host,
) -> tuple[Any, Any, Any]:
    r"""The package's polynomial averaging weight of one step: the largest step size so
    far $\gamma_{\max} = \max(\gamma, \gamma_{\max})$, the weight
    $w = t^r \gamma_{\max}^p$ and the running sum $\sum w$; the average's coefficient
    is $c = w / \sum w$ (each caller divides, with its own rule for a zero sum).

    Args:
      lr: this step's step size $\gamma$.
      step: the step number $t$ (`k + 1`).
      lr_max: $\gamma_{\max}$ before this step.
      weight_sum: $\sum w$ before this step.
      r: the power of the polynomial weighting.
      weight_lr_power: $p$, the power of $\gamma_{\max}$.
      ops: the arithmetic (Python numbers by default, the package's expressions).

    Returns:
      `(lr_max, weight, weight_sum)` after this step.

    Examples:
      >>> from lucid.functional.schedulefree import averaging_weight
      >>> averaging_weight(0.5, 2, 1.0, 3.0, r=1.0, weight_lr_power=2.0)
      (1.0, 2.0, 5.0)
    """
    lr_max = ops.maximum(lr, lr_max)
    weight = (step**r) * (lr_max**weight_lr_power)
    return lr_max, weight, weight_sum + weight


# -- the rules ----------------------------------------------------------------------------

_GROUP = ("lr", "k", "lr_max", "weight_sum", "r", "weight_lr_power")


def _kind_of(name: str) -> str:
    """The step's family: `sgd`, `adamw`, `radam`, or `paper` (AdamW with the paper's
    bias correction); the Reference forms are their family's."""
    if name.endswith("Paper"):
        return "paper"
    return {"SGD": "sgd", "AdamW": "adamw", "RAdam": "radam"}[name.split("ScheduleFree")[0]]


def _momentum(o: Mapping[str, Any]) -> Any:
    return o["momentum"] if "momentum" in o else o["betas"][0]


def _host_group(kind: str, o: Mapping[str, Any]) -> dict[str, Any]:
    """The group's entries the step's scalars come from, as host numbers (integers
    stay integers: the package's ``k`` is one)."""
    values: dict[str, Any] = dict(o)
    for name in (*_GROUP, "weight_decay", "eps", "momentum", "warmup_steps"):
        if name in o and not isinstance(o[name], int):
            values[name] = host_float(o[name], name)
    if "betas" in o:
        values["betas"] = tuple(
            b if isinstance(b, int) else host_float(b, "betas") for b in o["betas"]
        )
    return values


def _step_hyper(kind: str, closure: bool, o: Mapping[str, Any], s: Mapping[str, Any]) -> dict:
    """The rule's hyper-parameters for one step: ``s`` from `_advance`, the rest from
    the group ``o`` (numbers or arrays alike)."""
    momentum = _momentum(o)
    hyper = {"lr": s["lr"], "ckp1": s["ckp1"], "weight_decay": o["weight_decay"]}
    if closure:
        hyper["unextrapolate"] = 1 - 1 / momentum
    else:
        hyper["y_lr"] = s["lr"] * (momentum * (1 - s["ckp1"]) - 1)
    if kind != "sgd":
        # the paper's version divides by √v: its bias correction is in lr (1 here: v / 1 = v)
        correction = 1.0 if kind == "paper" else s["bias_correction2"]
        hyper.update(eps=o["eps"], beta2=o["betas"][1], bias_correction2=correction)
    if kind == "radam":
        hyper["adaptive"] = s["adaptive"]
    return hyper


def _split_for(kind: str, closure: bool) -> Callable[[Mapping[str, Any]], tuple[dict, dict]]:
    def split(o: Mapping[str, Any]) -> tuple[dict, dict]:
        values = _host_group(kind, o)
        hyper = _step_hyper(kind, closure, values, _advance(kind, values, _Host))
        return hyper, _flags(o)

    return split


def _flags(o: Mapping[str, Any]) -> dict[str, Any]:
    return {"use_weight_decay": not is_zero(o["weight_decay"])}


def _init_for(kind: str) -> Callable[..., ScheduleFreeState]:
    def init(param: Array, hyper: Mapping[str, Any], **_: Any) -> ScheduleFreeState:
        # z is taken from the parameter at its first step (see ScheduleFreeState.started):
        # a new state reads only the parameter's shape, as the compiled step requires
        return ScheduleFreeState(
            z=jnp.zeros_like(param),
            exp_avg_sq=None if kind == "sgd" else jnp.zeros_like(param),
            started=None,
        )

    return init


def _adam_direction(exp_avg_sq: Array, grad: Array, h: Mapping[str, Array]) -> tuple:
    """The Adam forms' normalised gradient (every AdamW and RAdam form's, the Reference's
    too): ``v ← β₂ v + (1-β₂) g²``, ``g / (√(v / bias_correction2) + ε)``; returns
    ``(v, direction)``."""
    exp_avg_sq = exp_avg_sq * h["beta2"] + h["one_minus_beta2"] * grad * grad
    denom = jnp.sqrt(exp_avg_sq / h["bias_correction2"]) + h["eps"]
    return exp_avg_sq, grad / denom


def _update_for(kind: str, closure: bool) -> Callable[..., tuple[Array, ScheduleFreeState]]:
    def update(param, grad, state, h, *, use_weight_decay):
        z = param if state.started is None else state.z  # the package's clone at step 1
        exp_avg_sq = None
        d = grad
        if kind != "sgd":
            exp_avg_sq, d = _adam_direction(state.exp_avg_sq, grad, h)
            if kind == "radam":
                d = jnp.where(h["adaptive"] > 0, d, grad)
        if use_weight_decay:
            d = d + h["weight_decay"] * param  # decay at y
        if closure:  # the parameter holds y here and x after
            x = lerp(param, z, h["unextrapolate"])
            z = z - h["lr"] * d
            new_param = lerp(x, z, h["ckp1"])
        else:  # the parameter holds y
            new_param = lerp(param, z, h["ckp1"]) + h["y_lr"] * d
            z = z - h["lr"] * d
        return new_param, ScheduleFreeState(z, exp_avg_sq, jnp.ones((), jnp.float32))

    return update


def _validate_for(name: str) -> Callable[[Mapping[str, Any]], None]:
    def validate(o: Mapping[str, Any]) -> None:
        # the package checks values only in SGD's constructors; lucid checks every group
        # (added, edited or loaded) the same way, and that every hyper-parameter is a
        # real scalar, so the step's scalars can be computed
        for key in ("lr", "weight_decay", "r", "weight_lr_power"):
            _validate.scalar(o[key], key, schedules=key == "lr")
        if "momentum" in o:
            _validate.scalar(o["momentum"], "momentum", schedules=False)
            check_sgd(o)
        else:
            _validate.check_pair(o["betas"], "betas")
            _validate.scalar(o["eps"], "eps", schedules=False)
            beta2 = _validate.scalar(o["betas"][1], "betas[1]")
            if name.startswith("RAdam") and beta2 is not None and beta2 >= 1:
                raise ValueError(
                    f"{name} divides by 1 - betas[1] (ρ∞ = 2/(1-β₂) - 1): betas[1] must be "
                    f"below 1, got {o['betas'][1]}"
                )
            if name.endswith("Closure") and _validate.scalar(o["betas"][0], "betas[0]") == 0:
                raise ValueError(
                    f"{name} divides by betas[0] at every step (x = lerp(y, z, 1 - 1/β₁)): "
                    "it must not be 0"
                )
        if "warmup_steps" in o:
            _validate.scalar(o["warmup_steps"], "warmup_steps", schedules=False)
        for key in ("k", "lr_max", "weight_sum"):
            if key in o:
                _validate.scalar(o[key], key, schedules=False)

    return validate


def check_sgd(o: Mapping[str, Any]) -> None:
    """The package's checks in `SGDScheduleFree`'s constructor (and the closure form's),
    with its messages.

    Args:
      o: the options (a group).

    Raises:
      ValueError: `Invalid learning rate: -1.0`, `Invalid weight_decay value: -1.0`,
        `Momentum must be between 0 and 1 exclusive: 1.0`.
    """
    lr = _validate.scalar(o["lr"], "lr")
    if lr is not None and lr < 0.0:
        raise ValueError(f"Invalid learning rate: {o['lr']}")
    if _validate.scalar(o["weight_decay"], "weight_decay") < 0.0:
        raise ValueError(f"Invalid weight_decay value: {o['weight_decay']}")
    momentum = _validate.scalar(o["momentum"], "momentum")
    if momentum <= 0 or momentum >= 1:
        raise ValueError(f"Momentum must be between 0 and 1 exclusive: {o['momentum']}")


def _rule(name: str, closure: bool) -> Rule:
    kind = _kind_of(name)
    return Rule(
        name=name,
        state=ScheduleFreeState,
        options=OptionSpec(
            validate=_validate_for(name),
            split=_split_for(kind, closure),
            complements=() if kind == "sgd" else ("beta2",),
        ),
        init=_init_for(kind),
        update=_update_for(kind, closure),
        fields=FieldSpec(
            scalar=("started",),
            hidden={"started": 1.0},
        ),
        supports_complex=False,
    )


SGD_SCHEDULEFREE = _rule("SGDScheduleFree", closure=False)
ADAMW_SCHEDULEFREE = _rule("AdamWScheduleFree", closure=False)
RADAM_SCHEDULEFREE = _rule("RAdamScheduleFree", closure=False)
SGD_SCHEDULEFREE_CLOSURE = _rule("SGDScheduleFreeClosure", closure=True)
ADAMW_SCHEDULEFREE_CLOSURE = _rule("AdamWScheduleFreeClosure", closure=True)
RADAM_SCHEDULEFREE_CLOSURE = _rule("RAdamScheduleFreeClosure", closure=True)
ADAMW_SCHEDULEFREE_PAPER = _rule("AdamWScheduleFreePaper", closure=False)


# -- the package's Reference forms: x and y kept in the state, x formed at every step ------


class ScheduleFreeReferenceState(NamedTuple):
    """One parameter's state in the package's Reference forms (`SGDScheduleFreeReference`,
    `AdamWScheduleFreeReference`), which keep all three sequences (the package's names).

    Attributes:
      z: the base optimizer's iterate $z$.
      exp_avg_sq: $v$ (AdamW; `None` for SGD).
      x: the average $x$ (what `eval()` copies into the parameter).
      y: the point $y$ where the gradient is taken (what `train()` copies back).
      started: lucid only, as `ScheduleFreeState.started`: `None` until the first step,
        which takes $z$, $x$ and $y$ from the parameter (the package's clones).
    """

    z: Any
    exp_avg_sq: Any
    x: Any
    y: Any
    started: Any


def _reference_hyper(kind: str, o: Mapping[str, Any], s: Mapping[str, Any]) -> dict:
    """The Reference forms' hyper-parameters for one step (``s`` from `_advance`)."""
    hyper = {
        "lr": s["lr"],
        "ckp1": s["ckp1"],
        "momentum": _momentum(o),
        "weight_decay": o["weight_decay"],
    }
    if kind != "sgd":  # AdamW's decay is z ← z - (γλ) · (y or z), γλ a host product
        hyper.update(
            eps=o["eps"],
            beta2=o["betas"][1],
            bias_correction2=s["bias_correction2"],
            decay_lr=s["lr"] * o["weight_decay"],
        )
    return hyper


def _reference_flags(o: Mapping[str, Any]) -> dict[str, Any]:
    flags = _flags(o)
    if "decay_at_z" in o:
        flags["decay_at_z"] = bool(o["decay_at_z"])
    return flags


def _reference_split(kind: str) -> Callable[[Mapping[str, Any]], tuple[dict, dict]]:
    def split(o: Mapping[str, Any]) -> tuple[dict, dict]:
        values = _host_group(kind, o)
        return _reference_hyper(kind, values, _advance(kind, values, _Host)), _reference_flags(o)

    return split


def _reference_init(kind: str) -> Callable[..., ScheduleFreeReferenceState]:
    def init(param: Array, hyper: Mapping[str, Any], **_: Any) -> ScheduleFreeReferenceState:
        return ScheduleFreeReferenceState(
            z=jnp.zeros_like(param),
            exp_avg_sq=None if kind == "sgd" else jnp.zeros_like(param),
            x=jnp.zeros_like(param),
            y=jnp.zeros_like(param),
            started=None,
        )

    return init


def _reference_update(kind: str) -> Callable[..., tuple[Array, ScheduleFreeReferenceState]]:
    def update(param, grad, state, h, *, use_weight_decay, decay_at_z=False):
        if state.started is None:  # the package's three clones at the first step
            z = x = y = param
        else:
            z, x, y = state.z, state.x, state.y
        exp_avg_sq = None
        if kind == "sgd":
            d = grad + h["weight_decay"] * y if use_weight_decay else grad  # decay at y
            z = z - h["lr"] * d
        else:
            if use_weight_decay:
                z = z - h["decay_lr"] * (z if decay_at_z else y)
            exp_avg_sq, d = _adam_direction(state.exp_avg_sq, grad, h)
            z = z - h["lr"] * d
        # x.mul_(1-c).add_(z, alpha=c), then y = β x + (1-β) z: not lerps, as the package's
        x = x * h["one_minus_ckp1"] + h["ckp1"] * z
        y = x * h["momentum"] + h["one_minus_momentum"] * z
        return y, ScheduleFreeReferenceState(z, exp_avg_sq, x, y, jnp.ones((), jnp.float32))

    return update


def _reference_rule(name: str) -> Rule:
    kind = _kind_of(name)
    return Rule(
        name=name,
        state=ScheduleFreeReferenceState,
        options=OptionSpec(
            validate=_validate_for(name),
            split=_reference_split(kind),
            complements=("ckp1", "momentum") + (() if kind == "sgd" else ("beta2",)),
        ),
        init=_reference_init(kind),
        update=_reference_update(kind),
        fields=FieldSpec(
            scalar=("started",),
            hidden={"started": 1.0},
        ),
        supports_complex=False,
    )


SGD_SCHEDULEFREE_REFERENCE = _reference_rule("SGDScheduleFreeReference")
ADAMW_SCHEDULEFREE_REFERENCE = _reference_rule("AdamWScheduleFreeReference")


# -- signatures ---------------------------------------------------------------------------


def _lr(default: float) -> Arg:
    return Arg(
        "lr",
        default,
        Any,
        "γ, the learning rate (the peak step size after warm-up): a float, a one-element "
        "array, or (in `lucid.functional` only) a schedule `step -> lr`.",
    )


MOMENTUM = Arg(
    "momentum",
    0.9,
    Any,
    "β, the interpolation between the average x and the iterate z at which the gradient "
    "is taken (`y = (1-β) z + β x`); strictly between 0 and 1.",
)
BETAS = Arg(
    "betas",
    (0.9, 0.999),
    tuple[Any, Any],
    "(β₁, β₂): β₁ is the interpolation `y = (1-β₁) z + β₁ x` (the package's momentum), β₂ "
    "the decay of the average of the squared gradient (v).",
    convert=lambda value: tuple(value) if isinstance(value, list | tuple) else value,
)
EPS = Arg("eps", 1e-8, Any, "ε, added to √(v / (1-β₂^t)) for numerical stability.")
WEIGHT_DECAY = Arg(
    "weight_decay",
    0,
    Any,
    "λ: L2 penalty computed at y, `d ← d + λ y` (after the Adam forms' normalisation).",
)
WARMUP_STEPS = Arg(
    "warmup_steps",
    0,
    Any,
    "linear warm-up: the step size is `lr · (k+1)/warmup_steps` for the first "
    "`warmup_steps` steps (no scheduler is needed).",
)


def _r(default: Any) -> Arg:
    return Arg("r", default, Any, "the power of the polynomial weighting `(k+1)^r` of the average.")


def _weight_lr_power(default: Any) -> Arg:
    return Arg(
        "weight_lr_power",
        default,
        Any,
        "the weights of the average are `lr_max` to this power (during warm-up, later steps "
        "weigh more); 0 for uniform weights.",
    )


FOREACH_SF = Arg(
    "foreach",
    True,
    bool | None,
    "the package's choice of multi-tensor kernels (default `True` where torch has them): "
    "accepted, kept in the groups, and ignored (XLA fuses the update).",
)
SILENT_SGD_PHASE = Arg(
    "silent_sgd_phase",
    True,
    bool,
    "while RAdam's rectification is off (ρ_t ≤ 4, the first steps), take no step at all "
    "(`True`, the package's recommendation) instead of plain SGD steps.",
)

_GROUP_ENTRIES = ("k", "train_mode", "weight_sum", "lr_max", "scheduled_lr")
_TRAIN_GROUP = {"k": 0, "train_mode": False, "weight_sum": 0.0, "lr_max": -1.0, "scheduled_lr": 0.0}
_CLOSURE_GROUP = {"k": 0, "weight_sum": 0.0, "lr_max": 0.0, "scheduled_lr": 0.0}

SGD_SCHEDULEFREE_SIGNATURE = Signature(
    (
        _lr(1.0),
        MOMENTUM,
        WEIGHT_DECAY,
        WARMUP_STEPS,
        _r(0.0),
        _weight_lr_power(2),
        FOREACH_SF,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"),
    fixed=_TRAIN_GROUP,
)
SGD_SCHEDULEFREE_CLOSURE_SIGNATURE = Signature(
    (
        _lr(1.0),
        WEIGHT_DECAY,
        MOMENTUM,
        WARMUP_STEPS,
        _r(0.0),
        _weight_lr_power(2.0),
        FOREACH_SF,
    ),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"),
    fixed=_CLOSURE_GROUP,
)
_ADAM_ARGS = (_lr(0.0025), BETAS, EPS, WEIGHT_DECAY)
ADAMW_SCHEDULEFREE_SIGNATURE = Signature(
    (*_ADAM_ARGS, WARMUP_STEPS, _r(0.0), _weight_lr_power(2.0), FOREACH_SF),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
    fixed=_TRAIN_GROUP,
)
ADAMW_SCHEDULEFREE_CLOSURE_SIGNATURE = Signature(
    (*_ADAM_ARGS, WARMUP_STEPS, _r(0), _weight_lr_power(2.0), FOREACH_SF),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
    fixed=_CLOSURE_GROUP,
)
RADAM_SCHEDULEFREE_SIGNATURE = Signature(
    (*_ADAM_ARGS, _r(0.0), _weight_lr_power(2.0), FOREACH_SF, SILENT_SGD_PHASE),
    Example(
        "lr=0.1, silent_sgd_phase=False",
        "[1.0, -2.0]",
        "[0.5, -1.0]",
        "Array([ 0.95, -1.9 ], dtype=float32)",
    ),
    fixed=_TRAIN_GROUP,
)
RADAM_SCHEDULEFREE_CLOSURE_SIGNATURE = Signature(
    (*_ADAM_ARGS, _r(0), _weight_lr_power(2.0), FOREACH_SF, SILENT_SGD_PHASE),
    Example(
        "lr=0.1, silent_sgd_phase=False",
        "[1.0, -2.0]",
        "[0.5, -1.0]",
        "Array([ 0.95, -1.9 ], dtype=float32)",
    ),
    fixed=_CLOSURE_GROUP,
)
ADAMW_SCHEDULEFREE_PAPER_SIGNATURE = Signature(
    ADAMW_SCHEDULEFREE_SIGNATURE.args,
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
    fixed=_TRAIN_GROUP,
)
SGD_SCHEDULEFREE_REFERENCE_SIGNATURE = Signature(
    SGD_SCHEDULEFREE_SIGNATURE.args,
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.95, -1.9 ], dtype=float32)"),
    fixed={**_TRAIN_GROUP, "train_mode": True},  # the package's Reference SGD starts training
)
DECAY_AT_Z = Arg(
    "decay_at_z",
    False,
    bool,
    "compute the weight decay at z (`z ← z - γλ z`) instead of at y (`z ← z - γλ y`).",
)
FOREACH_IGNORED = Arg(
    "foreach",
    False,
    bool | None,
    "accepted and ignored, and not kept in the groups (the package's Reference AdamW).",
)
ADAMW_SCHEDULEFREE_REFERENCE_SIGNATURE = Signature(
    (*_ADAM_ARGS, WARMUP_STEPS, _r(0), _weight_lr_power(2), DECAY_AT_Z, FOREACH_IGNORED),
    Example("lr=0.1", "[1.0, -2.0]", "[0.5, -1.0]", "Array([ 0.9, -1.9], dtype=float32)"),
    fixed=_TRAIN_GROUP,
    complete=lambda options: {k: v for k, v in options.items() if k != "foreach"},
)


# -- the pure transforms ------------------------------------------------------------------


def _transform(rule: Rule, kind: str, options: dict[str, Any]) -> optax.GradientTransformation:
    rule.options.validate(options)
    reference = rule.state is ScheduleFreeReferenceState
    flags = _reference_flags(options) if reference else _flags(options)
    names = ("lr", "weight_decay", "r", "weight_lr_power", "eps", "warmup_steps", "momentum")
    constants = {name: as_hyper(options[name]) for name in names if name in options}
    if "betas" in options:
        constants["betas"] = tuple(as_hyper(b) for b in options["betas"])
    if "silent_sgd_phase" in options:
        constants["silent_sgd_phase"] = bool(options["silent_sgd_phase"])

    def init_fn(params: Any) -> ScheduleFreeTransformState:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        leaves = [jnp.asarray(p) for p in leaves]
        for p in leaves:
            check_complex(rule, p.dtype)
        wide = _wide(leaves)

        def copies() -> Any:
            return treedef.unflatten([jnp.array(p, copy=True) for p in leaves])

        return ScheduleFreeTransformState(
            k=jnp.zeros((), jnp.int32),
            lr_max=jnp.asarray(-1.0, wide),
            weight_sum=jnp.zeros((), wide),
            z=copies(),
            exp_avg_sq=None
            if kind == "sgd"
            else treedef.unflatten([jnp.zeros_like(p) for p in leaves]),
            x=copies() if reference else None,
            y=copies() if reference else None,
        )

    def update_fn(grads: Any, state: ScheduleFreeTransformState, params: Any = None):
        check_same_structure(grads, params, rule.name)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        grad_leaves = treedef.flatten_up_to(grads)
        z_leaves = treedef.flatten_up_to(state.z)
        v_leaves = (
            [None] * len(leaves) if kind == "sgd" else treedef.flatten_up_to(state.exp_avg_sq)
        )
        x_leaves, y_leaves = (
            (treedef.flatten_up_to(state.x), treedef.flatten_up_to(state.y))
            if reference
            else ([None] * len(leaves),) * 2
        )
        dtype = state.weight_sum.dtype
        group = {
            **constants,
            "lr": resolve({"lr": constants["lr"]}, state.k, dtype)["lr"],
            "k": state.k.astype(dtype),
            "lr_max": state.lr_max,
            "weight_sum": state.weight_sum,
        }
        scalars = _advance(kind, group, _Traced)
        if reference:
            step_hyper = pack(rule, _reference_hyper(kind, group, scalars))
        else:
            step_hyper = pack(rule, _step_hyper(kind, False, group, scalars))
        updates, zs, vs, xs, ys = [], [], [], [], []
        one = jnp.ones((), jnp.float32)
        for p, g, z, v, x, y in zip(leaves, grad_leaves, z_leaves, v_leaves, x_leaves, y_leaves):
            cdtype = compute_dtype(p.dtype)
            leaf_hyper = {name: jnp.asarray(h, cdtype) for name, h in step_hyper.items()}
            if reference:
                leaf_state = ScheduleFreeReferenceState(z, v, x, y, one)
            else:
                leaf_state = ScheduleFreeState(z, v, one)
            new_p, new_s = apply_leaf(rule, flags, leaf_hyper, p, g, leaf_state)
            updates.append(new_p - p)
            zs.append(new_s.z)
            vs.append(new_s.exp_avg_sq)
            if reference:
                xs.append(new_s.x)
                ys.append(new_s.y)
        new_state = ScheduleFreeTransformState(
            k=state.k + 1,
            lr_max=jnp.asarray(scalars["lr_max"], dtype),
            weight_sum=jnp.asarray(scalars["weight_sum"], dtype),
            z=treedef.unflatten(zs),
            exp_avg_sq=None if kind == "sgd" else treedef.unflatten(vs),
            x=treedef.unflatten(xs) if reference else None,
            y=treedef.unflatten(ys) if reference else None,
        )
        return treedef.unflatten(updates), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def _wide(leaves: list[Array]) -> Any:
    """The group scalars' dtype: float64 when any parameter computes in float64."""
    dtypes = {compute_dtype(p.dtype) for p in leaves}
    return jnp.float64 if jnp.dtype(jnp.float64) in dtypes else jnp.float32


def _factory(
    rule: Rule, signature: Signature, name: str, prose: str
) -> Callable[..., optax.GradientTransformation]:
    kind = _kind_of(rule.name)
    public = signature

    def factory(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
        options = public.bind(name, args, kwargs)
        return _transform(rule, kind, {k: v for k, v in options.items() if k not in _GROUP_ENTRIES})

    factory.__name__ = factory.__qualname__ = name
    factory.__module__ = __name__
    factory.torch_signature = public  # type: ignore[attr-defined]
    factory.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        public.parameters, return_annotation=optax.GradientTransformation
    )
    returns = (
        "An `optax.GradientTransformation` whose state is a `ScheduleFreeTransformState`; "
        "the parameters it updates are the sequence y (the package's training mode)."
    )
    factory.__doc__ = docstring(
        prose,
        {
            "Args": public.args_doc(),
            "Returns": "\n".join(textwrap.wrap(returns, width=84)),
            "Raises": entry(
                "TypeError",
                "an argument the package's signature does not take, or a hyper-parameter "
                "that is not a real number or one-element array.",
            ),
            "Examples": public.example.transform(f"schedulefree.{name}"),
        },
    )
    record_factory(public, factory)
    return factory


sgd_schedulefree = _factory(
    SGD_SCHEDULEFREE,
    SGD_SCHEDULEFREE_SIGNATURE,
    "sgd_schedulefree",
    "`schedulefree.SGDScheduleFree` as an optax transformation (the parameters are y; "
    "`eval_params` gives x). `foreach` is accepted and ignored.",
)
adamw_schedulefree = _factory(
    ADAMW_SCHEDULEFREE,
    ADAMW_SCHEDULEFREE_SIGNATURE,
    "adamw_schedulefree",
    "`schedulefree.AdamWScheduleFree` as an optax transformation (the parameters are y; "
    "`eval_params` gives x). `foreach` is accepted and ignored.",
)
radam_schedulefree = _factory(
    RADAM_SCHEDULEFREE,
    RADAM_SCHEDULEFREE_SIGNATURE,
    "radam_schedulefree",
    "`schedulefree.RAdamScheduleFree` as an optax transformation (the parameters are y; "
    "`eval_params` gives x). `foreach` is accepted and ignored.",
)

adamw_schedulefree_paper = _factory(
    ADAMW_SCHEDULEFREE_PAPER,
    ADAMW_SCHEDULEFREE_PAPER_SIGNATURE,
    "adamw_schedulefree_paper",
    "`schedulefree.AdamWScheduleFreePaper` as an optax transformation: AdamW's form with "
    "the paper's bias correction, $\\gamma_k \\sqrt{1-\\beta_2^{k+1}}$ as the step size "
    "(also in `lr_max` and the weights) and $g / (\\sqrt{v} + \\epsilon)$ as the "
    "direction. The parameters are y; `eval_params` gives x. `foreach` is accepted and "
    "ignored.",
)
sgd_schedulefree_reference = _factory(
    SGD_SCHEDULEFREE_REFERENCE,
    SGD_SCHEDULEFREE_REFERENCE_SIGNATURE,
    "sgd_schedulefree_reference",
    "`schedulefree.SGDScheduleFreeReference` as an optax transformation: the state keeps "
    "x and y as well as z, and each step forms x ($x \\leftarrow (1-c)x + cz$) and "
    "$y = \\beta x + (1-\\beta) z$, the parameters. `eval_params` gives x from the "
    "state. `foreach` is accepted and ignored.",
)
adamw_schedulefree_reference = _factory(
    ADAMW_SCHEDULEFREE_REFERENCE,
    ADAMW_SCHEDULEFREE_REFERENCE_SIGNATURE,
    "adamw_schedulefree_reference",
    "`schedulefree.AdamWScheduleFreeReference` as an optax transformation: the state keeps "
    "x and y as well as z and v; the weight decay is subtracted from z before the step, "
    "$z \\leftarrow z - \\gamma_k\\lambda\\,(y \\text{ or, with decay\\_at\\_z, } z)$. "
    "`eval_params` gives x from the state. `foreach` is accepted and ignored.",
)


def eval_params(params: Any, state: ScheduleFreeTransformState, momentum: Any) -> Any:
    """The weights to evaluate: $x = \\mathrm{lerp}(y, z, 1 - 1/\\beta)$ (the package's
    `optimizer.eval()`); for a Reference form's state, which keeps $x$, a copy of it.

    Args:
      params: the parameters a Schedule-Free transform updates (the sequence y).
      state: the transform's state (it holds z, and x for the Reference forms).
      momentum: β: `momentum` of `sgd_schedulefree`, `betas[0]` of the Adam forms.

    Returns:
      x, a pytree like `params`. Before the first update, `params` unchanged.

    Examples:
      >>> import jax, jax.numpy as jnp, optax, lucid.functional as LF
      >>> tx = LF.schedulefree.sgd_schedulefree(lr=0.1, momentum=0.9)
      >>> y = {"w": jnp.array([1.0, -2.0])}
      >>> state = tx.init(y)
      >>> updates, state = tx.update({"w": jnp.array([0.5, -1.0])}, state, y)
      >>> y = optax.apply_updates(y, updates)
      >>> x = LF.schedulefree.eval_params(y, state, momentum=0.9)
      >>> x["w"].round(4), LF.schedulefree.train_params(x, state, momentum=0.9)["w"].round(4)
      (Array([ 0.95, -1.9 ], dtype=float32), Array([ 0.95, -1.9 ], dtype=float32))
    """
    return _switch(params, state, momentum, to_eval=True)


def train_params(params: Any, state: ScheduleFreeTransformState, momentum: Any) -> Any:
    """Back to the training sequence: $y = \\mathrm{lerp}(x, z, 1 - \\beta)$ (the package's
    `optimizer.train()`), the inverse of
    [eval_params][lucid.functional.schedulefree.eval_params]; for a Reference form's
    state, which keeps $y$, a copy of it.

    Args:
      params: x, as `eval_params` returned it.
      state: the transform's state (it holds z).
      momentum: β, as given to `eval_params`.

    Returns:
      y, a pytree like `params`.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> tx = LF.schedulefree.adamw_schedulefree()
      >>> params = {"w": jnp.ones(2)}
      >>> state = tx.init(params)
      >>> LF.schedulefree.train_params(params, state, momentum=0.9)["w"]
      Array([1., 1.], dtype=float32)
    """
    return _switch(params, state, momentum, to_eval=False)


def _switch(params: Any, state: ScheduleFreeTransformState, momentum: Any, to_eval: bool):
    check_same_structure(params, state.z, "schedule-free")
    _validate.scalar(momentum, "momentum", schedules=False)
    if state.x is not None:  # a Reference form's state holds both sequences: copy one
        kept = state.x if to_eval else state.y
        return jax.tree_util.tree_map(lambda p, v: jnp.asarray(v, p.dtype), params, kept)
    beta = as_hyper(momentum)  # a Python number: the weight computed in double, as the package
    w = 1 - 1 / beta if to_eval else 1 - beta

    def one(p: Array, z: Array) -> Array:
        cdtype = compute_dtype(p.dtype)
        return lerp(p.astype(cdtype), z.astype(cdtype), jnp.asarray(w, cdtype)).astype(p.dtype)

    return jax.tree_util.tree_map(one, params, state.z)


def host_scalars(rule: Rule, group: Mapping[str, Any]) -> dict[str, Any]:
    """The group's values after one step of ``rule`` (the package's bookkeeping):
    `k`, `lr_max`, `weight_sum`, `scheduled_lr`.

    Args:
      rule: one of this module's rules.
      group: the parameter group before the step.

    Returns:
      The entries to write into the group.
    """
    kind = _kind_of(rule.name)
    values = _host_group(kind, group)
    scalars = _advance(kind, values, _Host)
    return {
        "scheduled_lr": scalars["lr"],
        "lr_max": scalars["lr_max"],
        "weight_sum": scalars["weight_sum"],
        "k": group["k"] + 1,
    }


def switch_weight(group: Mapping[str, Any], to_eval: bool) -> float:
    """The lerp weight of ``train()`` (``1 - β``) or ``eval()`` (``1 - 1/β``) for a group,
    computed in Python as the package does.

    Args:
      group: the parameter group.
      to_eval: the switch to eval (x), else to train (y).

    Returns:
      The weight.
    """
    beta = host_float(_momentum(group), "momentum")
    return 1 - 1 / beta if to_eval else 1 - beta
