"""``RMSprop`` over :data:`lucid.functional.rmsprop.RMSPROP`."""

from __future__ import annotations

from typing import Any

from ..functional.rmsprop import RMSPROP
from .optimizer import Optimizer, ParamsT, options_of


class RMSprop(Optimizer):
    """torch.optim.RMSprop: ``centered``, ``momentum`` (the buffer holds ``g/avg``)."""

    rule = RMSPROP

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-2,
        alpha: Any = 0.99,
        eps: Any = 1e-8,
        weight_decay: Any = 0,
        momentum: Any = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
