"""The `schedulefree` package's optimizers (1.4.1) behind torch's stateful API.

`SGDScheduleFree`, `AdamWScheduleFree` and `RAdamScheduleFree` keep the training
sequence $y$ in the parameters while in train mode and the average $x$ in eval mode,
exactly as the package's classes: `train()` and `eval()` move the parameters between
the two ($y = \\mathrm{lerp}(x, z, 1-\\beta)$, $x = \\mathrm{lerp}(y, z, 1-1/\\beta)$), the
optimizer starts in eval mode (`train_mode=False` in every group), and `step()` outside
train mode raises. The `...Closure` forms keep $x$ in the parameters at all times and
evaluate the closure at $y$. `AdamWScheduleFreePaper` is `AdamWScheduleFree` with the
paper's bias correction. The Reference forms (`SGDScheduleFreeReference`,
`AdamWScheduleFreeReference`, `ScheduleFreeWrapperReference`) keep `x` and `y` in the
state beside `z`, and their `train()` / `eval()` copy `y` or `x` into the parameters. The
rules are `lucid.functional.schedulefree`'s.

Where the package keeps each quantity, lucid keeps it: per parameter `z` (and
`exp_avg_sq` for the Adam forms, `x` and `y` for the Reference forms) in the state;
per group `k`, `lr_max`, `weight_sum`, `scheduled_lr` and `train_mode` in
`param_groups`, so a state_dict moves between the package and lucid both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..functional import schedulefree as _sf
from ..functional._apply import compute_dtype
from ..functional._math import lerp
from ._declare import torch_optimizer
from ._engine import Group
from .optimizer import Optimizer

__all__ = [
    "AdamWScheduleFree",
    "AdamWScheduleFreeClosure",
    "AdamWScheduleFreePaper",
    "AdamWScheduleFreeReference",
    "RAdamScheduleFree",
    "RAdamScheduleFreeClosure",
    "SGDScheduleFree",
    "SGDScheduleFreeClosure",
    "SGDScheduleFreeReference",
    "ScheduleFreeWrapper",
    "ScheduleFreeWrapperReference",
]

_NOT_TRAINING = (
    "Optimizer was not in train mode when step is called. Please insert .train() and "
    ".eval() calls on the optimizer. See documentation for details."
)


@jax.jit
def _lerp_all(params: list, zs: list, weights: list) -> list:
    """Every parameter's ``lerp(p, z, w)`` in one executable (weights are runtime values:
    switching modes reuses it)."""
    return [
        lerp(p.astype(w.dtype), z.astype(w.dtype), w).astype(p.dtype)
        for p, z, w in zip(params, zs, weights)
    ]


def _assign(params: list, values: list) -> None:
    """Write each value into its parameter, placed as the parameter is (a state sharded
    over a mesh axis, ZeRO-1, must not move a replicated parameter)."""
    for p, value in zip(params, values):
        current = p.data
        if not value.sharding.is_equivalent_to(current.sharding, value.ndim):
            value = jax.device_put(value, current.sharding)
        p.data = value


# the options the package has always kept in every group
_SGD_SAVED = ("lr", "momentum", "weight_decay")
_ADAM_SAVED = ("lr", "betas", "eps", "weight_decay")


class _ScheduleFree(Optimizer):
    """What the Schedule-Free classes share: the host bookkeeping of each step, and the
    moves of the parameters between the sequences."""

    def _move(self, groups: list[dict[str, Any]], to_eval: bool) -> None:
        """Move the parameters of ``groups`` that have state along ``lerp(p, z, w)``."""
        states = self.backend.states()
        params, zs, weights = [], [], []
        for group in groups:
            weight = _sf.switch_weight(group, to_eval)
            for p in group["params"]:
                state = states.get(p)
                if state is None:
                    continue
                params.append(p)
                zs.append(state.z)
                weights.append(jnp.asarray(weight, compute_dtype(p.dtype)))
        if params:
            _assign(params, _lerp_all([p.data for p in params], zs, weights))

    def end_step(self) -> None:
        """The package's bookkeeping after every step (`step` and a fused step alike):
        each group's `k`, `lr_max`, `weight_sum` and `scheduled_lr` advance, also in a
        group none of whose parameters had a gradient."""
        for group in self.param_groups:
            group.update(_sf.host_scalars(self.rule, group))


class _TrainEval(_ScheduleFree):
    """The package's default form: `y` in the parameters in train mode, `x` in eval mode."""

    def train(self) -> None:
        """Switch to train mode: every group in eval mode moves its parameters to y
        (`p ← lerp(p, z, 1-β)`) and sets `train_mode`; a group in train mode is left
        as it is. Parameters without state (never stepped) do not move.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.schedulefree.SGDScheduleFree([lucid.Parameter(jnp.ones(2))])
          >>> opt.param_groups[0]["train_mode"]
          False
          >>> opt.train()
          >>> opt.param_groups[0]["train_mode"]
          True
        """
        groups = [g for g in self.param_groups if not g["train_mode"]]
        self._move(groups, to_eval=False)
        for group in groups:
            group["train_mode"] = True

    def eval(self) -> None:
        """Switch to eval mode: every group in train mode moves its parameters to x
        (`p ← lerp(p, z, 1-1/β)`), the weights to evaluate and save, and clears
        `train_mode`.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
          >>> opt = lucid.optim.schedulefree.SGDScheduleFree([w], lr=0.1)
          >>> opt.train()
          >>> for _ in range(2):
          ...     w.grad = jnp.array([0.5, -1.0])
          ...     opt.step()
          >>> [round(v, 4) for v in w.data.tolist()]  # y
          [0.9225, -1.845]
          >>> opt.eval()
          >>> [round(v, 4) for v in w.data.tolist()]  # x
          [0.925, -1.85]
        """
        groups = [g for g in self.param_groups if g["train_mode"]]
        self._move(groups, to_eval=True)
        for group in groups:
            group["train_mode"] = False

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Schedule-Free step of every parameter that has a gradient; every group's
        `k`, `lr_max`, `weight_sum` and `scheduled_lr` advance (also a group none of
        whose parameters has a gradient, as the package's).

        Args:
          closure: an optional function that recomputes the loss, called once first.

        Returns:
          What `closure()` returned, or `None`.

        Raises:
          RuntimeError: the first group is not in train mode (the package raises an
            `Exception` with the same message).
          ValueError: a gradient that does not fit its parameter (nothing has moved).
        """
        self._check_training()
        return Optimizer.step(self, closure)

    def begin_step(self) -> list[Group]:
        """`Optimizer.begin_step`, after the package's train-mode check (so a fused
        step in eval mode raises as `step()` does, before anything moves).

        Returns:
          The groups for the engine.

        Raises:
          RuntimeError: the first group is not in train mode.
        """
        self._check_training()
        return super().begin_step()

    def _check_training(self) -> None:
        if not self.param_groups[0]["train_mode"]:
            raise RuntimeError(_NOT_TRAINING)


class _Closure(_ScheduleFree):
    """The package's closure form: `x` in the parameters; `step(closure)` moves them to
    y, evaluates the closure there and comes back."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One Schedule-Free step: the parameters (x) move to y, `closure()` recomputes
        the gradients there, then every parameter with a gradient takes the step back
        to its new x, and every group's `k`, `lr_max`, `weight_sum` advance.

        Args:
          closure: a function that zeroes the gradients, computes the loss with
            [backward][lucid.backward] and returns it (required).

        Returns:
          What `closure()` returned.

        Raises:
          TypeError: no closure (the package requires one).
          ValueError: a gradient that does not fit its parameter (the parameters are
            put back, nothing has moved).
        """
        if closure is None:
            raise TypeError(f"{type(self).__name__}.step() requires a closure")
        saved = [(p, p.data) for group in self.param_groups for p in group["params"]]
        self._move(self.param_groups, to_eval=False)  # x -> y (z is the package's clone: p)
        self._stepping = True
        try:
            return Optimizer.step(self, closure)
        except BaseException:
            for p, value in saved:
                p.data = value
            raise
        finally:
            self._stepping = False

    def begin_step(self) -> list[Group]:
        """`Optimizer.begin_step`, inside `step(closure)` only: a fused step would take
        the gradient at x, where the closure form needs it at y, so it is refused
        before anything moves.

        Returns:
          The groups for the engine.

        Raises:
          RuntimeError: called outside this class's `step` (a fused step).
        """
        if not getattr(self, "_stepping", False):
            raise RuntimeError(
                f"{type(self).__name__} takes each gradient at y while its parameters hold "
                "x, so it steps only through step(closure); fused_step is not supported "
                "(use the train/eval form, e.g. AdamWScheduleFree, with fused_step)"
            )
        return super().begin_step()


def _examples(cls: str, kwargs: str, y: str, x: str) -> str:
    return f"""
    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.schedulefree.{cls}([w], {kwargs})
      >>> opt.train()
      >>> for _ in range(2):
      ...     w.grad = jnp.array([0.5, -1.0])
      ...     opt.step()
      >>> [round(v, 4) for v in w.data.tolist()]  # train mode: y
      {y}
      >>> opt.eval()
      >>> [round(v, 4) for v in w.data.tolist()]  # eval mode: x
      {x}
    """


def _closure_examples(cls: str, kwargs: str, x: str) -> str:
    return f"""
    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.schedulefree.{cls}([w], {kwargs})
      >>> def closure():
      ...     opt.zero_grad()
      ...     return lucid.backward(lambda w: (w**2).sum(), w)
      >>> for _ in range(2):
      ...     loss = opt.step(closure)
      >>> [round(v, 4) for v in w.data.tolist()]  # always x
      {x}
    """


@torch_optimizer(
    _sf.SGD_SCHEDULEFREE_SIGNATURE, step_example=False, reference="schedulefree", saved=_SGD_SAVED
)
class SGDScheduleFree(_TrainEval):
    __doc__ = """`schedulefree.SGDScheduleFree`: Schedule-Free SGD with momentum, warm-up and
    polynomial weighting; `train()` / `eval()` switch the parameters between y and x.
    """ + _examples(
        "SGDScheduleFree",
        "lr=0.1",
        "[0.9225, -1.845]",
        "[0.925, -1.85]",
    )
    rule = _sf.SGD_SCHEDULEFREE


@torch_optimizer(
    _sf.ADAMW_SCHEDULEFREE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_ADAM_SAVED,
)
class AdamWScheduleFree(_TrainEval):
    __doc__ = """`schedulefree.AdamWScheduleFree`: Schedule-Free AdamW (the gradient divided by
    √v, bias-corrected; weight decay at y); `train()` / `eval()` switch the parameters
    between y and x.
    """ + _examples(
        "AdamWScheduleFree",
        "lr=0.1",
        "[0.845, -1.845]",
        "[0.85, -1.85]",
    )
    rule = _sf.ADAMW_SCHEDULEFREE


@torch_optimizer(
    _sf.RADAM_SCHEDULEFREE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_ADAM_SAVED,
)
class RAdamScheduleFree(_TrainEval):
    __doc__ = """`schedulefree.RAdamScheduleFree`: Schedule-Free RAdam (no warm-up parameter:
    RAdam's rectification is the warm-up); `train()` / `eval()` switch the parameters
    between y and x.
    """ + _examples(
        "RAdamScheduleFree",
        "lr=0.1, silent_sgd_phase=False",
        "[0.9225, -1.845]",
        "[0.925, -1.85]",
    )
    rule = _sf.RADAM_SCHEDULEFREE


@torch_optimizer(
    _sf.SGD_SCHEDULEFREE_CLOSURE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_SGD_SAVED,
)
class SGDScheduleFreeClosure(_Closure):
    __doc__ = """`schedulefree.SGDScheduleFreeClosure`: Schedule-Free SGD whose parameters
    always hold x; `step(closure)` evaluates the gradient at y.
    """ + _closure_examples("SGDScheduleFreeClosure", "lr=0.1", "[0.72, -1.44]")
    rule = _sf.SGD_SCHEDULEFREE_CLOSURE


@torch_optimizer(
    _sf.ADAMW_SCHEDULEFREE_CLOSURE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_ADAM_SAVED,
)
class AdamWScheduleFreeClosure(_Closure):
    __doc__ = """`schedulefree.AdamWScheduleFreeClosure`: Schedule-Free AdamW whose parameters
    always hold x; `step(closure)` evaluates the gradient at y.
    """ + _closure_examples("AdamWScheduleFreeClosure", "lr=0.1", "[0.8527, -1.8513]")
    rule = _sf.ADAMW_SCHEDULEFREE_CLOSURE


@torch_optimizer(
    _sf.RADAM_SCHEDULEFREE_CLOSURE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_ADAM_SAVED,
)
class RAdamScheduleFreeClosure(_Closure):
    __doc__ = """`schedulefree.RAdamScheduleFreeClosure`: Schedule-Free RAdam whose parameters
    always hold x; `step(closure)` evaluates the gradient at y.
    """ + _closure_examples(
        "RAdamScheduleFreeClosure",
        "lr=0.1, silent_sgd_phase=False",
        "[0.72, -1.44]",
    )
    rule = _sf.RADAM_SCHEDULEFREE_CLOSURE


@torch_optimizer(
    _sf.ADAMW_SCHEDULEFREE_PAPER_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_ADAM_SAVED,
)
class AdamWScheduleFreePaper(_TrainEval):
    __doc__ = """`schedulefree.AdamWScheduleFreePaper`: Schedule-Free AdamW as in the paper's
    experiments: the bias correction $\\sqrt{1-\\beta_2^{k+1}}$ is in the step size (so
    in `scheduled_lr`, `lr_max` and the averaging weights), and the direction is
    $g / (\\sqrt{v} + \\epsilon)$. Otherwise `AdamWScheduleFree`: $y$ in the parameters
    in train mode, $x$ in eval mode.
    """ + _examples(
        "AdamWScheduleFreePaper",
        "lr=0.1",
        "[0.83, -1.83]",
        "[0.8333, -1.8333]",
    )
    rule = _sf.ADAMW_SCHEDULEFREE_PAPER


class _Reference(_TrainEval):
    """The package's Reference forms: `z`, `x` and `y` all in the state; `eval()` copies
    each parameter's `x` into it and `train()` its `y` (no lerp)."""

    def _move(self, groups: list[dict[str, Any]], to_eval: bool) -> None:
        states = self.backend.states()
        params, values = [], []
        for group in groups:
            for p in group["params"]:
                state = states.get(p)
                if state is not None:
                    params.append(p)
                    values.append(jnp.array(state.x if to_eval else state.y, copy=True))
        if params:
            _assign(params, values)


def _reference_doc(name: str, prose: str) -> str:
    return f"""`schedulefree.{name}`: {prose}

    The step (per parameter, with the step size $\\gamma_k$ and the weight $c_{{k+1}}$
    computed as for the default form):

    $$
    \\begin{{aligned}}
    z &\\leftarrow z - \\gamma_k\\, d, \\qquad
    x \\leftarrow (1-c_{{k+1}})\\, x + c_{{k+1}}\\, z, \\qquad
    y \\leftarrow \\beta x + (1-\\beta)\\, z, \\qquad p \\leftarrow y
    \\end{{aligned}}
    $$

    `x` and `y` are state entries (with `z`), as in the package, so `state_dict()` moves
    to and from it; `eval()` copies `x` into the parameters and `train()` copies `y`
    (the package prints a line on each switch; lucid does not).
    """


@torch_optimizer(
    _sf.SGD_SCHEDULEFREE_REFERENCE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_SGD_SAVED,
)
class SGDScheduleFreeReference(_Reference):
    __doc__ = _reference_doc(
        "SGDScheduleFreeReference",
        "the package's simpler Schedule-Free SGD, which keeps all three sequences, with "
        "$d = g + \\lambda y$. Unlike the other classes it starts in train mode "
        "(`train_mode=True`), as the package's.",
    ) + _examples("SGDScheduleFreeReference", "lr=0.1", "[0.9225, -1.845]", "[0.925, -1.85]")
    rule = _sf.SGD_SCHEDULEFREE_REFERENCE


@torch_optimizer(
    _sf.ADAMW_SCHEDULEFREE_REFERENCE_SIGNATURE,
    step_example=False,
    reference="schedulefree",
    saved=_ADAM_SAVED,
)
class AdamWScheduleFreeReference(_Reference):
    __doc__ = _reference_doc(
        "AdamWScheduleFreeReference",
        "the package's simpler Schedule-Free AdamW, which keeps all three sequences: "
        "the weight decay first, $z \\leftarrow z - \\gamma_k\\lambda\\, y$ (or "
        "$\\gamma_k\\lambda\\, z$ with `decay_at_z`), then $d = g / "
        "(\\sqrt{v/(1-\\beta_2^{k+1})} + \\epsilon)$. Starts in eval mode.",
    ) + _examples("AdamWScheduleFreeReference", "lr=0.1", "[0.845, -1.845]", "[0.85, -1.85]")
    rule = _sf.ADAMW_SCHEDULEFREE_REFERENCE


@jax.jit
def _wrapper_before(params: list, zs: list, decay_z: list, decay_p: list, unextrapolate: list):
    """y -> x for every stepped parameter, after the decay at y; returns (x, new z)."""
    xs, new_zs = [], []
    for p, z, dz, dp, w in zip(params, zs, decay_z, decay_p, unextrapolate):
        z = z - dz * p
        p = p - dp * p
        xs.append(lerp(p, z, w))
        new_zs.append(z)
    return xs, new_zs


@jax.jit
def _wrapper_after(xs: list, zs: list, ckp1: list, extrapolate: list) -> list:
    """The new y: x averaged towards the new z, then moved to y."""
    return [lerp(lerp(x, z, c), z, e) for x, z, c, e in zip(xs, zs, ckp1, extrapolate)]


class _Wrapper:
    """What both wrappers share: the base optimizer's API, and the state the wrapper
    keeps per parameter (``_kept``: `z`, and `x`, `y` for the Reference wrapper),
    shown in `state` and `state_dict()` as the package shows it, in the base's state."""

    base: Any
    _kept: dict[str, dict[Any, jax.Array]]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The base optimizer's `param_groups` (with the wrapper's `k`, `lr_max`,
        `weight_sum` once it has stepped)."""
        return self.base.param_groups

    @property
    def state(self) -> dict[Any, dict[str, Any]]:
        """The base optimizer's per-parameter state, each with the wrapper's `z` (and,
        for the Reference wrapper, `x` and `y`): the package keeps them in the base's
        state."""
        merged = {p: dict(s) for p, s in self.base.state.items()}
        for name, store in self._kept.items():
            for p, value in store.items():
                merged.setdefault(p, {})[name] = value
        return merged

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """The base optimizer's `add_param_group`.

        Args:
          param_group: `{"params": [...], **options}`.
        """
        self.base.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The base optimizer's `zero_grad`.

        Args:
          set_to_none: set each `.grad` to `None` (else fill it with zeros).
        """
        self.base.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The base optimizer's `state_dict()`, each stepped parameter's entry with its `z`
        (and `x`, `y` for the Reference wrapper).

        Returns:
          torch's format, as the package's wrapper gives it around the same torch optimizer.
        """
        state_dict = self.base.state_dict()
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        for name, store in self._kept.items():
            for p, value in store.items():
                state_dict["state"].setdefault(index[p], {})[name] = jnp.array(value, copy=True)
        state_dict["state"] = dict(sorted(state_dict["state"].items()))
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a `state_dict` (lucid's or the package's wrapper's): each `z` (and `x`,
        `y` for the Reference wrapper) into the wrapper, the rest into the base optimizer
        (which validates it first).

        Args:
          state_dict: what `state_dict()` returned.

        Raises:
          ValueError: the state_dict does not fit (nothing changed).
        """
        params = [p for g in self.param_groups for p in g["params"]]
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        if len(ids) != len(params):
            raise ValueError("loaded state dict has a different number of parameters")
        by_id = dict(zip(ids, params))
        kept: dict[str, dict[Any, jax.Array]] = {name: {} for name in self._kept}
        base_state = {}
        for key, entry in dict(state_dict["state"]).items():
            if key not in by_id:
                raise ValueError(
                    f"the state_dict holds state for parameter {key!r}, which no group lists"
                )
            entry = dict(entry)
            for name in kept:
                if name in entry:
                    p = by_id[key]
                    value = jnp.asarray(_to_array(entry.pop(name)), p.dtype)
                    if value.shape != p.shape:
                        raise ValueError(
                            f"state {name!r} of parameter {key!r} has shape {value.shape}"
                        )
                    kept[name][p] = value
            if entry:
                base_state[key] = entry
        self.base.load_state_dict({**state_dict, "state": base_state})
        for name, store in self._kept.items():  # in place: the stores are aliased
            store.clear()
            store.update(kept[name])

    def _advance(self, group: dict[str, Any]) -> float:
        """The package's per-group bookkeeping after the base optimizer's step: `lr_max`
        (of `lr` times a D-Adaptation factor `d`, 1 when absent), the weight
        `(k+1)^r lr_max^p` added to `weight_sum`, `k` advanced; returns the averaging
        coefficient `c = weight / weight_sum` (`ZeroDivisionError` for a zero sum, as
        the package's)."""
        k = group.get("k", 0)
        lr = _sf.host_float(group["lr"], "lr") * group.get("d", 1.0)
        lr_max, weight, weight_sum = _sf.averaging_weight(
            lr,
            k + 1,
            group.get("lr_max", 0),
            group.get("weight_sum", 0.0),
            self.r,
            self.weight_lr_power,
        )
        group["lr_max"], group["weight_sum"] = lr_max, weight_sum
        ckp1 = weight / weight_sum
        group["k"] = k + 1
        return ckp1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r})"


class ScheduleFreeWrapper(_Wrapper):
    """`schedulefree.ScheduleFreeWrapper`: any lucid optimizer made Schedule-Free.

    The base optimizer steps the sequence $z$; the wrapper keeps the average $x$ and the
    parameters at $y$ (train mode) or $x$ (eval mode), as the package's wrapper does. At
    each step, for every parameter with a gradient: the decay at $y$
    ($z \\leftarrow z - \\gamma\\lambda_y y$, $y \\leftarrow y - \\gamma\\lambda_y(1-\\beta) y$),
    $x = \\mathrm{lerp}(y, z, 1-1/\\beta)$, the parameter set to $z$ and the base optimizer's
    `step()` run on it (with the gradient taken at $y$); then per group
    $\\gamma_{\\max} = \\max(\\gamma_{\\max}, \\gamma\\, d)$ (`d` a group's D-Adaptation factor,
    1 when absent), $w = (k+1)^r \\gamma_{\\max}^{p}$, $c = w / \\sum w$, and the parameter
    becomes $\\mathrm{lerp}(\\mathrm{lerp}(x, z, c), z, 1-\\beta)$. The groups of the base
    optimizer gain the package's `k`, `lr_max` and `weight_sum` entries, and its
    `state_dict()` each parameter's `z`, so a checkpoint moves to and from the package's
    wrapper around the same torch optimizer.

    Args:
      base: the optimizer that steps $z$ (a lucid optimizer, compiled or not).
      weight_decay_at_y: $\\lambda_y$, weight decay computed at $y$ (set the base's own
        weight decay to decay at $z$ instead).
      momentum: $\\beta$, the interpolation between $x$ and $z$.
      weight_lr_power: the power of `lr_max` in the averaging weights.
      r: the power of the polynomial weighting `(k+1)^r`.

    Attributes:
      base: the wrapped optimizer.
      weight_decay_at_y: $\\lambda_y$.
      momentum: $\\beta$.
      weight_lr_power: the power of `lr_max` in the weights.
      r: the polynomial weighting's power.
      train_mode: whether the parameters hold $y$ (`False` at construction, as the
        package's).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> base = lucid.optim.SGD([w], lr=0.1)
      >>> opt = lucid.optim.schedulefree.ScheduleFreeWrapper(base, momentum=0.9)
      >>> opt.train()
      >>> for _ in range(2):
      ...     w.grad = jnp.array([0.5, -1.0])
      ...     opt.step()
      >>> opt.eval()
      >>> [round(v, 4) for v in w.data.tolist()], opt.param_groups[0]["k"]
      ([0.925, -1.85], 2)
    """

    # the attributes' types (the API reference's Attributes table reads them)
    base: Any
    weight_decay_at_y: float
    momentum: float
    weight_lr_power: float
    r: float
    train_mode: bool

    def __init__(
        self,
        base: Any,
        weight_decay_at_y: float = 0.0,
        momentum: float = 0.9,
        weight_lr_power: float = 2,
        r: float = 0,
    ) -> None:
        self.base = base
        self.weight_decay_at_y = weight_decay_at_y
        self.weight_lr_power = weight_lr_power
        self.r = r
        self.momentum = momentum
        self.train_mode = False
        self._kept = {"z": {}}
        self._z = self._kept["z"]

    # -- modes and the step
    def _move(self, weight: float) -> None:
        params = [p for g in self.param_groups for p in g["params"] if p in self._z]
        if params:
            weights = [jnp.asarray(weight, compute_dtype(p.dtype)) for p in params]
            values = _lerp_all([p.data for p in params], [self._z[p] for p in params], weights)
            _assign(params, values)

    def eval(self) -> None:
        """Switch to eval mode: the parameters move to x (`lerp(p, z, 1-1/β)`).

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> base = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> opt = lucid.optim.schedulefree.ScheduleFreeWrapper(base)
          >>> opt.train(); opt.eval(); opt.train_mode
          False
        """
        if self.train_mode:
            self._move(1 - 1 / self.momentum)
        self.train_mode = False

    def train(self) -> None:
        """Switch to train mode: the parameters move to y (`lerp(p, z, 1-β)`).

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> base = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> opt = lucid.optim.schedulefree.ScheduleFreeWrapper(base)
          >>> opt.train(); opt.train_mode
          True
        """
        if not self.train_mode:
            self._move(1 - self.momentum)
        self.train_mode = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Schedule-Free step around one step of the base optimizer.

        Args:
          closure: an optional function that recomputes the loss, called once first.

        Returns:
          What `closure()` returned, or `None`.

        Raises:
          RuntimeError: not in train mode (the package raises an `Exception` with the
            same message).
          ZeroDivisionError: a group's weights sum to zero (`lr = 0` from the start), as
            the package's.
        """
        if not self.train_mode:
            raise RuntimeError(_NOT_TRAINING)
        loss = closure() if closure is not None else None
        m = self.momentum
        stepped = []
        for group in self.param_groups:
            lr = _sf.host_float(group["lr"], "lr")
            active = [p for p in group["params"] if p.grad is not None]
            for p in active:
                if p not in self._z:
                    self._z[p] = jnp.array(p.data, copy=True)
            if not active:
                continue

            def scalars(value: float, params: list = active) -> list:
                return [jnp.asarray(value, compute_dtype(p.dtype)) for p in params]

            wd = self.weight_decay_at_y
            xs, zs = _wrapper_before(
                [p.data for p in active],
                [self._z[p] for p in active],
                scalars(lr * wd if wd != 0.0 else 0.0),
                scalars(lr * wd * (1 - m) if wd != 0.0 else 0.0),
                scalars(1 - 1 / m),
            )
            _assign(active, zs)  # the base optimizer steps z
            for p, x in zip(active, xs):
                self._z[p] = x  # x waits in z's place (the package's swap)
            stepped.append(active)
        self.base.step()
        for group in self.param_groups:
            ckp1 = self._advance(group)
            active = [p for p in group["params"] if p.grad is not None]
            if active:
                cdtypes = [compute_dtype(p.dtype) for p in active]
                new_zs = [p.data for p in active]
                ys = _wrapper_after(
                    [self._z[p] for p in active],
                    new_zs,
                    [jnp.asarray(ckp1, d) for d in cdtypes],
                    [jnp.asarray(1 - m, d) for d in cdtypes],
                )
                for p, z in zip(active, new_zs):
                    self._z[p] = z
                _assign(active, ys)
        return loss


def _to_array(value: Any) -> Any:
    from .._arrays import is_torch_tensor, torch_to_numpy

    return torch_to_numpy(value) if is_torch_tensor(value) else value


@jax.jit
def _decay_at_y(zs: list, ys: list, decay: list) -> list:
    """``z ← z - γλ_y · y`` for every parameter (the Reference wrapper's decay)."""
    return [z - a * y for z, y, a in zip(zs, ys, decay)]


@jax.jit
def _reference_wrapper_after(xs: list, zs: list, ckp1: list, extrapolate: list) -> tuple:
    """The Reference wrapper's new ``x = lerp(x, z, c)`` and ``y = lerp(x, z, 1-β)``."""
    new_xs = [lerp(x, z, c) for x, z, c in zip(xs, zs, ckp1)]
    return new_xs, [lerp(x, z, e) for x, z, e in zip(new_xs, zs, extrapolate)]


class ScheduleFreeWrapperReference(_Wrapper):
    """`schedulefree.ScheduleFreeWrapperReference`: the package's simpler wrapper, which
    keeps $z$, $x$ and $y$ for every parameter.

    At each step, for every parameter of every group (with a gradient or not, as the
    package's): the decay at $y$, $z \\leftarrow z - \\gamma\\lambda_y\\, y$ (the group's
    `weight_decay_at_y`), the parameter set to $z$; then one `step()` of the base
    optimizer; then per group $\\gamma_{\\max} = \\max(\\gamma_{\\max}, \\gamma\\, d)$ (`d` a
    group's D-Adaptation factor, 1 when absent), $w = (k+1)^r \\gamma_{\\max}^{p}$,
    $c = w / \\sum w$, and per parameter $z \\leftarrow p$,
    $x \\leftarrow \\mathrm{lerp}(x, z, c)$, $y = \\mathrm{lerp}(x, z, 1-\\beta)$,
    $p \\leftarrow y$.
    `eval()` copies $x$ into the parameters and `train()` copies $y$. The state entries
    `z`, `x`, `y` and the groups' `weight_decay_at_y`, `k`, `lr_max`, `weight_sum` are
    the package's, so a checkpoint moves to and from the package's wrapper around the same
    torch optimizer.

    Args:
      base: the optimizer that steps $z$ (a lucid optimizer, compiled or not).
      momentum: $\\beta$, the interpolation between $x$ and $z$.
      weight_decay_at_y: $\\lambda_y$, written into every group present now as
        `weight_decay_at_y` (a group added later must set it: the package's step reads it).
      r: the power of the polynomial weighting `(k+1)^r`.
      weight_lr_power: the power of `lr_max` in the averaging weights.

    Attributes:
      base: the wrapped optimizer.
      momentum: $\\beta$.
      weight_lr_power: the power of `lr_max` in the weights.
      r: the polynomial weighting's power.
      train_mode: whether the parameters hold $y$ (`False` at construction, as the
        package's).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> base = lucid.optim.SGD([w], lr=0.1)
      >>> opt = lucid.optim.schedulefree.ScheduleFreeWrapperReference(base, momentum=0.9)
      >>> opt.train()
      >>> for _ in range(2):
      ...     w.grad = jnp.array([0.5, -1.0])
      ...     opt.step()
      >>> opt.eval()
      >>> [round(v, 4) for v in w.data.tolist()], sorted(opt.state[w])
      ([0.925, -1.85], ['x', 'y', 'z'])
    """

    base: Any
    momentum: float
    weight_lr_power: float
    r: float
    train_mode: bool

    def __init__(
        self,
        base: Any,
        momentum: float = 0.9,
        weight_decay_at_y: float = 0.0,
        r: float = 0,
        weight_lr_power: float = 2,
    ) -> None:
        self.base = base
        self.momentum = momentum
        self.weight_lr_power = weight_lr_power
        self.r = r
        self.train_mode = False
        self._kept = {"z": {}, "x": {}, "y": {}}
        for group in self.param_groups:
            group["weight_decay_at_y"] = weight_decay_at_y

    def _copy_in(self, name: str) -> None:
        store = self._kept[name]
        params = [p for g in self.param_groups for p in g["params"] if p in store]
        _assign(params, [jnp.array(store[p], copy=True) for p in params])

    def eval(self) -> None:
        """Switch to eval mode: each stepped parameter takes its `x`.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> base = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> opt = lucid.optim.schedulefree.ScheduleFreeWrapperReference(base)
          >>> opt.train(); opt.eval(); opt.train_mode
          False
        """
        if self.train_mode:
            self._copy_in("x")
        self.train_mode = False

    def train(self) -> None:
        """Switch to train mode: each stepped parameter takes its `y`.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> base = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> opt = lucid.optim.schedulefree.ScheduleFreeWrapperReference(base)
          >>> opt.train(); opt.train_mode
          True
        """
        if not self.train_mode:
            self._copy_in("y")
        self.train_mode = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Schedule-Free step around one step of the base optimizer.

        Args:
          closure: an optional function that recomputes the loss, called once first.

        Returns:
          What `closure()` returned, or `None`.

        Raises:
          RuntimeError: not in train mode (the package raises an `Exception` with the
            same message).
          KeyError: a group without `weight_decay_at_y` (added after the wrapper was
            made), before anything moves; the package raises the same `KeyError`.
          ZeroDivisionError: a group's weights sum to zero (`lr = 0` from the start), as
            the package's.
        """
        if not self.train_mode:
            raise RuntimeError(_NOT_TRAINING)
        for i, group in enumerate(self.param_groups):
            if "weight_decay_at_y" not in group:
                raise KeyError(
                    f"'weight_decay_at_y': parameter group {i} was added after the wrapper "
                    "was made and has no 'weight_decay_at_y' (the package raises the same "
                    "KeyError); set it in the group"
                )
        loss = closure() if closure is not None else None
        zs, xs, ys = self._kept["z"], self._kept["x"], self._kept["y"]
        for group in self.param_groups:
            params = list(group["params"])
            for p in params:
                if p not in zs:
                    for store in (zs, xs, ys):
                        store[p] = jnp.array(p.data, copy=True)
            if not params:
                continue
            wd = group["weight_decay_at_y"]
            if wd != 0.0:
                decay = _sf.host_float(group["lr"], "lr") * wd
                new = _decay_at_y(
                    [zs[p] for p in params],
                    [ys[p] for p in params],
                    [jnp.asarray(decay, compute_dtype(p.dtype)) for p in params],
                )
                zs.update(zip(params, new))
            _assign(params, [jnp.array(zs[p], copy=True) for p in params])  # p ← z
        self.base.step()
        for group in self.param_groups:
            ckp1 = self._advance(group)
            params = list(group["params"])
            if params:
                cdtypes = [compute_dtype(p.dtype) for p in params]
                new_zs = [p.data for p in params]
                new_xs, new_ys = _reference_wrapper_after(
                    [xs[p] for p in params],
                    new_zs,
                    [jnp.asarray(ckp1, d) for d in cdtypes],
                    [jnp.asarray(1 - self.momentum, d) for d in cdtypes],
                )
                zs.update(zip(params, new_zs))
                xs.update(zip(params, new_xs))
                ys.update(zip(params, new_ys))
                _assign(params, [jnp.array(y, copy=True) for y in new_ys])
        return loss
