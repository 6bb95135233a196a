"""``RAdam``: the rule of ``lucid.functional.radam`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.radam import RADAM, RADAM_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "RAdam",
]


@torch_optimizer(RADAM_SIGNATURE, saved=("lr", "betas", "eps", "weight_decay"))
class RAdam(Optimizer):
    """torch.optim.RAdam: rectified Adam, optional `decoupled_weight_decay`."""

    rule = RADAM
