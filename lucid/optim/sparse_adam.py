"""``SparseAdam``: the rule of ``lucid.functional.sparse_adam`` behind torch's stateful API."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..functional.sparse_adam import SPARSE_ADAM, SPARSE_ADAM_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "SparseAdam",
]


@torch_optimizer(SPARSE_ADAM_SIGNATURE, saved=("lr", "betas", "eps"))
class SparseAdam(Optimizer):
    """torch.optim.SparseAdam: lazy Adam on the gradient's present entries.

    ``.grad`` may be a ``jax.experimental.sparse.BCOO`` (its stored indices are
    present, duplicates summed) or a dense array (its nonzero entries are
    present). The state_dict keeps ``step`` as a Python int, as torch does.
    """

    rule = SPARSE_ADAM

    def constructed(self) -> None:
        """torch refuses complex parameters at construction."""
        complex_params = [
            [index, d_index]
            for index, group in enumerate(self.param_groups)
            for d_index, p in enumerate(group["params"])
            if jnp.iscomplexobj(p.data)
        ]
        if complex_params:  # torch's check, at construction
            raise ValueError(
                f"Complex params at indices {complex_params}: SparseAdam does not support "
                "complex parameters"
            )

    def export_state(self, state: Any) -> dict[str, Any]:
        """The state with torch's names, `step` a Python int as torch keeps it.

        Args:
          state: the parameter's state.

        Returns:
          `{name: value}` with torch's names.
        """
        shown = super().export_state(state)
        return {**shown, "step": int(shown["step"])} if "step" in shown else shown
