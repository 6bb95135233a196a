"""``Rprop``: the rule of ``lucid.functional.rprop`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.rprop import RPROP, RPROP_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Rprop",
]


@torch_optimizer(RPROP_SIGNATURE, saved=("lr", "etas", "step_sizes"))
class Rprop(Optimizer):
    """torch.optim.Rprop: per-element step sizes driven by gradient signs."""

    rule = RPROP
