"""``Adagrad``: the rule of ``lucid.functional.adagrad`` behind torch's stateful API."""

from __future__ import annotations

from typing import Any

from ..functional.adagrad import ADAGRAD, ADAGRAD_SIGNATURE
from ._declare import torch_optimizer
from ._engine import begin, packed_hyper
from .optimizer import Optimizer

__all__ = [
    "Adagrad",
]


@torch_optimizer(ADAGRAD_SIGNATURE, saved=("lr", "lr_decay", "weight_decay", "eps"))
class Adagrad(Optimizer):
    """torch.optim.Adagrad: ``lr_decay``, ``initial_accumulator_value``.

    As in torch, every parameter's state (``step`` and ``sum``) exists from
    construction, and the accumulator starts at the *constructor's*
    ``initial_accumulator_value`` (torch ignores a per-group value).
    """

    rule = ADAGRAD

    def constructed(self) -> None:
        """As torch, every parameter's state exists from construction."""
        states = {}
        for group in self.param_groups:
            start = packed_hyper(self.rule, self.state_options(group))
            _, flags = self.rule.split(group)
            for p in group["params"]:
                states[p] = begin(self.rule, flags, start, None, p.data)
        assert self.backend is not None
        self.backend.load(states)

    def state_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The options a parameter's state is made from: the group's, with the
        *constructor's* `initial_accumulator_value` (torch ignores a group's own).

        Args:
          group: the parameter's group.

        Returns:
          The group's options with `defaults`' `initial_accumulator_value`.
        """
        return {**group, "initial_accumulator_value": self.defaults["initial_accumulator_value"]}
