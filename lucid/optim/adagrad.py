"""``Adagrad`` over :data:`lucid.functional.adagrad.ADAGRAD`."""

from __future__ import annotations

from typing import Any

from ..functional.adagrad import ADAGRAD
from ._backend import start_hyper
from ._state import begin
from .optimizer import Optimizer, ParamsT, options_of


class Adagrad(Optimizer):
    """torch.optim.Adagrad: ``lr_decay``, ``initial_accumulator_value``.

    As in torch, every parameter's state (``step`` and ``sum``) exists from
    construction, and the accumulator starts at the *constructor's*
    ``initial_accumulator_value`` (torch ignores a per-group value).
    """

    rule = ADAGRAD

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-2,
        lr_decay: Any = 0,
        weight_decay: Any = 0,
        initial_accumulator_value: Any = 0,
        eps: Any = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, options_of(locals()))
        states = {}
        for group in self.param_groups:
            start = start_hyper(self, group)
            _, flags = self.rule.split(group)
            for p in group["params"]:
                states[p] = begin(self.rule, flags, start, None, p.data)
        self.backend.load(states)

    def state_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """torch starts every accumulator from the *constructor's* (``defaults``) value."""
        return {**group, "initial_accumulator_value": self.defaults["initial_accumulator_value"]}
