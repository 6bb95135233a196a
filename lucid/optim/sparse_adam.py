"""``SparseAdam`` over :data:`lucid.functional.sparse_adam.SPARSE_ADAM`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..functional.sparse_adam import SPARSE_ADAM
from .optimizer import Optimizer, ParamsT, options_of


class SparseAdam(Optimizer):
    """torch.optim.SparseAdam: lazy Adam on the gradient's present entries.

    ``.grad`` may be a ``jax.experimental.sparse.BCOO`` (its stored indices are
    present, duplicates summed) or a dense array (its nonzero entries are
    present). The state_dict keeps ``step`` as a Python int, as torch does.
    """

    rule = SPARSE_ADAM

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        maximize: bool = False,
    ) -> None:
        options = options_of(locals())
        options["betas"] = tuple(betas) if isinstance(betas, list | tuple) else betas
        super().__init__(params, options)
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
        shown = super().export_state(state)
        return {**shown, "step": int(shown["step"])} if "step" in shown else shown
