"""The one state model, shared by the eager and the compiled backends.

A parameter's optimizer state is its rule's state NamedTuple (``AdamState``...),
whose fields are torch's state names plus, for a few rules, fields torch does
not show (`FieldSpec.hidden`). torch's rules for its life, written once here:

* it is created at the first step in which the parameter has a gradient, from
  its group's hyper-parameters *at that moment* (`begin`);
* an option that owns a field, turned on later, starts that field where torch
  does and raises torch's ``KeyError`` where torch does; turned off, it leaves
  the field untouched (`begin`, through ``resume_leaf``);
* a state_dict shows the fields torch shows (`export`), and a saved entry
  is checked and converted back by `load_entry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..._arrays import to_array
from ...functional._apply import (
    check_complex,
    compute_dtype,
    hyper_values,
    init_leaf,
    resume_leaf,
)
from ...functional.rule import Rule

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
      RuntimeError: a complex parameter for a rule torch does not run on them.
    """
    check_complex(rule, value.dtype)
    if state is None:
        return init_leaf(rule, flags, hyper, value)
    return resume_leaf(rule, flags, state, value)


def export(rule: Rule, state: Any) -> dict[str, Any]:
    """One parameter's state as torch's state_dict shows it (torch's names, no hidden
    fields, no fields that are off)."""
    return {
        name: value
        for name, value in zip(state._fields, state)
        if value is not None and name not in rule.fields.hidden
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
    shown = [f for f in fields if f not in rule.fields.hidden]
    unknown = set(saved) - set(shown)
    if unknown:
        raise ValueError(
            f"state of parameter {key!r} has unknown entries {sorted(unknown)} "
            f"for {rule.name} (expected some of {shown})"
        )
    _, flags = rule.split(options)
    probe = jax.eval_shape(
        lambda: init_leaf(rule, flags, packed_hyper(rule, options), jnp.zeros(shape, dtype))
    )
    required = {
        name
        for name, value in zip(probe._fields, probe)
        # an optional field may be missing, as torch loads it: a state made while its
        # option was off raises torch's KeyError at the next step (resume_leaf)
        if value is not None and name not in rule.fields.hidden and name not in rule.fields.optional
    }
    missing = required - set(saved)
    if missing:
        raise ValueError(f"state of parameter {key!r} is missing {sorted(missing)}")
    values: dict[str, Any] = {name: None for name in fields}
    for name, default in rule.fields.hidden.items():
        values[name] = jnp.asarray(default, np.float32)
    for name, value in saved.items():
        array = _host_or_global(to_array(value))
        if not (
            jnp.issubdtype(array.dtype, jnp.inexact) or jnp.issubdtype(array.dtype, jnp.integer)
        ):
            raise ValueError(f"state {name!r} of parameter {key!r} has dtype {array.dtype}")
        if name in rule.fields.scalar:
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


def _host_or_global(value: Any) -> Any:
    """A saved array as NumPy, except an array spread over several processes (a
    multi-process checkpoint), which no process can hold whole: it stays as it is."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return value
    return np.asarray(value)


def packed_hyper(rule: Rule, options: Mapping[str, Any]) -> dict[str, float]:
    """A group's packed hyper-parameters by name, as ``init`` takes them."""
    names, values, _ = hyper_values(rule, options)
    return dict(zip(names, values))
