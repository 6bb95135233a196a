"""``Adamax`` over :data:`lucid.functional.adamax.ADAMAX`."""

from __future__ import annotations

from typing import Any

from ..functional.adamax import ADAMAX
from .optimizer import Optimizer, ParamsT, options_of


class Adamax(Optimizer):
    """torch.optim.Adamax: the infinity-norm variant of Adam."""

    rule = ADAMAX

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 2e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
