"""``Optimizer``: torch.optim's stateful API over a functional :class:`~lucid.functional.Rule`.

The optimizer owns ``param_groups`` and the API; running a step and keeping
the per-parameter state is its *backend*'s job (:mod:`lucid.optim._backend`):
eager by default, compiled after :func:`lucid.optim.compile_optimizer`. Editing
``param_groups[i]['lr']`` (or any float hyper-parameter) changes the next
step's inputs, never the compiled program.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._parameter import Parameter
from .._storage import by_storage
from ..functional._rule import Rule
from ..functional._signature import Signature
from ._backend import Backend, EagerBackend
from ._hooks import (
    RemovableHandle,
    hooked_step,
    register,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from ._state import copy_arrays, export, load_entry, to_array

ParamsT = Iterable[Parameter] | Iterable[dict[str, Any]]

__all__ = [
    "Optimizer",
    "ParamsT",
    "RemovableHandle",
    "register_optimizer_step_post_hook",
    "register_optimizer_step_pre_hook",
    "to_array",
]


class Optimizer:
    """Base class with torch.optim.Optimizer's API.

    lucid's optimizers declare ``rule`` (the functional rule they run) and a
    constructor with torch's signature that passes its options as ``defaults``.
    Your own optimizer is written as in torch: pass ``params`` and ``defaults``
    to this constructor and write ``step``, keeping per-parameter state in
    ``self.state[p]`` (a ``defaultdict(dict)``, as torch's); schedulers,
    hooks, ``zero_grad`` and ``state_dict`` then work on it.

    Args:
      params: Parameters, ``(name, Parameter)`` pairs, or dicts of param groups
        (``{"params": [...], "lr": ...}``).
      defaults: the options a group takes when it does not set them.

    Raises:
      TypeError: ``params`` is a single Parameter or array, or holds something
        that is not a Parameter.
      ValueError: an empty parameter list, a parameter in two groups, invalid options.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> class SignSGD(lucid.optim.Optimizer):
      ...     def __init__(self, params, lr=0.01):
      ...         super().__init__(params, dict(lr=lr))
      ...     def step(self, closure=None):
      ...         for group in self.param_groups:
      ...             for p in group["params"]:
      ...                 if p.grad is not None:
      ...                     p.data = p.data - group["lr"] * jnp.sign(p.grad)
      ...                     self.state[p]["steps"] = self.state[p].get("steps", 0) + 1
      >>> w = lucid.Parameter(jnp.array([1.0, -1.0]))
      >>> opt = SignSGD([w], lr=0.5)
      >>> w.grad = jnp.array([2.0, -3.0])
      >>> opt.step()
      >>> w.data.tolist(), opt.state_dict()["state"]
      ([0.5, -0.5], {0: {'steps': 1}})
    """

    rule: ClassVar[Rule | None] = None  # None: an optimizer with its own step
    torch_signature: ClassVar[Signature | None] = None  # set by @torch_optimizer

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        if isinstance(params, Parameter | jax.Array | np.ndarray):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of "
                f"Parameters or dicts, but got {type(params).__name__}"
            )
        self._validate(defaults)
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self._step_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._step_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._state_dict_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._state_dict_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._load_state_dict_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._load_state_dict_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        cls = type(self)
        cls.step = hooked_step(cls.step)  # type: ignore[method-assign]  # torch patches too
        self._backend: Backend = (
            EagerBackend(self) if self.rule is not None else EagerBackend(self, defaultdict(dict))
        )
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # --------------------------------------------------------------- backend
    @property
    def backend(self) -> Backend:
        """What runs the steps and keeps the state (eager, or compiled)."""
        return self._backend

    def use_backend(self, make: Callable[[Optimizer, dict[Parameter, Any]], Backend]) -> None:
        """Hand the steps and the state to ``make(self, states)``'s backend."""
        self._backend = make(self, self._backend.states())

    def state_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The options a parameter's new state is made from (torch: its group's)."""
        return group

    # ----------------------------------------------------------------- groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; missing options take the constructor's ``defaults``."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("param_group must have a 'params' entry")
        params = param_group["params"]
        if isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        if names:
            if len(names) != len(params):
                raise ValueError(
                    "all optimizer params should be with/without names. Some param names are "
                    "missing"
                )
            params = [p[1] for p in params]
        for group in self.param_groups:
            if bool(names) != ("param_names" in group):
                raise ValueError(
                    "all optimizer param groups should be with/without names. cannot add param "
                    f"group {'with' if names else 'without'} names to the optimizer"
                )
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(
                    "optimizer can only optimize lucid.Parameter objects, "
                    f"but one of the params is {type(p).__name__}"
                )
            if not jnp.issubdtype(p.dtype, jnp.inexact):
                raise ValueError(
                    f"{type(self).__name__} can only optimize floating-point (or complex) "
                    f"parameters, but one has dtype {p.dtype}"
                )
        if len(set(params)) != len(params):
            raise ValueError("a parameter group lists the same parameter twice")
        taken = {p for group in self.param_groups for p in group["params"]}
        if not taken.isdisjoint(params):
            raise ValueError("some parameters appear in more than one parameter group")
        group = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        if names:
            group["param_names"] = names
        self._validate(group)
        group["params"] = params
        self.param_groups.append(group)
        self._backend.groups_changed()

    @property
    def state(self) -> dict[Parameter, dict[str, Any]]:
        """Per-parameter state with torch's names. For lucid's optimizers a snapshot
        (assigning into it changes nothing; ``load_state_dict`` does); for your own
        optimizer the live ``defaultdict(dict)`` your ``step`` writes, as in torch."""
        states = self._backend.states()
        if self.rule is None:
            return states
        shown = {p: self.export_state(s) for p, s in states.items()}
        return {p: s for p, s in shown.items() if s}

    def _validate(self, options: Mapping[str, Any]) -> None:
        if self.rule is not None:
            self.rule.check(options)

    def _params(self) -> list[Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    # ------------------------------------------------------------------- step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient (to ``None`` by default, as torch)."""
        for storage, indices in by_storage(p.location for p in self._params()):
            storage.clear_grads(indices, set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns ``closure()``'s loss.

        Raises:
          NotImplementedError: an optimizer without a ``rule`` must write its own step.
          KeyError: torch's error when an option that owns a state entry was turned
            on after the state was made (nothing has moved).
        """
        if self.rule is None:
            raise NotImplementedError(f"{type(self).__name__} must implement step()")
        loss = closure() if closure is not None else None
        for group in self.param_groups:  # values edited by hand: checked before anything moves
            self.rule.check_step(group)
        self._backend.step()
        return loss

    # ----------------------------------------------------------------- hooks
    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """Call ``hook(optimizer, args, kwargs) -> None | (new_args, new_kwargs)`` before
        each step (after the global pre-hooks); a returned pair replaces the arguments."""
        return register(self._step_pre_hooks, hook)

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """Call ``hook(optimizer, args, kwargs)`` after each step (before the global ones)."""
        return register(self._step_post_hooks, hook)

    def register_state_dict_pre_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Call ``hook(optimizer)`` before ``state_dict`` builds its result."""
        return register(self._state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Call ``hook(optimizer, state_dict) -> state_dict | None`` on ``state_dict``'s
        result; a returned dict replaces it."""
        return register(self._state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Call ``hook(optimizer, state_dict) -> state_dict | None`` on a shallow copy of
        what ``load_state_dict`` was given; a returned dict is loaded instead."""
        return register(self._load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Call ``hook(optimizer)`` after ``load_state_dict`` has loaded."""
        return register(self._load_state_dict_post_hooks, hook, prepend)

    # ------------------------------------------------------------- checkpoints
    def export_state(self, state: Any) -> dict[str, Any]:
        """How one parameter's state appears in ``state`` and ``state_dict`` (torch's names)."""
        if self.rule is None:
            return dict(state)
        return export(self.rule, state)

    def state_dict(self) -> dict[str, Any]:
        """torch's format: ``{'state': {index: {name: array}}, 'param_groups': [...]}``.

        A snapshot: fresh dicts and fresh array copies, so nothing done to the
        result (even torch updating a tensor made from it in place, which
        shares its memory on the CPU) reaches the optimizer.
        """
        for pre_hook in list(self._state_dict_pre_hooks.values()):
            pre_hook(self)
        index: dict[Parameter, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(p, len(index)) for p in group["params"]]
            groups.append(packed)
        state = {}
        for p, s in self._backend.states().items():
            shown = self.export_state(s)
            if p in index and shown:
                state[index[p]] = copy_arrays(shown)
        state_dict = {"state": dict(sorted(state.items())), "param_groups": groups}
        for post_hook in list(self._state_dict_post_hooks.values()):
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load lucid's or torch's state_dict; validates everything before changing anything.

        Raises:
          ValueError: the state_dict does not fit this optimizer (nothing changed).
        """
        if isinstance(state_dict, Mapping):
            state_dict = dict(state_dict)  # shallow copy, as torch's (hooks may edit it)
        for pre_hook in list(self._load_state_dict_pre_hooks.values()):
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups, states = self._validated(state_dict)
        for group, new in zip(self.param_groups, groups):
            group.clear()
            group.update(new)
        self.groups_loaded()
        self._backend.load(states)
        for post_hook in list(self._load_state_dict_post_hooks.values()):
            post_hook(self)

    def _validated(self, state_dict: Mapping[str, Any]) -> tuple[list[dict], dict]:
        """The groups and states a state_dict would produce; raises ValueError on any mismatch."""
        if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError("a state_dict must be a dict with 'state' and 'param_groups' entries")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for group, saved in zip(self.param_groups, saved_groups):
            if "params" not in saved or len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
        id_map: dict[Any, Parameter] = {}
        new_groups = []
        for group, saved in zip(self.param_groups, saved_groups):
            id_map.update(zip(saved["params"], group["params"]))
            options = {k: _to_python(to_array(v)) for k, v in saved.items() if k != "params"}
            merged = {**self.defaults, **options}
            if "param_names" in group and "param_names" not in merged:
                merged["param_names"] = group["param_names"]  # torch keeps the current names
            self._validate(merged)
            merged["params"] = group["params"]
            new_groups.append(merged)
        group_of = {p: g for g in new_groups for p in g["params"]}
        new_states: dict[Parameter, Any] = {}
        for key, saved_state in dict(state_dict["state"]).items():
            if key not in id_map:
                raise ValueError(
                    f"the state_dict holds state for parameter {key!r}, which no group lists"
                )
            p = id_map[key]
            state = self.import_state(group_of[p], p, saved_state, key)
            if state is not None:
                new_states[p] = state
        return new_groups, new_states

    def constructed(self) -> None:
        """Per-class checks and state at the end of a lucid optimizer's construction
        (Muon's 2-D check, Adagrad's accumulators), as torch makes them in ``__init__``."""

    def groups_loaded(self) -> None:
        """Per-class fix-ups of the groups right after a load (torch's ``__setstate__``)."""

    def import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> Any:
        """One parameter's saved entry as its state (``None`` for an empty entry).

        Raises:
          ValueError: the entry does not fit this optimizer or this parameter.
        """
        if self.rule is None:  # your own optimizer: entries as they were saved, arrays read
            if not isinstance(saved, Mapping):
                raise ValueError(f"state of parameter {key!r} must be a dict")
            return {k: _to_jax(to_array(v)) for k, v in saved.items()} or None
        return load_entry(self.rule, group, p.shape, p.dtype, saved, key)

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k != "params"]
        return "\n".join(lines) + "\n)"


def _to_jax(value: Any) -> Any:
    return jnp.asarray(value) if isinstance(value, np.ndarray) else value


def _to_python(value: Any) -> Any:
    """0-d arrays from a checkpoint's groups (a torch lr tensor) back to Python numbers."""
    if isinstance(value, np.ndarray) and value.shape == ():
        return value.item()
    return value
