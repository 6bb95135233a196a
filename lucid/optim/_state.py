"""The one state model, shared by the eager and the compiled step.

A parameter's optimizer state is its rule's state NamedTuple (``AdamState``...),
whose fields are torch's state names plus, for a few rules, fields torch does
not show (`Rule.hidden`). torch's rules for its life, written once here:

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

from .._arrays import is_torch_tensor, numpy_to_torch, torch_to_numpy
from ..functional._rule import (
    Rule,
    check_complex,
    compute_dtype,
    hyper_values,
    init_leaf,
    resume_leaf,
)

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
        lambda: init_leaf(rule, flags, packed_hyper(rule, options), jnp.zeros(shape, dtype))
    )
    required = {
        name
        for name, value in zip(probe._fields, probe)
        # an optional field may be missing, as torch loads it: a state made while its
        # option was off raises torch's KeyError at the next step (resume_leaf)
        if value is not None and name not in rule.hidden and name not in rule.optional
    }
    missing = required - set(saved)
    if missing:
        raise ValueError(f"state of parameter {key!r} is missing {sorted(missing)}")
    values: dict[str, Any] = {name: None for name in fields}
    for name, default in rule.hidden.items():
        values[name] = jnp.asarray(default, np.float32)
    for name, value in saved.items():
        array = _host_or_global(to_array(value))
        if not (
            jnp.issubdtype(array.dtype, jnp.inexact) or jnp.issubdtype(array.dtype, jnp.integer)
        ):
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


def to_array(value: Any) -> Any:
    """A checkpoint leaf as something jax/numpy can read (torch tensors through numpy,
    bfloat16 and float8 included).

    The copy matters: on the CPU a jax array made from a NumPy view can share
    its memory, and torch may keep updating that tensor in place."""
    if is_torch_tensor(value):
        return torch_to_numpy(value)
    return value


def to_torch(state_dict: Any) -> Any:
    """A state_dict with torch tensors for arrays: what torch saves, loads and takes.

    Every jax or NumPy array becomes a CPU torch tensor of the same dtype
    (bfloat16 and float8 included) and every NumPy scalar a Python number,
    through any nesting of dicts, lists and tuples. The result is what
    `torch.save` writes and `torch.load(..., weights_only=True)` reads back,
    and what a torch optimizer's `load_state_dict` takes. (The other way
    needs no conversion: lucid's `load_state_dict` reads torch tensors.)
    Needs torch installed.

    Args:
      state_dict: a state_dict (an optimizer's or a scheduler's), or anything
        nested of dicts, lists and tuples holding arrays.

    Returns:
      The same structure, arrays as torch tensors; other values unchanged.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> opt = lucid.optim.Adam([w])
      >>> w.grad = jnp.ones(2)
      >>> opt.step()
      >>> sd = lucid.optim.to_torch(opt.state_dict())
      >>> type(sd["state"][0]["exp_avg"]).__name__, sd["state"][0]["step"].dtype
      ('Tensor', torch.float32)
      >>> type(sd["param_groups"][0]["lr"]).__name__
      'float'
    """
    if isinstance(state_dict, jax.Array | np.ndarray):
        return numpy_to_torch(state_dict)
    if isinstance(state_dict, np.generic):
        return state_dict.item()
    if isinstance(state_dict, Mapping):
        return {k: to_torch(v) for k, v in state_dict.items()}
    if isinstance(state_dict, list | tuple):
        return type(state_dict)(to_torch(v) for v in state_dict)
    return state_dict


def copy_arrays(state: Mapping[str, Any]) -> dict[str, Any]:
    """Fresh copies of a state's arrays (a snapshot nothing later can change)."""
    return {k: jnp.array(v, copy=True) if isinstance(v, jax.Array) else v for k, v in state.items()}
