"""``Adadelta`` over :data:`lucid.functional.adadelta.ADADELTA`."""

from __future__ import annotations

from typing import Any

from ..functional.adadelta import ADADELTA
from .optimizer import Optimizer, ParamsT, options_of


class Adadelta(Optimizer):
    """torch.optim.Adadelta: ``lr`` (default 1.0) multiplies the delta."""

    rule = ADADELTA

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1.0,
        rho: Any = 0.9,
        eps: Any = 1e-6,
        weight_decay: Any = 0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
