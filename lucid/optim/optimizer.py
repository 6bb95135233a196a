"""``Optimizer``: torch.optim's stateful API over a functional :class:`~lucid.functional.Rule`.

The shell holds references (``param_groups``), hyper-parameters and per-parameter
state; the math is the rule's. A step gathers the parameters of a group that
have a gradient, feeds the group's hyper-parameters as runtime arrays to one
jitted call of the rule over all of them, and writes the results back into the
:class:`~lucid.Parameter` boxes and ``state``. Editing ``param_groups[i]['lr']``
(or any float hyper-parameter) changes the next step's inputs, never the
compiled program.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._parameter import Parameter
from ..functional._rule import Rule, apply_leaf, compute_dtype, hyper_values, init_leaf, pack

ParamsT = Iterable[Parameter] | Iterable[dict[str, Any]]


def options_of(frame_locals: Mapping[str, Any]) -> dict[str, Any]:
    """A constructor's keyword options: its locals minus ``self``/``params``."""
    return {k: v for k, v in frame_locals.items() if k not in ("self", "params", "__class__")}


def to_array(value: Any) -> Any:
    """A checkpoint leaf as something jax/numpy can read (torch tensors through numpy).

    The copy matters: on the CPU a jax array made from a NumPy view can share
    its memory, and torch may keep updating that tensor in place."""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        return value.detach().cpu().numpy().copy()
    return value


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


class Optimizer:
    """Base class with torch.optim.Optimizer's API.

    Subclasses declare ``rule`` (the functional rule they run) and a
    constructor with torch's signature that passes its options as ``defaults``.
    """

    rule: ClassVar[Rule]

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        if isinstance(params, Parameter | jax.Array | np.ndarray):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of "
                f"Parameters or dicts, but got {type(params).__name__}"
            )
        self.rule.validate(defaults)
        self.defaults = dict(defaults)
        self._state: dict[Parameter, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        self._owner: Any = None  # the compiled step that owns this optimizer, once compiled
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

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
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(
                    "optimizer can only optimize lucid.Parameter objects, "
                    f"but one of the params is {type(p).__name__}"
                )
            if not jnp.issubdtype(p.dtype, jnp.floating):
                raise ValueError(
                    f"{type(self).__name__} can only optimize floating-point parameters, "
                    f"but one has dtype {p.dtype}"
                )
        if len(set(params)) != len(params):
            raise ValueError("a parameter group lists the same parameter twice")
        taken = {p for group in self.param_groups for p in group["params"]}
        if not taken.isdisjoint(params):
            raise ValueError("some parameters appear in more than one parameter group")
        group = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        self.rule.validate(group)
        group["params"] = params
        self.param_groups.append(group)
        if self._owner is not None:
            self._owner._structure_changed()

    @property
    def state(self) -> dict[Parameter, dict[str, Any]]:
        """Per-parameter state with torch's names (a snapshot once compiled)."""
        return self._owner.state if self._owner is not None else self._state

    @state.setter
    def state(self, value: dict[Parameter, dict[str, Any]]) -> None:
        if self._owner is not None:
            raise AttributeError("a compiled optimizer's state is set through load_state_dict")
        self._state = value

    def _params(self) -> list[Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    # ------------------------------------------------------------------- step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient (to ``None`` by default, as torch)."""
        if self._owner is not None:
            return self._owner.zero_grad(set_to_none)
        for p in self._params():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad = jnp.zeros_like(p.grad)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns ``closure()``'s loss."""
        if self._owner is not None:
            return self._owner.step(closure)
        loss = closure() if closure is not None else None
        plans = [self._plan(group) for group in self.param_groups]  # validate all, then update
        for plan in plans:
            if plan is not None:
                self._run(*plan)
        return loss

    def _hyper_dtype(self, params: list[Parameter]) -> np.dtype:
        """float64 when any parameter is float64 (hyper-parameters in its precision)."""
        return np.dtype(np.float64 if any(p.dtype == np.float64 for p in params) else np.float32)

    def _initial_state(self, group: Mapping[str, Any], p: Parameter) -> Any:
        """The state torch creates for ``p`` at its first step."""
        hyper, flags = self.rule.split(group)
        return init_leaf(self.rule, flags, pack(self.rule, hyper), p.data, lazy=True)

    def _leaf_state(self, group: Mapping[str, Any], p: Parameter) -> Any:
        stored = self._state.get(p)
        if not stored:
            return self._initial_state(group, p)
        return self.rule.state(**{f: stored.get(f) for f in self.rule.state._fields})

    def _plan(self, group: dict[str, Any]) -> tuple | None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return None
        for p in params:
            grad = p.grad
            if tuple(grad.shape) != p.shape:
                raise ValueError(
                    f"a gradient of shape {tuple(grad.shape)} was given for a parameter "
                    f"of shape {p.shape}"
                )
            if grad.dtype != p.dtype:
                raise ValueError(
                    f"a gradient of dtype {grad.dtype} was given for a parameter of dtype {p.dtype}"
                )
        names, values, flags = hyper_values(self.rule, group)
        vector = np.asarray(values, self._hyper_dtype(params))
        fn = _group_step(self.rule, tuple(sorted(flags.items())), names)
        states = [self._leaf_state(group, p) for p in params]
        return fn, vector, params, states

    def _run(self, fn: Callable, hyper: np.ndarray, params: list[Parameter], states: list) -> None:
        new_params, new_states = fn(
            hyper, [p.data for p in params], [p.grad for p in params], states
        )
        for p, data, state in zip(params, new_params, new_states):
            p.data = data
            self._state[p] = self._state_dict_of(state)

    @staticmethod
    def _state_dict_of(state: Any) -> dict[str, Any]:
        return {f: v for f, v in zip(state._fields, state) if v is not None}

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """torch's format: ``{'state': {index: {name: array}}, 'param_groups': [...]}``.

        A snapshot: fresh dicts and fresh array copies, so nothing done to the
        result (even torch updating a tensor made from it in place, which
        shares its memory on the CPU) reaches the optimizer.
        """
        if self._owner is not None:
            return self._owner.state_dict()
        return self._eager_state_dict()

    def _eager_state_dict(self) -> dict[str, Any]:
        return self._state_dict_from(self._state)

    def _state_dict_from(self, states: Mapping[Parameter, Mapping[str, Any]]) -> dict[str, Any]:
        """torch's state_dict format for ``states`` (per-parameter dicts of torch's names)."""
        index: dict[Parameter, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(p, len(index)) for p in group["params"]]
            groups.append(packed)
        state = {
            index[p]: self._export_state(_copy_arrays(s))
            for p, s in states.items()
            if p in index and s
        }
        return {"state": state, "param_groups": groups}

    def _export_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Per-class hook: how a parameter's state appears in a state_dict."""
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load lucid's or torch's state_dict; validates everything before changing anything."""
        if self._owner is not None:
            return self._owner.load_state_dict(state_dict)
        groups, state = self._validated(state_dict)
        self._set_groups(groups)
        self._state = state
        return None

    def _set_groups(self, groups: list[dict[str, Any]]) -> None:
        """Replace every group's options in place (the dicts keep their identity)."""
        for group, new in zip(self.param_groups, groups):
            group.clear()
            group.update(new)

    def _validated(
        self, state_dict: Mapping[str, Any], import_state: Callable | None = None
    ) -> tuple[list[dict], dict]:
        """The groups and state a state_dict would produce; raises ValueError on any mismatch.

        ``import_state(group, p, saved, key)`` checks one parameter's entry
        (default: this class's ``_import_state``).
        """
        import_state = import_state or self._import_state
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
            self.rule.validate(merged)
            merged["params"] = group["params"]
            new_groups.append(merged)
        group_of = {p: g for g in new_groups for p in g["params"]}
        new_state: dict[Parameter, dict[str, Any]] = {}
        for key, saved_state in dict(state_dict["state"]).items():
            if key not in id_map:
                raise ValueError(
                    f"the state_dict holds state for parameter {key!r}, which no group lists"
                )
            p = id_map[key]
            new_state[p] = import_state(group_of[p], p, saved_state, key)
        return new_groups, new_state

    def _import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> dict:
        """One parameter's saved state, checked against what this optimizer keeps for it."""
        if not isinstance(saved, Mapping):
            raise ValueError(
                f"state of parameter {key!r} must be a dict, got {type(saved).__name__}"
            )
        if not saved:
            return {}
        fields = self.rule.state._fields
        unknown = set(saved) - set(fields)
        if unknown:
            raise ValueError(
                f"state of parameter {key!r} has unknown entries {sorted(unknown)} "
                f"for {type(self).__name__} (expected some of {list(fields)})"
            )
        expected = self._state_dict_of(self._initial_state(group, p))
        missing = set(expected) - set(saved)
        if missing:
            raise ValueError(f"state of parameter {key!r} is missing {sorted(missing)}")
        state = {}
        for name, value in saved.items():
            array = np.asarray(to_array(value))
            if name in self.rule.scalar_state:
                if array.shape != ():
                    raise ValueError(f"state {name!r} of parameter {key!r} must be a scalar")
                dtype = np.float32 if name == "step" else compute_dtype(p.dtype)
            else:
                if array.shape != p.shape:
                    raise ValueError(
                        f"state {name!r} of parameter {key!r} has shape {array.shape}, "
                        f"but the parameter has shape {p.shape}"
                    )
                dtype = p.dtype
            if not (
                np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
            ):
                raise ValueError(f"state {name!r} of parameter {key!r} has dtype {array.dtype}")
            state[name] = jnp.asarray(array, dtype)
        return state

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k != "params"]
        return "\n".join(lines) + "\n)"


def _copy_arrays(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: jnp.array(v, copy=True) if isinstance(v, jax.Array) else v for k, v in state.items()}


def _to_python(value: Any) -> Any:
    """0-d arrays from a checkpoint's groups (a torch lr tensor) back to Python numbers."""
    if isinstance(value, np.ndarray) and value.shape == ():
        return value.item()
    return value
