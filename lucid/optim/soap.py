"""``SOAP``: the rule of ``lucid.functional.soap`` behind pytorch_optimizer's stateful API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import to_array
from .._parameter import Parameter
from ..functional.soap import SOAP as SOAP_RULE
from ..functional.soap import SOAP_SIGNATURE, SOAPState, entries, preconditioners
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "SOAP",
]

_SAVED = (
    "lr",
    "betas",
    "shampoo_beta",
    "weight_decay",
    "precondition_frequency",
    "max_precondition_dim",
    "merge_dims",
    "precondition_1d",
    "correct_bias",
    "normalize_gradient",
    "eps",
)


@torch_optimizer(SOAP_SIGNATURE, reference="pytorch_optimizer", saved=_SAVED)
class SOAP(Optimizer):
    """pytorch_optimizer.SOAP (pytorch-optimizer 4.1): Adam in Shampoo's eigenbasis.

    The state_dict is the reference's: per parameter `exp_avg`, `exp_avg_sq`, `GG` and
    `Q` (lists with one matrix per axis, `[]` for an axis without a preconditioner),
    `precondition_frequency` (an int) and `shampoo_beta` (a float); each group holds the
    reference's `step`, the number of `step()` calls so far (every group counts every
    call, as the reference's). A checkpoint loads both ways; a loaded state takes its
    group's `step` as the count of each of its parameters. `data_format` and
    `maximize` stay out of the reference's groups (it keeps them on the optimizer), so
    a group loaded without them takes this optimizer's.
    """

    rule = SOAP_RULE

    def end_step(self) -> None:
        """Every group's `step` advances, as the reference counts `step()` calls."""
        for group in self.param_groups:
            group["step"] = int(group.get("step", 0)) + 1

    def export_state(self, state: Any) -> dict[str, Any]:
        """The reference's entries: `GG` and `Q` as lists of matrices (`[]` for none),
        `precondition_frequency` an int, `shampoo_beta` a float.

        Args:
          state: the parameter's `SOAPState`.

        Returns:
          `{name: value}` as the reference's state holds it.
        """
        if not isinstance(state, SOAPState):
            return super().export_state(state)
        dims = [int(d) for d in np.asarray(jax.device_get(state.dims))]
        return {
            "exp_avg": state.exp_avg,
            "exp_avg_sq": state.exp_avg_sq,
            "GG": [[] if m is None else m for m in preconditioners(state.GG, dims)],
            "Q": [[] if m is None else m for m in preconditioners(state.Q, dims)],
            "precondition_frequency": int(jax.device_get(state.precondition_frequency)),
            "shampoo_beta": float(jax.device_get(state.shampoo_beta)),
        }

    def import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> Any:
        """A saved entry (the reference's or lucid's) as a `SOAPState`, checked first.

        Args:
          group: the parameter's group, with the loaded options.
          p: the parameter.
          saved: its entry in the state_dict's `state`.
          key: the entry's key (for error messages).

        Returns:
          The parameter's `SOAPState` (or the entry as the base class reads it, where it is
          not one).

        Raises:
          ValueError: an entry is missing, unknown, or of the wrong shape for this
            parameter under the group's options.
        """
        if not isinstance(saved, Mapping):
            raise ValueError(
                f"state of parameter {key!r} must be a dict, got {type(saved).__name__}"
            )
        if not saved:
            return None
        names = ("exp_avg", "exp_avg_sq", "GG", "Q", "precondition_frequency", "shampoo_beta")
        unknown = sorted(set(saved) - set(names))
        missing = sorted(set(names) - set(saved))
        if unknown or missing:
            raise ValueError(
                f"state of parameter {key!r} does not fit SOAP: "
                + (f"unknown entries {unknown}" if unknown else "")
                + ("; " if unknown and missing else "")
                + (f"missing {missing}" if missing else "")
                + f" (expected {list(names)})"
            )
        _, flags = self.rule.split(group)
        shape, dtype = tuple(p.shape), p.dtype
        try:
            dims = entries(shape, flags)
        except RuntimeError as error:
            raise ValueError(str(error)) from None
        values: dict[str, Any] = {}
        for name in ("exp_avg", "exp_avg_sq"):
            values[name] = _array(saved[name], shape, dtype, name, key)
        for name in ("GG", "Q"):
            listed = saved[name]
            if not isinstance(listed, list | tuple) or len(listed) != len(dims):
                raise ValueError(
                    f"state {name!r} of parameter {key!r} must be a list of {len(dims)} "
                    f"entries (one per axis of a parameter of shape {shape} under these "
                    f"options), got {listed!r:.80}"
                )
            matrices = []
            for i, (d, m) in enumerate(zip(dims, listed)):
                if d == 0:
                    if not (isinstance(m, list | tuple) and len(m) == 0):
                        raise ValueError(
                            f"state {name!r}[{i}] of parameter {key!r} must be [] (axis {i} "
                            "has no preconditioner under these options)"
                        )
                    continue
                matrices.append(_array(m, (d, d), dtype, f"{name}[{i}]", key))
            flat = [jnp.ravel(m) for m in matrices]
            values[name] = jnp.concatenate(flat) if flat else jnp.zeros((0,), dtype)
        cdtype = jnp.promote_types(dtype, jnp.float32)
        for name in ("precondition_frequency", "shampoo_beta"):
            value = np.asarray(to_array(saved[name]))
            if value.shape != () or not np.issubdtype(value.dtype, np.number):
                raise ValueError(f"state {name!r} of parameter {key!r} must be a number")
            values[name] = jnp.asarray(value, cdtype)
        step = float(group.get("step", 0))
        return SOAPState(
            step=jnp.asarray(step, jnp.float32),
            dims=jnp.asarray(dims, jnp.int32),
            **values,
        )


def _array(value: Any, shape: tuple, dtype: Any, name: str, key: Any) -> Any:
    array = np.asarray(to_array(value)) if not isinstance(value, jax.Array) else value
    if not jnp.issubdtype(array.dtype, jnp.inexact):
        raise ValueError(f"state {name!r} of parameter {key!r} has dtype {array.dtype}")
    if tuple(array.shape) != tuple(shape):
        raise ValueError(
            f"state {name!r} of parameter {key!r} has shape {tuple(array.shape)}, but SOAP "
            f"keeps it as {tuple(shape)} here"
        )
    return jnp.asarray(array, dtype)
