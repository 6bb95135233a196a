"""``ASGD`` over :data:`lucid.functional.asgd.ASGD`."""

from __future__ import annotations

from typing import Any

from ..functional.asgd import ASGD as ASGD_RULE
from .optimizer import Optimizer, ParamsT, options_of


class ASGD(Optimizer):
    """torch.optim.ASGD: SGD with decaying step ``eta`` and the running average ``ax``."""

    rule = ASGD_RULE

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-2,
        lambd: Any = 1e-4,
        alpha: Any = 0.75,
        t0: Any = 1e6,
        weight_decay: Any = 0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
