"""``Shampoo``: the rule of ``lucid.functional.shampoo`` behind pytorch_optimizer's API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from .._parameter import Parameter
from ..functional.shampoo import SHAMPOO, SHAMPOO_SIGNATURE, ShampooState
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Shampoo",
]


@torch_optimizer(
    SHAMPOO_SIGNATURE,
    reference="pytorch_optimizer",
    saved=("lr", "momentum", "weight_decay", "weight_decouple", "fixed_decay", "matrix_eps"),
)
class Shampoo(Optimizer):
    """pytorch_optimizer.Shampoo (pytorch-optimizer 4.1): one inverse matrix root per axis.

    The state_dict is the reference's: per parameter `momentum_buffer`, `pre_cond_<i>` and
    `inv_pre_cond_<i>` for each axis `i`; each group holds the reference's `step`, the
    number of `step()` calls so far. `preconditioning_compute_steps` and `maximize`, which
    the reference keeps on the optimizer, are options of each group here: a group loaded
    without them takes this optimizer's.
    """

    rule = SHAMPOO

    def end_step(self) -> None:
        """Every group's `step` advances, as the reference counts `step()` calls."""
        for group in self.param_groups:
            group["step"] = int(group.get("step", 0)) + 1

    def import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> Any:
        """A saved entry (the reference's or lucid's) as a `ShampooState`, its hidden
        step count the group's `step`.

        Args:
          group: the parameter's group, with the loaded options.
          p: the parameter.
          saved: its entry in the state_dict's `state`.
          key: the entry's key (for error messages).

        Returns:
          The parameter's `ShampooState` (or the entry as the base class reads it, where it is
          not one).

        Raises:
          ValueError: an entry is missing, unknown, or of the wrong shape.
        """
        state = super().import_state(group, p, saved, key)
        if not isinstance(state, ShampooState):
            return state
        return state._replace(step=jnp.asarray(float(group.get("step", 0)), jnp.float32))
