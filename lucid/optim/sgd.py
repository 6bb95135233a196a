"""``SGD``: the rule of ``lucid.functional.sgd`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.sgd import SGD as SGD_RULE
from ..functional.sgd import SGD_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "SGD",
]


@torch_optimizer(SGD_SIGNATURE, saved=("lr", "momentum", "dampening", "weight_decay"))
class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, Nesterov, weight decay, maximize.

    The momentum buffer is created from the first gradient, and the state holds
    exactly torch's `momentum_buffer`."""

    rule = SGD_RULE
