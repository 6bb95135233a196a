"""The eager backend: jitted calls of the rule per parameter group and device.

Each parameter keeps its own arrays and its state (the rule's NamedTuple,
begun by `lucid.optim._engine.state.begin`, the same function the compiled
backend begins states with, so compiling changes speed, never numbers).

A step costs what its host code costs when the arrays are small, so the work
done per parameter is kept to what must be done at every step: read the value
and the gradient, write the new value and state back. Everything that depends
only on the step's *structure* (which parameters, which of them have
gradients, their shapes, dtypes and devices, the static flags, the states'
structure) is planned once (`_Plan`) and checked again, cheaply, at the next
step: the same parameters in the same groups with gradients in the same
places, the same flags, no state loaded since; the executables compiled for
the last step (``jax.jit(...).lower(...).compile()``) then check the shapes,
dtypes and placements of every array as they are called, before anything
runs. Any difference falls back to the full, checking path, which gives
torch's errors and plans again. On the CPU a group's small parameters run
in calls small enough for XLA to run them on the calling thread
(`CHEAP_FLOPS`), each parameter's update the same program as in one call for
the whole group, so the numbers are the same bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..._arrays import device_domain
from ..._parameter import Parameter
from ..._storage import check_grad
from ...functional._rule import Rule, apply_leaves, check_sparse_grad, compute_dtype, is_sparse
from .interface import Group
from .programs import PROGRAMS_KEPT, Placed
from .state import begin, packed_hyper

# XLA:CPU runs a program of fewer floating-point operations than this on the calling
# thread and hands a larger one to its thread pool, whose wake-up costs more than the
# update of a small parameter (on a busy machine, much more): on the CPU, a group's
# small parameters run in calls under this size, its large ones in one call
CHEAP_FLOPS = 1000.0


def _on_cpu(array: Any) -> bool:
    """Whether ``array`` lives on one of the host's CPU devices (an array spread over
    several devices keeps one call: splitting it would multiply its collectives)."""
    try:
        devices = array.sharding.device_set
    except AttributeError:  # not a jax array
        return False
    return len(devices) == 1 and next(iter(devices)).platform == "cpu"


def _flops_per_element(program: Callable, vector: Any, value: Any, grad: Any, state: Any) -> float:
    """The update's floating-point operations per element, as XLA counts them for one
    parameter (0 where XLA gives no count: then no call is split)."""
    try:
        cost = program.lower(vector, [value], [grad], [state]).cost_analysis()
        if isinstance(cost, list | tuple):
            cost = cost[0]
        return float(cost.get("flops", 0.0)) / max(int(np.prod(value.shape)), 1)
    except Exception:  # an estimate only; without one, one call
        return 0.0


def _calls(members: list[int], sizes: list[int], per_element: float) -> list[list[int]]:
    """``members`` in calls: the small ones in calls of fewer than `CHEAP_FLOPS`
    operations, the large ones in one call."""
    if per_element <= 0.0:
        return [members]
    calls, large, current, total = [], [], [], 0.0
    for i in members:
        flops = per_element * sizes[i]
        if flops >= CHEAP_FLOPS:
            large.append(i)
            continue
        if current and total + flops >= CHEAP_FLOPS:
            calls.append(current)
            current, total = [], 0.0
        current.append(i)
        total += flops
    return [c for c in (*calls, current, large) if c]


@functools.lru_cache(maxsize=PROGRAMS_KEPT)
def group_program(
    rule: Rule, flags: tuple[tuple[str, Any], ...], names: tuple[str, ...]
) -> Callable:
    """One jitted function per (rule, static flags, hyper-parameter names): the rule over
    a list of parameters, the hyper-parameters arriving as one vector (one transfer);
    for a ``batched`` rule, same-shaped parameters placed alike in one batched call."""
    options = dict(flags)

    def run(vector, params, grads, states, places=None):
        hyper = {name: vector[i] for i, name in enumerate(names)}
        n = len(params)
        return apply_leaves(rule, [options] * n, [hyper] * n, params, grads, states, places)

    return Placed(run, 1)


class _Batch:
    """One call of a group's program: the group's parameters (with gradients) on one
    device domain, and the executable compiled for their last step (``None`` until
    that step ran)."""

    __slots__ = ("dtype", "members", "params", "run")

    def __init__(self, members: list[int], params: list[Parameter], dtype: Any) -> None:
        self.members = members  # positions in the group's parameter list
        self.params = params
        self.dtype = dtype  # of the hyper-parameter vector
        self.run: Any = None


class _Plan:
    """What one group's last step ran, reusable while the step's structure is the same:
    the group's parameters, which had gradients, the names and flags, the calls."""

    __slots__ = ("batches", "flags", "has_grad", "names", "params")

    def __init__(
        self,
        params: list[Parameter],
        has_grad: list[bool],
        names: tuple[str, ...],
        flags: dict[str, Any],
        batches: list[_Batch],
    ) -> None:
        self.params = params
        self.has_grad = has_grad
        self.names = names
        self.flags = flags
        self.batches = batches


class EagerBackend:
    """Jitted calls of the rule per parameter group and device; state per parameter."""

    def __init__(self, rule: Rule, states: Mapping[Parameter, Any] | None = None) -> None:
        self.rule = rule
        self._states: dict[Parameter, Any] = dict(states or {})
        # one plan per group position, as the last step ran it; None: plan again
        self._plans: list[_Plan] | None = None

    def states(self) -> dict[Parameter, Any]:
        return dict(self._states)

    def state_of(self, param: Parameter) -> Any:
        return self._states.get(param)

    def load(self, states: Mapping[Parameter, Any]) -> None:
        self._states = dict(states)
        self._plans = None  # new states may have another structure: plan again

    def step(self, groups: Sequence[Group]) -> None:
        work = self._replan(groups)
        if work is not None:
            try:
                # the executables check every array's shape, dtype and placement
                # before running; nothing is written until every call has returned
                results = [
                    run(vector, [p.data for p in params], grads, states)
                    for run, vector, params, grads, states in work
                ]
            except (TypeError, ValueError):  # not the arrays they were compiled for
                work = None
        if work is None:
            self._plans = None
            work, plans = self._plan(groups)
            results = [
                program(vector, [p.data for p in params], grads, states)
                for program, vector, params, grads, states in work
            ]
            self._plans = self._compile(plans, work)
        # write back
        store = self._states
        for (_, _, params, _, _), (new_values, new_states) in zip(work, results):
            for p, value in zip(params, new_values):
                storage, index = p.location  # a jax array already: no conversion
                storage.set_value(index, value)
            store.update(zip(params, new_states))

    def _replan(self, groups: Sequence[Group]) -> list[tuple] | None:
        """The calls of a step whose structure is the last step's (``None`` if it is not
        certainly so): per batch, the executable, the hyper-parameter vector, the
        parameters, their gradients and states."""
        plans = self._plans
        if plans is None or len(plans) != len(groups):
            return None
        store = self._states
        work = []
        for group, plan in zip(groups, plans):
            names, values, flags = group.hyper
            params = group.params
            if not isinstance(params, list):
                params = list(params)
            if params != plan.params or names != plan.names or flags != plan.flags:
                return None
            grads = [p.grad for p in plan.params]
            if [g is not None for g in grads] != plan.has_grad:
                return None
            for batch in plan.batches:
                work.append(
                    (
                        batch.run,
                        np.asarray(values, batch.dtype),
                        batch.params,
                        [grads[i] for i in batch.members],
                        [store[p] for p in batch.params],
                    )
                )
        return work

    def _plan(self, groups: Sequence[Group]) -> tuple[list[tuple], list[_Plan | None]]:
        """The checking path: every gradient checked, states begun (may raise, before
        anything moved), the calls planned; the plans are ``None`` where a step must
        always take this path (sparse gradients: their indices are checked at every
        step)."""
        rule = self.rule
        work = []
        plans = []
        for group in groups:
            all_params = list(group.params)
            grads = [p.grad for p in all_params]
            has_grad = [g is not None for g in grads]
            names, values, flags = group.hyper
            sparse = False
            for p, grad in zip(all_params, grads):
                if grad is None:
                    continue
                check_grad(grad, p.shape, p.dtype)
                if is_sparse(grad):
                    sparse = True
                    check_sparse_grad(rule, group.options, grad, p.shape)
            positions = [i for i, has in enumerate(has_grad) if has]
            params = [all_params[i] for i in positions]
            batches_: list[_Batch] = []
            plans.append(None if sparse else _Plan(all_params, has_grad, names, flags, batches_))
            if not params:
                continue
            fresh = any(p not in self._states for p in params)
            start = packed_hyper(rule, group.start) if fresh else {}
            states = [begin(rule, flags, start, self._states.get(p), p.data) for p in params]
            program = group_program(rule, tuple(sorted(flags.items())), names)
            # one call per device domain: arrays on different devices cannot meet
            domains: dict[Any, list[int]] = {}
            for i, p in enumerate(params):
                domains.setdefault(device_domain(p.data), []).append(i)
            for domain_members in domains.values():
                wide = any(compute_dtype(params[i].dtype) == np.float64 for i in domain_members)
                dtype = np.float64 if wide else np.float32
                vector = np.asarray(values, dtype)
                calls = [domain_members]
                first = domain_members[0]
                if _on_cpu(params[first].data):
                    per_element = _flops_per_element(
                        program, vector, params[first].data, grads[positions[first]], states[first]
                    )
                    sizes = [p.size for p in params]
                    calls = _calls(domain_members, sizes, per_element)
                for members in calls:
                    batch = _Batch(
                        [positions[i] for i in members], [params[i] for i in members], dtype
                    )
                    batches_.append(batch)
                    work.append(
                        (
                            program,
                            np.asarray(values, dtype),
                            batch.params,
                            [grads[positions[i]] for i in members],
                            [states[i] for i in members],
                        )
                    )
        return work, plans

    def _compile(self, plans: list[_Plan | None], work: list[tuple]) -> list[_Plan] | None:
        """The plans for the next step, their executables the programs this step ran,
        compiled for its arrays (jax's caches make this a look-up); ``None`` where a
        group must take the checking path at every step."""
        if any(plan is None for plan in plans):
            return None
        batches = [batch for plan in plans for batch in plan.batches]  # type: ignore[union-attr]
        for batch, (program, vector, params, grads, states) in zip(batches, work):
            batch.run = program.lower(vector, [p.data for p in params], grads, states).compile()
        return plans  # type: ignore[return-value]
