"""``ASGD``: the rule of ``lucid.functional.asgd`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.asgd import ASGD as ASGD_RULE
from ..functional.asgd import ASGD_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "ASGD",
]


@torch_optimizer(ASGD_SIGNATURE, saved=("lr", "lambd", "alpha", "t0", "weight_decay"))
class ASGD(Optimizer):
    """torch.optim.ASGD: SGD with decaying step `eta` and the running average `ax`."""

    rule = ASGD_RULE
