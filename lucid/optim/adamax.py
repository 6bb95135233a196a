"""``Adamax``: the rule of ``lucid.functional.adamax`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.adamax import ADAMAX, ADAMAX_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Adamax",
]


@torch_optimizer(ADAMAX_SIGNATURE, saved=("lr", "betas", "eps", "weight_decay"))
class Adamax(Optimizer):
    """torch.optim.Adamax: the infinity-norm variant of Adam."""

    rule = ADAMAX
