"""``RMSprop``: the rule of ``lucid.functional.rmsprop`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.rmsprop import RMSPROP, RMSPROP_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "RMSprop",
]


@torch_optimizer(RMSPROP_SIGNATURE, saved=("lr", "alpha", "eps", "weight_decay"))
class RMSprop(Optimizer):
    """torch.optim.RMSprop: `centered`, `momentum` (the buffer holds `g / a_t`)."""

    rule = RMSPROP
