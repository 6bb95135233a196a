"""``Adam`` and ``AdamW``: the rule of ``lucid.functional.adam`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.adam import ADAM, ADAM_SIGNATURE, ADAMW, ADAMW_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Adam",
    "AdamW",
]


@torch_optimizer(ADAM_SIGNATURE, saved=("lr", "betas", "eps", "weight_decay"))
class Adam(Optimizer):
    """torch.optim.Adam, with AMSGrad and `decoupled_weight_decay`."""

    rule = ADAM


@torch_optimizer(ADAMW_SIGNATURE, saved=("lr", "betas", "eps", "weight_decay"))
class AdamW(Optimizer):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2)."""

    rule = ADAMW

    def groups_loaded(self) -> None:
        """As torch's AdamW, a load makes every group's weight decay decoupled again."""
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
