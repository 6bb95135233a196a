"""``Muon``: the rule of ``lucid.functional.muon`` behind torch's stateful API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..functional.muon import MUON, MUON_SIGNATURE, not_a_matrix
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Muon",
]


@torch_optimizer(
    MUON_SIGNATURE,
    saved=(
        "lr",
        "weight_decay",
        "momentum",
        "nesterov",
        "ns_coefficients",
        "eps",
        "ns_steps",
        "adjust_lr_fn",
    ),
)
class Muon(Optimizer):
    """torch.optim.Muon: momentum orthogonalized by a bfloat16 Newton-Schulz iteration.

    For 2-D parameters only, as torch: the constructor raises torch's
    ``ValueError`` for any other parameter, and a step raises it for a
    non-2-D gradient (a parameter added later with ``add_param_group``) before
    anything changes. With ``batched_matrices=True`` (lucid's option, per group) a
    parameter of shape ``(..., M, N)`` is a stack of matrices, each updated as torch
    updates a 2-D parameter. The state holds torch's ``momentum_buffer``.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones((4, 2)))
      >>> opt = lucid.optim.Muon([w], lr=0.02)
      >>> w.grad = jnp.eye(4, 2)
      >>> opt.step()
      >>> list(opt.state[w])
      ['momentum_buffer']
    """

    rule = MUON

    def constructed(self) -> None:
        """torch refuses a parameter that is not 2-D at construction (with
        ``batched_matrices``, one below 2-D)."""
        for group in self.param_groups:
            for p in group["params"]:
                error = not_a_matrix(p.shape, group["batched_matrices"])
                if error is not None:
                    raise ValueError(error)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter with a gradient.

        Args:
          closure: optional; called first, its loss returned.

        Returns:
          `closure()`'s loss, or `None` without a closure.

        Raises:
          ValueError: a parameter with a gradient is not 2-D (torch's error; with
            ``batched_matrices``, below 2-D).
        """
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            batched = group["batched_matrices"]
            for p in group["params"]:
                if p.grad is not None and not_a_matrix(p.shape, batched) is not None:
                    raise ValueError(
                        not_a_matrix(p.shape, True)
                        if batched
                        else "Param gradient must be a 2D matrix"
                    )
        super().step()
        return loss
