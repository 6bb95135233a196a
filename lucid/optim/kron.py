"""``Kron``: the rule of ``lucid.functional.kron`` (kron-torch's PSGD Kron) behind torch's
stateful API, with kron-torch's state_dict format.

kron-torch keeps, for each parameter, ``step`` (a Python int), ``momentum_buffer`` (in the
merged shape), ``Q`` (a list of factors: vectors for diagonal ones, matrices for triangular
ones), ``exprs`` (its einsum strings) and, for a merged tensor, ``merged_shape``. lucid's
`state` and `state_dict` show the same entries (``step`` as a 0-d float32 array, arrays as
jax arrays); `load_state_dict` takes lucid's or kron-torch's, and `to_kron_torch` turns
lucid's into what ``kron_torch.Kron.load_state_dict`` takes. kron-torch's optimizer-wide
counters (``_prob_step``, ``_update_counter``) and its balancing generator are not in its
state_dict: a kron-torch optimizer that loads one starts them afresh, and so does lucid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._arrays import to_array
from ..functional.kron import (
    KRON,
    KRON_SIGNATURE,
    KronState,
    ProbSchedule,
    as_dtype,
    as_schedule,
    einsum_expressions,
    factor_layout,
    first_key,
    not_supported,
    pack,
    unpack,
)
from ._declare import torch_optimizer
from ._torch_format import to_torch
from .optimizer import Optimizer

__all__ = [
    "Kron",
    "to_kron_torch",
]

SHOWN = ("step", "merged_shape", "momentum_buffer", "Q", "exprs")


def _layout_flags(group: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "max_size_triangular": int(group["max_size_triangular"]),
        "min_ndim_triangular": int(group["min_ndim_triangular"]),
        "memory_save_mode": group["memory_save_mode"],
        "merge_dims": bool(group["merge_dims"]),
    }


@torch_optimizer(
    KRON_SIGNATURE,
    reference="kron-torch",
    saved=("lr", "b1", "weight_decay", "preconditioner_update_probability", "precond_lr"),
)
class Kron(Optimizer):
    """PSGD Kron, as kron-torch 0.3.3's ``Kron`` (Xi-Lin Li's PSGD with Kronecker factors).

    Each parameter (at least 1-D) keeps a momentum and one factor per axis of its merged
    shape; `lucid.functional.kron` holds the math. The group's
    ``preconditioner_update_probability`` holds kron-torch's default schedule (a
    `lucid.functional.kron.ProbSchedule`) when given ``None``. lucid keeps kron-torch's
    counters with each parameter (see `lucid.functional.kron`): they agree with
    kron-torch's while every parameter has a gradient at every step and the groups share
    one update probability.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones((3, 2)))
      >>> opt = lucid.optim.Kron([w], lr=0.01)
      >>> w.grad = jnp.ones((3, 2))
      >>> opt.step()
      >>> sorted(opt.state[w]), [q.shape for q in opt.state[w]["Q"]]
      (['Q', 'exprs', 'momentum_buffer', 'step'], [(3, 3), (2, 2)])
    """

    rule = KRON

    def constructed(self) -> None:
        """Refuse, at construction, a parameter kron-torch fails on at its first step."""
        for group in self.param_groups:
            for p in group["params"]:
                error = not_supported(p.shape, bool(group["merge_dims"]))
                if error is not None:
                    raise (RuntimeError if len(p.shape) == 0 else ValueError)(error)

    def groups_loaded(self) -> None:
        """A kron-torch state_dict's group values in lucid's terms: its ``ProbScheduler`` as
        the same `ProbSchedule`, its torch dtypes as NumPy dtypes."""
        for group in self.param_groups:
            group["preconditioner_update_probability"] = as_schedule(
                group["preconditioner_update_probability"]
            )
            for name in ("mu_dtype", "precond_dtype"):
                group[name] = as_dtype(group[name], name)

    def state_names(self) -> set[str]:
        """kron-torch's entry names (others written into `state` are kept beside them).

        Returns:
          ``step``, ``merged_shape``, ``momentum_buffer``, ``Q``, ``exprs``.
        """
        return set(SHOWN)

    def export_state(self, state: Any) -> dict[str, Any]:
        """A parameter's state as kron-torch shows it.

        Args:
          state: the parameter's `KronState`.

        Returns:
          ``step`` (0-d float32), ``merged_shape`` (for a merged tensor: a list of ints),
          ``momentum_buffer``, ``Q`` (a list of arrays) and ``exprs`` (kron-torch's
          einsum strings).
        """
        shape = tuple(state.momentum_buffer.shape)
        diag = tuple(bool(d) for d in np.asarray(state.diag))
        shown: dict[str, Any] = {"step": jnp.array(state.step, copy=True)}
        # kron-torch records the merged shape of a tensor of three or more axes only
        shown["momentum_buffer"] = jnp.array(state.momentum_buffer, copy=True)
        shown["Q"] = [jnp.array(q, copy=True) for q in unpack(state.Q, shape, diag)]
        shown["exprs"] = einsum_expressions(diag)
        return shown

    def state_dict(self) -> dict[str, Any]:
        """The state and options in kron-torch's format (arrays as jax arrays).

        Returns:
          `{"state": {index: entries}, "param_groups": [...]}`, as
          [Optimizer.state_dict][lucid.optim.Optimizer.state_dict]; a parameter of three or
          more axes that kron-torch merges also shows its ``merged_shape``.
        """
        state_dict = super().state_dict()
        params = [p for group in self.param_groups for p in group["params"]]
        for index, entry in state_dict["state"].items():
            if isinstance(index, int) and "momentum_buffer" in entry:
                shape = tuple(params[index].shape)
                merged = tuple(entry["momentum_buffer"].shape)
                if len(shape) > 2 and merged != shape:
                    entry["merged_shape"] = [int(s) for s in merged]
        return state_dict

    def import_state(self, group: Mapping[str, Any], p: Any, saved: Any, key: Any) -> Any:
        """A saved entry (lucid's, or kron-torch's: ``step`` an int, ``Q`` a list of tensors)
        as the parameter's state; the counters start at zero, the key from the parameter.

        Args:
          group: the parameter's group, with the loaded options.
          p: the parameter.
          saved: its entry in the state_dict's `state`.
          key: the entry's key (for error messages).

        Returns:
          The `KronState`, or `None` for an empty entry.

        Raises:
          ValueError: unknown or missing entries, or a shape or dtype that does not fit
            this parameter under the group's options.
        """
        if not isinstance(saved, Mapping):
            raise ValueError(
                f"state of parameter {key!r} must be a dict, got {type(saved).__name__}"
            )
        if not saved:
            return None
        unknown = set(saved) - set(SHOWN)
        if unknown:
            raise ValueError(
                f"state of parameter {key!r} has unknown entries {sorted(unknown)} for Kron "
                f"(expected some of {list(SHOWN)})"
            )
        missing = {"step", "momentum_buffer", "Q"} - set(saved)
        if missing:
            raise ValueError(f"state of parameter {key!r} is missing {sorted(missing)}")
        shape, diag = factor_layout(tuple(p.shape), _layout_flags(group))
        where = f"parameter {key!r} of shape {tuple(p.shape)}"
        if "merged_shape" in saved and tuple(int(s) for s in saved["merged_shape"]) != shape:
            raise ValueError(
                f"state 'merged_shape' of {where} is {list(saved['merged_shape'])}, but Kron "
                f"preconditions it as {list(shape)} under this group's merge_dims"
            )
        step = np.asarray(to_array(saved["step"]))
        if step.shape != () or not np.issubdtype(step.dtype, np.number):
            raise ValueError(f"state 'step' of {where} must be a number")
        buffer = _float_array(saved["momentum_buffer"], f"state 'momentum_buffer' of {where}")
        if buffer.shape != shape:
            raise ValueError(
                f"state 'momentum_buffer' of {where} has shape {buffer.shape}; Kron keeps it "
                f"in the merged shape {shape}"
            )
        factors = saved["Q"]
        if not isinstance(factors, list | tuple) or len(factors) != len(shape):
            raise ValueError(
                f"state 'Q' of {where} must be a list of {len(shape)} factors, one per axis "
                f"of {shape}"
            )
        arrays = []
        for i, (q, size, d) in enumerate(zip(factors, shape, diag)):
            q = _float_array(q, f"state 'Q'[{i}] of {where}")
            expected = (size,) if d else (size, size)
            if q.shape != expected:
                kind = "diagonal" if d else "triangular"
                raise ValueError(
                    f"state 'Q'[{i}] of {where} has shape {q.shape}; under this group's "
                    f"options axis {i} has a {kind} factor of shape {expected}"
                )
            arrays.append(q)
        mu = as_dtype(group["mu_dtype"], "mu_dtype") or np.dtype(p.dtype)
        precond = as_dtype(group["precond_dtype"], "precond_dtype") or np.dtype(np.float32)
        zero = jnp.zeros((), jnp.float32)
        return KronState(
            step=jnp.asarray(step, jnp.float32),
            momentum_buffer=jnp.asarray(buffer, mu),
            Q=pack([jnp.asarray(q, precond) for q in arrays]),
            prob_step=zero,
            update_counter=jnp.zeros((), jnp.float32),
            key=first_key(p.data),
            diag=jnp.asarray(diag, jnp.int32),
        )


def _float_array(value: Any, where: str) -> np.ndarray:
    array = np.asarray(to_array(value))
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise ValueError(f"{where} has dtype {array.dtype}; expected a float array")
    return array


def to_kron_torch(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A lucid `Kron` state_dict as ``kron_torch.Kron.load_state_dict`` takes it.

    Arrays become torch tensors (`lucid.optim.to_torch`), ``step`` the Python int
    kron-torch counts with (so its ``b1 ** step`` is computed as its own), a
    `ProbSchedule` kron-torch's ``ProbScheduler`` and the dtype options torch dtypes.
    Needs torch and kron-torch installed.

    Args:
      state_dict: what `Kron.state_dict()` returned.

    Returns:
      The state_dict in kron-torch's format.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones((3, 2)))
      >>> opt = lucid.optim.Kron([w])
      >>> w.grad = jnp.ones((3, 2))
      >>> opt.step()
      >>> sd = lucid.optim.kron.to_kron_torch(opt.state_dict())
      >>> sd["state"][0]["step"], type(sd["state"][0]["Q"][0]).__name__
      (1, 'Tensor')
      >>> type(sd["param_groups"][0]["preconditioner_update_probability"]).__name__
      'ProbScheduler'
    """
    import torch
    from kron_torch.kron import precond_update_prob_schedule

    state: dict[Any, Any] = {}
    for index, entry in state_dict["state"].items():
        entry = dict(entry)
        if "step" in entry:
            entry["step"] = int(np.asarray(entry["step"]))
        state[index] = to_torch(entry)
    groups = []
    for group in state_dict["param_groups"]:
        group = dict(group)
        schedule = group.get("preconditioner_update_probability")
        if isinstance(schedule, ProbSchedule):
            group["preconditioner_update_probability"] = precond_update_prob_schedule(
                schedule.max_prob, schedule.min_prob, schedule.decay, schedule.flat_start
            )
        for name in ("mu_dtype", "precond_dtype"):
            if group.get(name) is not None:
                group[name] = getattr(torch, np.dtype(as_dtype(group[name], name)).name)
        groups.append(group)
    return {"state": state, "param_groups": groups}
