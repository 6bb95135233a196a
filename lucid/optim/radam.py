"""``RAdam`` over :data:`lucid.functional.radam.RADAM`."""

from __future__ import annotations

from typing import Any

from ..functional.radam import RADAM
from .optimizer import Optimizer, ParamsT, options_of


class RAdam(Optimizer):
    """torch.optim.RAdam: rectified Adam, optional ``decoupled_weight_decay``."""

    rule = RADAM

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
