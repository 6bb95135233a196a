"""``SGD``: torch.optim.SGD over :data:`lucid.functional.sgd.SGD`."""

from __future__ import annotations

from typing import Any

from ..functional.sgd import SGD as SGD_RULE
from .optimizer import Optimizer, ParamsT, options_of


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, Nesterov, weight decay, maximize.

    The momentum buffer is created from the first gradient, and the state holds
    exactly torch's ``momentum_buffer``. ``foreach`` and ``fused`` are no-ops.
    """

    rule = SGD_RULE

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-3,
        momentum: Any = 0,
        dampening: Any = 0,
        weight_decay: Any = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, options_of(locals()))
