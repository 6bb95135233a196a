"""lucid's state_dicts in torch's terms: `to_torch`, and snapshots of state arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import numpy_to_torch


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
