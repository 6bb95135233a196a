"""How an optimizer's step runs: the backend interface and the eager backend.

`Optimizer` owns ``param_groups`` and the torch API; a
*backend* runs the steps and keeps the per-parameter state (the rule's state
NamedTuples of `lucid.optim._state`). Two implement `Backend`:
`EagerBackend` (one jitted call per parameter group and device) and the
compiled backend of `lucid.optim.compile_optimizer` (one executable over
flat buffers). Both start states with `lucid.optim._state.begin`, so
compiling changes speed, never numbers.

A backend reads from its optimizer only ``rule``, ``param_groups`` and
``state_options(group)`` (the options a new state is made from).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from .._parameter import Parameter
from .._storage import check_grad
from .._trace import device_domain
from ..functional._rule import (
    Rule,
    apply_leaf,
    check_sparse_grad,
    compute_dtype,
    hyper_values,
    is_sparse,
)
from ._state import begin, packed_hyper


class Backend(Protocol):
    """Runs an optimizer's steps and holds its per-parameter state."""

    def step(self) -> None:
        """Update every parameter of the optimizer's groups that has a gradient.

        Validates everything first: on an error nothing has changed."""

    def states(self) -> dict[Parameter, Any]:
        """Each parameter's state (a NamedTuple of its rule), for parameters that have one."""

    def load(self, states: dict[Parameter, Any]) -> None:
        """Replace every state (after a checkpoint was validated)."""

    def groups_changed(self) -> None:
        """The optimizer's groups gained parameters (``add_param_group``)."""


class OptimizerView(Protocol):
    """What a backend reads from its optimizer."""

    rule: Rule
    param_groups: list[dict[str, Any]]

    def state_options(self, group: dict[str, Any]) -> dict[str, Any]: ...


@functools.cache
def _group_step(rule: Rule, flags: tuple[tuple[str, Any], ...], names: tuple[str, ...]) -> Callable:
    """One jitted function per (rule, static flags, hyper-parameter names): the rule over
    a list of parameters, the hyper-parameters arriving as one vector (one transfer)."""
    options = dict(flags)

    def run(vector, params, grads, states):
        hyper = {name: vector[i] for i, name in enumerate(names)}
        out = [apply_leaf(rule, options, hyper, p, g, s) for p, g, s in zip(params, grads, states)]
        return [o[0] for o in out], [o[1] for o in out]

    return jax.jit(run)


def start_hyper(optimizer: OptimizerView, group: dict[str, Any]) -> dict[str, float]:
    """The packed hyper-parameters a new state is made from (torch: the group's values
    at the first step, except where an optimizer says otherwise)."""
    return packed_hyper(optimizer.rule, optimizer.state_options(group))


class EagerBackend:
    """One jitted call of the rule per parameter group and device; state per parameter."""

    def __init__(self, optimizer: OptimizerView, states: dict[Parameter, Any] | None = None):
        self.optimizer = optimizer
        self._states: dict[Parameter, Any] = {} if states is None else states

    def states(self) -> dict[Parameter, Any]:
        return self._states

    def load(self, states: dict[Parameter, Any]) -> None:
        self._states.clear()  # in place: an own-step optimizer's defaultdict stays one
        self._states.update(states)

    def groups_changed(self) -> None:
        pass

    def step(self) -> None:
        rule = self.optimizer.rule
        work = []
        # [Step 1] plan every group: gradients checked, states begun (may raise)
        for group in self.optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                grad = p.grad
                check_grad(grad, p.shape, p.dtype)
                if is_sparse(grad):
                    check_sparse_grad(rule, group, grad, p.shape)
            names, values, flags = hyper_values(rule, group)
            start = (
                start_hyper(self.optimizer, group)
                if any(p not in self._states for p in params)
                else {}
            )
            states = [begin(rule, flags, start, self._states.get(p), p.data) for p in params]
            fn = _group_step(rule, tuple(sorted(flags.items())), names)
            # [Step 2] one call per device domain: arrays on different devices cannot meet
            batches: dict[Any, list[int]] = {}
            for i, p in enumerate(params):
                batches.setdefault(device_domain(p.data), []).append(i)
            for members in batches.values():
                wide = any(compute_dtype(params[i].dtype) == np.float64 for i in members)
                vector = np.asarray(values, np.float64 if wide else np.float32)
                work.append(
                    (fn, vector, [params[i] for i in members], [states[i] for i in members])
                )
        # [Step 3] run and write back
        for fn, vector, params, states in work:
            new_values, new_states = fn(
                vector, [p.data for p in params], [p.grad for p in params], states
            )
            for p, value, state in zip(params, new_values, new_states):
                p.data = value
                self._states[p] = state
