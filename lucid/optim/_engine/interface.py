"""The one interface between an `Optimizer` and the engine that runs its steps.

The optimizer describes its groups to the engine at every call (`Group`), so the
engine holds no reference to the optimizer and never calls back into it: an
edit of ``param_groups`` (a parameter appended, removed, replaced, a group
deleted or reordered, a new option) reaches the next step because the next
step is *given* the groups as they are then. A `Backend` runs the steps and
keeps the per-parameter state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from ..._parameter import Parameter


class Hyper(NamedTuple):
    """A group's hyper-parameters as one step reads them (`hyper_values`): the packed
    names, their host values in that order, and the static flags."""

    names: tuple[str, ...]
    values: list[float]
    flags: dict[str, Any]


class Group(NamedTuple):
    """One parameter group as the engine sees it for one call.

    Attributes:
      params: the group's Parameters, in order (the group's own list).
      options: the group's dict (torch's options), for the checks of sparse
        gradients.
      hyper: the hyper-parameters, read once for this step.
      start: the options a parameter's *new* state is made from (the group's
        own, except where an optimizer says otherwise: Adagrad's
        ``initial_accumulator_value`` is the constructor's).
    """

    params: Sequence[Parameter]
    options: Mapping[str, Any]
    hyper: Hyper
    start: Mapping[str, Any]


class Backend(Protocol):
    """Runs an optimizer's steps and keeps its per-parameter state."""

    def step(self, groups: Sequence[Group]) -> None:
        """Update every parameter of ``groups`` that has a gradient.

        Validates everything first: on an error nothing has changed."""

    def states(self) -> dict[Parameter, Any]:
        """A snapshot ``{Parameter: state}`` of every parameter that has state (the
        rule's NamedTuple), including parameters no group lists any more, as torch
        keeps them. The dict is new; the arrays are the current ones (immutable)."""

    def state_of(self, param: Parameter) -> Any:
        """One parameter's state (the rule's NamedTuple), or ``None`` without state."""

    def load(self, states: Mapping[Parameter, Any]) -> None:
        """Replace every state (after a checkpoint was validated)."""

    def release(self) -> None:
        """Give every parameter whose value the backend holds (in a store of its own)
        its value and gradient back as arrays of its own, keeping every state; before
        another backend takes the steps. A later step lays the values out again."""


class FusingBackend(Backend, Protocol):
    """A backend that can also run forward, backward and update as one program."""

    def fused(
        self,
        groups: Sequence[Group],
        loss_fn: Callable[..., Any],
        call: tuple[Any, tuple, dict],
        grad_transform: Any,
        transform_state: Any,
        has_aux: bool = False,
        accumulate: int | None = None,
    ) -> tuple[Any, Any]:
        """One training step of ``loss_fn`` over ``call = (tree, args, kwargs)`` (over
        ``accumulate`` micro-batches, when given); returns the loss (``(loss, aux)``
        with ``has_aux``) and ``grad_transform``'s new state."""
