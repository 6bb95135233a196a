"""``Adadelta``: the rule of ``lucid.functional.adadelta`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.adadelta import ADADELTA, ADADELTA_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Adadelta",
]


@torch_optimizer(ADADELTA_SIGNATURE, saved=("lr", "rho", "eps", "weight_decay"))
class Adadelta(Optimizer):
    """torch.optim.Adadelta: `lr` (default 1.0) multiplies the delta."""

    rule = ADADELTA
