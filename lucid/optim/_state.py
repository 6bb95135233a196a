"""The one state model, shared by the eager and the compiled step.

A parameter's optimizer state is its rule's state NamedTuple (``AdamState``...),
whose fields are torch's state names plus, for a few rules, fields torch does
not show (:attr:`Rule.hidden`). torch's rules for its life, written once here:

* it is created at the first step in which the parameter has a gradient, from
  its group's hyper-parameters *at that moment* (:func:`begin`);
* an option that owns a field, turned on later, starts that field where torch
  does and raises torch's ``KeyError`` where torch does; turned off, it leaves
  the field untouched (:func:`begin`, through ``resume_leaf``);
* a state_dict shows the fields torch shows (:func:`export`), and a saved entry
  is checked and converted back by :func:`load_entry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..functional._rule import Rule, compute_dtype, init_leaf, resume_leaf

Array = jax.Array


def begin(
    rule: Rule, flags: Mapping[str, Any], hyper: Mapping[str, float], state: Any, value: Array
) -> Any:
    """The state a step starts from: ``state`` resumed under ``flags``, or, for a
    parameter without state (``None``), a new one from the current ``hyper``.

    ``value`` is the parameter (or, for an elementwise rule, a flat buffer of
    parameters sharing one state structure).

    Raises:
      KeyError: an option that owns a state field was turned on after the state
        was created, for a rule where torch raises.
    """
    if state is None:
        return init_leaf(rule, flags, hyper, value)
    return resume_leaf(rule, flags, state, value)


def export(rule: Rule, state: Any) -> dict[str, Any]:
    """One parameter's state as torch's state_dict shows it (torch's names, no hidden
    fields, no fields that are off)."""
    return {
        name: value
        for name, value in zip(state._fields, state)
        if value is not None and name not in rule.hidden
    }


def load_entry(
    rule: Rule, options: Mapping[str, Any], shape: tuple, dtype: Any, saved: Any, key: Any
) -> Any:
    """A saved state_dict entry (torch's or lucid's) as the rule's state, or ``None``
    for an empty entry. Checks names, shapes and dtypes; tensors are converted.

    Raises:
      ValueError: the entry does not fit this rule or this parameter.
    """
    if not isinstance(saved, Mapping):
        raise ValueError(f"state of parameter {key!r} must be a dict, got {type(saved).__name__}")
    if not saved:
        return None
    fields = rule.state._fields
    shown = [f for f in fields if f not in rule.hidden]
    unknown = set(saved) - set(shown)
    if unknown:
        raise ValueError(
            f"state of parameter {key!r} has unknown entries {sorted(unknown)} "
            f"for {rule.name} (expected some of {shown})"
        )
    _, flags = rule.split(options)
    probe = jax.eval_shape(
        lambda: init_leaf(rule, flags, _zero_hyper(rule, options), jnp.zeros(shape, dtype))
    )
    required = {
        name
        for name, value in zip(probe._fields, probe)
        if value is not None and name not in rule.hidden
    }
    missing = required - set(saved)
    if missing:
        raise ValueError(f"state of parameter {key!r} is missing {sorted(missing)}")
    values: dict[str, Any] = {name: None for name in fields}
    for name, default in rule.hidden.items():
        values[name] = jnp.asarray(default, np.float32)
    for name, value in saved.items():
        array = np.asarray(to_array(value))
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"state {name!r} of parameter {key!r} has dtype {array.dtype}")
        if name in rule.scalar_state:
            if array.shape != ():
                raise ValueError(f"state {name!r} of parameter {key!r} must be a scalar")
            target = np.float32 if name == "step" else compute_dtype(dtype)
        else:
            # the shape the rule gives this field (the parameter's for elementwise rules;
            # Adafactor's row_var/col_var keep a reduced axis)
            expected = getattr(probe, name)
            expected = tuple(shape) if expected is None else tuple(expected.shape)
            if array.shape != expected:
                raise ValueError(
                    f"state {name!r} of parameter {key!r} has shape {array.shape}, "
                    f"but {rule.name} keeps it as {expected} for a parameter of shape "
                    f"{tuple(shape)}"
                )
            target = dtype
        values[name] = jnp.asarray(array, target)
    return rule.state(**values)


def _zero_hyper(rule: Rule, options: Mapping[str, Any]) -> dict[str, float]:
    from ..functional._rule import hyper_values

    names, values, _ = hyper_values(rule, options)
    return dict(zip(names, values))


def to_array(value: Any) -> Any:
    """A checkpoint leaf as something jax/numpy can read (torch tensors through numpy).

    The copy matters: on the CPU a jax array made from a NumPy view can share
    its memory, and torch may keep updating that tensor in place."""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        return value.detach().cpu().numpy().copy()
    return value


def copy_arrays(state: Mapping[str, Any]) -> dict[str, Any]:
    """Fresh copies of a state's arrays (a snapshot nothing later can change)."""
    return {k: jnp.array(v, copy=True) if isinstance(v, jax.Array) else v for k, v in state.items()}
