"""``NAdam``: the rule of ``lucid.functional.nadam`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.nadam import NADAM, NADAM_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "NAdam",
]


@torch_optimizer(NADAM_SIGNATURE, saved=("lr", "betas", "eps", "weight_decay", "momentum_decay"))
class NAdam(Optimizer):
    """torch.optim.NAdam: Dozat's momentum schedule, optional decoupled weight decay."""

    rule = NADAM
