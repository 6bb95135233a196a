"""``LBFGS``: torch.optim.LBFGS's full algorithm, closure and line search included.

The one optimizer whose step is not a per-parameter rule: L-BFGS works on the
flat vector of all parameters, re-evaluates the closure, and keeps a history of
curvature pairs. This module follows torch's algorithm step for step (two-loop
recursion, first step ``min(1, 1/|g|_1) * lr``, convergence tests on
``max|g|``, optional strong-Wolfe line search with cubic interpolation), in eager
JAX. Its compiled form (``lucid.optim.compile_optimizer``) is the
closure-less Barzilai-Borwein step of ``lucid.functional.lbfgs``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import to_array
from .._parameter import Parameter
from ..functional._apply import host_float
from ..functional._math import max_abs
from ..functional._sparse import dense
from ..functional.lbfgs import LBFGS as LBFGS_RULE
from ..functional.lbfgs import LBFGS_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "LBFGS",
]


def _copy_arrays(values: list) -> list:
    return [jnp.array(v, copy=True) if isinstance(v, jax.Array) else v for v in values]


Array = jax.Array


@functools.partial(jax.jit, static_argnums=(1,))
def _split(flat: Array, shapes: tuple[tuple[int, ...], ...]) -> list[Array]:
    """A flat vector cut into arrays of ``shapes``, in one compiled call."""
    pieces, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        pieces.append(flat[offset : offset + size].reshape(shape))
        offset += size
    return pieces


def _loss_value(loss: Any) -> float:
    """The closure's loss as a host float, as torch's ``float(closure())``: a number or an
    array (jax, NumPy, torch) of exactly one element, whatever its shape.

    Raises:
      ValueError: an array of another size (torch's error), naming its shape.
    """
    shape = tuple(getattr(loss, "shape", ()))
    if math.prod(shape) != 1:
        raise ValueError(
            "only one element tensors can be converted to Python scalars: the closure must "
            f"return a loss of exactly one element, but returned shape {shape}"
        )
    return float(loss.item()) if hasattr(loss, "item") else float(loss)


_HISTORY = ("old_dirs", "old_stps", "ro", "al")
_VECTORS = ("d", "prev_flat_grad")
_SCALARS = ("t", "H_diag", "prev_loss")
_COUNTERS = ("func_evals", "n_iter")


def _cubic_interpolate(
    x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any, bounds: tuple | None = None
) -> Any:
    """Minimiser of the cubic through two points with their slopes, clamped to ``bounds``."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if d2_square >= 0:
        d2 = jnp.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(
    obj_func: Callable,
    x: list[Array],
    t: Any,
    d: Array,
    f: float,
    g: Array,
    gtd: Array,
    c1: float = 1e-4,
    c2: float = 0.9,
    tolerance_change: float = 1e-9,
    max_ls: int = 25,
) -> tuple[float, Array, Any, int]:
    """Strong-Wolfe line search along ``d`` (bracketing, then zoom), torch's version."""
    d_norm = max_abs(d)
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = jnp.dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    bracket: list[Any] = []
    bracket_f: list[Any] = []
    bracket_g: list[Array] = []
    bracket_gtd: list[Any] = []
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(
            t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step)
        )
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = jnp.dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # zoom: shrink the bracket until a point satisfies the strong-Wolfe conditions
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(
            bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1]
        )
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - eps
                else:
                    t = min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = jnp.dot(g_new, d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos] = bracket_g[low_pos]
                bracket_gtd[high_pos] = bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new, gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


@torch_optimizer(
    LBFGS_SIGNATURE,
    step_example=False,
    saved=(
        "lr",
        "max_iter",
        "max_eval",
        "tolerance_grad",
        "tolerance_change",
        "history_size",
        "line_search_fn",
    ),
)
class LBFGS(Optimizer):
    """torch.optim.LBFGS: ``step(closure)`` runs up to ``max_iter`` L-BFGS iterations.

    One parameter group only. The closure must clear the gradients, compute them
    (``lucid.backward``) and return the loss; ``step`` returns the *first*
    closure value, as torch does. ``line_search_fn`` is ``None`` or
    ``'strong_wolfe'`` (anything else is refused at construction).

    torch 2.15's ``maximize=True`` (keyword-only; torch 2.13 has none) ascends: the
    gradient and every loss the algorithm reads are negated, so ``state["prev_loss"]``
    holds the negated loss, while ``step`` returns the closure's own value. The
    groups carry ``maximize`` (also ``False``), where torch 2.13's carry no such key.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.LBFGS([w], line_search_fn="strong_wolfe")
      >>> def closure():
      ...     opt.zero_grad()
      ...     return lucid.backward(lambda w: ((w - 3.0) ** 2).sum(), w)
      >>> float(opt.step(closure))  # the first loss, as torch returns it
      29.0
      >>> w.data.round(4)
      Array([3., 3.], dtype=float32)
    """

    rule = LBFGS_RULE
    runs_rule = False  # its own step(closure); its state is `state`

    def constructed(self) -> None:
        """torch's LBFGS takes one parameter group."""
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.param_groups:
            # torch's base checks (duplicates across groups, names) come first, then LBFGS's
            super().add_param_group(param_group)
            self.param_groups.pop()
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        params = param_group.get("params", [])
        params = [params] if isinstance(params, Parameter) else list(params)
        if any(isinstance(p, Parameter) and jnp.iscomplexobj(p.data) for p in params):
            raise ValueError(
                "lucid's LBFGS does not support complex parameters (torch's runs on their real "
                "view): optimize the real and imaginary parts as two real parameters"
            )
        super().add_param_group(param_group)

    # ------------------------------------------------------------ flat views
    @property
    def _group_params(self) -> list:
        return self.param_groups[0]["params"]

    @property
    def _maximize(self) -> bool:
        # torch 2.15 reads the key with a default: a group loaded without it minimizes
        return bool(self.param_groups[0].get("maximize", False))

    def _gather_flat_grad(self) -> Array:
        flat = jnp.concatenate(
            [
                jnp.zeros(p.size, p.dtype) if p.grad is None else jnp.ravel(dense(p.grad))
                for p in self._group_params
            ]
        )
        return -flat if self._maximize else flat

    def _loss(self, loss: Any) -> float:
        """The closure's loss as the algorithm reads it: a host float, negated when
        maximizing (torch 2.15)."""
        value = _loss_value(loss)
        return -value if self._maximize else value

    def _add_grad(self, step_size: Any, update: Array) -> None:
        # cut in one compiled call: op by op, jax slices with index operands, int64
        # ones under x64, which Apple GPUs' programs avoid (docs/backends.md)
        params = self._group_params
        shapes = tuple(tuple(p.shape) for p in params)
        for p, piece in zip(params, _split(update, shapes)):
            p.data = p.data + step_size * piece

    def _directional_evaluate(
        self, closure: Callable, x: list[Array], t: Any, d: Array
    ) -> tuple[float, Array]:
        self._add_grad(t, d)
        loss = self._loss(closure())
        flat_grad = self._gather_flat_grad()
        for p, data in zip(self._group_params, x):
            p.data = data
        return loss, flat_grad

    # ------------------------------------------------------------------ step
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Run up to `max_iter` L-BFGS iterations, as torch's `LBFGS.step`.

        Args:
          closure: clears the gradients, computes them (`lucid.backward`) and
            returns the loss (a number or an array of exactly one element, any
            shape, as torch takes it); called once per function evaluation.

        Returns:
          The loss of the first closure call, as the closure returned it (torch
          returns it so; with `maximize`, too, the closure's own value, not its
          negation). With a group of no parameters, the closure is called once and
          its loss returned (torch 2.15; torch 2.13 raised `IndexError`).

        Raises:
          ValueError: no closure, hyper-parameters edited to invalid values, or a
            closure loss of more (or fewer) than one element (torch's error).
        """
        if closure is None:
            raise ValueError("LBFGS.step needs a closure that re-evaluates the loss")
        if not self._group_params:  # torch 2.15: nothing to optimize, the closure's loss
            return closure()
        group = self.param_groups[0]
        self.rule.check(group, warn=False)  # hand edits: checked before anything moves
        lr = host_float(group["lr"], "lr")
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]

        state = self.state[self._group_params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = closure()
        loss = self._loss(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if max_abs(flat_grad) <= tolerance_grad:
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        H_diag = state.get("H_diag")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                # curvature pair from the last move, then the two-loop recursion
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = jnp.dot(y, s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / jnp.dot(y, y)
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = jnp.dot(old_stps[i], q) * ro[i]
                    q = q + (-al[i]) * old_dirs[i]
                r = q * H_diag
                for i in range(num_old):
                    be_i = jnp.dot(old_dirs[i], r) * ro[i]
                    r = r + (al[i] - be_i) * old_stps[i]
                d = r

            prev_flat_grad = flat_grad
            prev_loss = loss
            first = state["n_iter"] == 1
            t = min(1.0, 1.0 / jnp.sum(jnp.abs(flat_grad))) * lr if first else lr
            gtd = jnp.dot(flat_grad, d)
            if gtd > -tolerance_change:
                break

            ls_func_evals = 0
            if line_search_fn is not None:
                x_init = [p.data for p in self._group_params]

                def obj_func(x: list[Array], t: Any, d: Array) -> tuple[float, Array]:
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                    obj_func, x_init, t, d, loss, flat_grad, gtd, max_ls=max_eval - current_evals
                )
                self._add_grad(t, d)
                opt_cond = max_abs(flat_grad) <= tolerance_grad
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    loss = self._loss(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = max_abs(flat_grad) <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if max_abs(d * t) <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state.update(
            d=d,
            t=t,
            old_dirs=old_dirs,
            old_stps=old_stps,
            ro=ro,
            H_diag=H_diag,
            prev_flat_grad=prev_flat_grad,
            prev_loss=prev_loss,
        )
        return orig_loss

    # ------------------------------------------------------------ checkpoints
    def export_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state as `state_dict` shows it: fresh lists of fresh arrays, so the
        history shares no memory with a copy.

        Args:
          state: the first parameter's state (counters, vectors, history lists).

        Returns:
          `{name: value}` with torch's names.
        """
        return {k: _copy_arrays(v) if isinstance(v, list) else v for k, v in state.items()}

    def import_state(self, group: Mapping[str, Any], p: Any, saved: Any, key: Any) -> Any:
        """torch's LBFGS state (kept on the first parameter) from a state_dict entry.

        Args:
          group: the parameter's group, with the loaded options.
          p: the parameter.
          saved: its entry, counters, vectors and history lists under torch's names.
          key: the entry's key in the state_dict (for error messages).

        Returns:
          The state, or `None` for an empty entry.

        Raises:
          ValueError: an unknown entry, or one that does not fit the parameters.
        """
        if not isinstance(saved, Mapping):
            raise ValueError(f"state of parameter {key!r} must be a dict")
        known = set(_HISTORY + _VECTORS + _SCALARS + _COUNTERS)
        unknown = set(saved) - known
        if unknown:
            raise ValueError(f"LBFGS state has unknown entries {sorted(unknown)}")
        if p is not self._group_params[0] and saved:
            raise ValueError("LBFGS keeps its state on the first parameter only")
        numel = sum(q.size for q in self._group_params)
        dtype = jnp.result_type(*[q.dtype for q in self._group_params])

        def vector(value: Any, name: str) -> Array:
            array = np.asarray(to_array(value))
            if array.shape != (numel,):
                raise ValueError(
                    f"LBFGS state {name!r} has shape {array.shape}, expected ({numel},)"
                )
            return jnp.asarray(array, dtype)

        def scalar(value: Any) -> Any:
            value = to_array(value)
            return jnp.asarray(value, dtype) if isinstance(value, np.ndarray) else value

        if not saved:
            return None
        state: dict[str, Any] = {}
        for name, value in saved.items():
            if name in _COUNTERS:
                state[name] = int(value)
            elif name in _VECTORS:
                state[name] = None if value is None else vector(value, name)
            elif name in _SCALARS:
                state[name] = scalar(value)
            elif name == "al":
                state[name] = [None if v is None else scalar(v) for v in value]
            elif name == "ro":
                state[name] = [scalar(v) for v in value]
            else:
                state[name] = [vector(v, name) for v in value]
        return state
