"""``Muon``: the rule of ``lucid.functional.muon`` behind torch's stateful API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..functional.muon import MUON, MUON_SIGNATURE
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
    anything changes. The state holds torch's ``momentum_buffer``.

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
        """torch refuses a parameter that is not 2-D at construction."""
        for p in self.parameters():
            if len(p.shape) != 2:
                raise ValueError(
                    "Muon only supports 2D parameters whereas we found a parameter with size: "
                    f"{tuple(p.shape)}"
                )

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter with a gradient.

        Args:
          closure: optional; called first, its loss returned.

        Returns:
          `closure()`'s loss, or `None` without a closure.

        Raises:
          ValueError: a parameter with a gradient is not 2-D (torch's error).
        """
        loss = closure() if closure is not None else None
        for p in self.parameters():
            if p.grad is not None and len(p.shape) != 2:
                raise ValueError("Param gradient must be a 2D matrix")
        super().step()
        return loss
