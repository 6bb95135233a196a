"""``Adagrad`` over :data:`lucid.functional.adagrad.ADAGRAD`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._parameter import Parameter
from ..functional.adagrad import ADAGRAD
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
        for group in self.param_groups:
            for p in group["params"]:
                self._state[p] = self._state_dict_of(self._initial_state(group, p))

    def _initial_state(self, group: Mapping[str, Any], p: Parameter) -> Any:
        return super()._initial_state(
            {**group, "initial_accumulator_value": self.defaults["initial_accumulator_value"]}, p
        )
