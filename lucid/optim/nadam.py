"""``NAdam`` over :data:`lucid.functional.nadam.NADAM`."""

from __future__ import annotations

from typing import Any

from ..functional.nadam import NADAM
from .optimizer import Optimizer, ParamsT, options_of


class NAdam(Optimizer):
    """torch.optim.NAdam: Dozat's momentum schedule, optional decoupled weight decay."""

    rule = NADAM

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 2e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0,
        momentum_decay: Any = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
