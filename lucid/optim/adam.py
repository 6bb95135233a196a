"""``Adam`` and ``AdamW`` over :mod:`lucid.functional.adam`."""

from __future__ import annotations

from typing import Any

from ..functional.adam import ADAM, ADAMW
from .optimizer import Optimizer, ParamsT, options_of


class Adam(Optimizer):
    """torch.optim.Adam, with AMSGrad and ``decoupled_weight_decay``.

    ``foreach``, ``capturable`` and ``fused`` are accepted and ignored.
    """

    rule = ADAM

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        options = options_of(locals())
        options["betas"] = tuple(betas) if isinstance(betas, list | tuple) else betas
        super().__init__(params, options)


class AdamW(Optimizer):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2)."""

    rule = ADAMW

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-3,
        betas: tuple[Any, Any] = (0.9, 0.999),
        eps: Any = 1e-8,
        weight_decay: Any = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        options = options_of(locals())
        options["betas"] = tuple(betas) if isinstance(betas, list | tuple) else betas
        super().__init__(params, {**options, "decoupled_weight_decay": True})

    def groups_loaded(self) -> None:
        """As torch's AdamW, a load makes every group's weight decay decoupled again."""
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
