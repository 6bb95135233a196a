"""``Rprop`` over :data:`lucid.functional.rprop.RPROP`."""

from __future__ import annotations

from typing import Any

from ..functional.rprop import RPROP
from .optimizer import Optimizer, ParamsT, options_of


class Rprop(Optimizer):
    """torch.optim.Rprop: per-element step sizes driven by gradient signs."""

    rule = RPROP

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-2,
        etas: tuple[Any, Any] = (0.5, 1.2),
        step_sizes: tuple[Any, Any] = (1e-6, 50),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
