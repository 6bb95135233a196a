"""The eager backend: one jitted call of the rule per parameter group and device.

Each parameter keeps its own arrays and its state (the rule's NamedTuple,
begun by `lucid.optim._engine.state.begin`, the same function the compiled
backend begins states with, so compiling changes speed, never numbers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..._arrays import device_domain
from ..._parameter import Parameter
from ..._storage import check_grad
from ...functional._rule import Rule, apply_leaf, check_sparse_grad, compute_dtype, is_sparse
from .interface import Group
from .programs import PROGRAMS_KEPT
from .state import begin, packed_hyper


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def group_program(
    rule: Rule, flags: tuple[tuple[str, Any], ...], names: tuple[str, ...]
) -> Callable:
    """One jitted function per (rule, static flags, hyper-parameter names): the rule over
    a list of parameters, the hyper-parameters arriving as one vector (one transfer)."""
    options = dict(flags)

    def run(vector, params, grads, states):
        hyper = {name: vector[i] for i, name in enumerate(names)}
        out = [apply_leaf(rule, options, hyper, p, g, s) for p, g, s in zip(params, grads, states)]
        return [o[0] for o in out], [o[1] for o in out]

    return jax.jit(run)


class EagerBackend:
    """One jitted call of the rule per parameter group and device; state per parameter."""

    def __init__(self, rule: Rule, states: Mapping[Parameter, Any] | None = None) -> None:
        self.rule = rule
        self._states: dict[Parameter, Any] = dict(states or {})

    def states(self) -> dict[Parameter, Any]:
        return dict(self._states)

    def state_of(self, param: Parameter) -> Any:
        return self._states.get(param)

    def load(self, states: Mapping[Parameter, Any]) -> None:
        self._states = dict(states)

    def step(self, groups: Sequence[Group]) -> None:
        rule = self.rule
        work = []
        # [Step 1] plan every group: gradients checked, states begun (may raise)
        for group in groups:
            params = [p for p in group.params if p.grad is not None]
            if not params:
                continue
            for p in params:
                grad = p.grad
                check_grad(grad, p.shape, p.dtype)
                if is_sparse(grad):
                    check_sparse_grad(rule, group.options, grad, p.shape)
            names, values, flags = group.hyper
            fresh = any(p not in self._states for p in params)
            start = packed_hyper(rule, group.start) if fresh else {}
            states = [begin(rule, flags, start, self._states.get(p), p.data) for p in params]
            run = group_program(rule, tuple(sorted(flags.items())), names)
            # [Step 2] one call per device domain: arrays on different devices cannot meet
            batches: dict[Any, list[int]] = {}
            for i, p in enumerate(params):
                batches.setdefault(device_domain(p.data), []).append(i)
            for members in batches.values():
                wide = any(compute_dtype(params[i].dtype) == np.float64 for i in members)
                vector = np.asarray(values, np.float64 if wide else np.float32)
                work.append(
                    (run, vector, [params[i] for i in members], [states[i] for i in members])
                )
        # [Step 3] run and write back
        for run, vector, params, states in work:
            new_values, new_states = run(
                vector, [p.data for p in params], [p.grad for p in params], states
            )
            for p, value, state in zip(params, new_values, new_states):
                p.data = value
                self._states[p] = state
