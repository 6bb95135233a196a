"""What counts as an array, and torch tensors to NumPy and back for every float dtype.

NumPy has no bfloat16 or float8 of its own, so ``tensor.numpy()`` refuses them;
jax's NumPy dtypes (from ``ml_dtypes``) have them. A tensor of such a dtype
travels as its raw bits (an integer view of the same width) and is
reinterpreted on the other side, so every float dtype torch and jax share
moves exactly.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

# the integer dtype that carries the bits of a 1- or 2-byte float NumPy lacks (bfloat16,
# float8): torch and jax.numpy name those dtypes alike
_BITS = {1: np.uint8, 2: np.int16}


def is_torch_tensor(value: Any) -> bool:
    """True for a ``torch.Tensor`` (checked without importing torch)."""
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def is_array(value: Any) -> bool:
    """True for a jax, NumPy or torch array (a NumPy scalar counts as a 0-d array)."""
    return isinstance(value, jax.Array | np.ndarray | np.generic) or is_torch_tensor(value)


def is_sparse(value: Any) -> bool:
    """True for a ``jax.experimental.sparse`` array (BCOO, BCSR, ...).

    Looks the module up instead of importing it: if it was never imported, no
    value can be one of its arrays, and dense-only users skip its import cost.
    """
    sparse = sys.modules.get("jax.experimental.sparse")
    return sparse is not None and isinstance(value, sparse.JAXSparse)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A NumPy copy of a torch tensor, bfloat16 and float8 included.

    Raises:
      TypeError: the tensor's dtype has no jax counterpart.
    """
    tensor = tensor.detach().cpu()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    try:
        return tensor.numpy().copy()
    except TypeError:
        pass
    name = str(tensor.dtype).removeprefix("torch.")
    target = getattr(jnp, name, None)
    bits = _BITS.get(tensor.element_size())
    if target is None or bits is None:
        raise TypeError(f"a torch tensor of dtype {tensor.dtype} has no jax counterpart") from None
    import torch

    raw = tensor.contiguous().view(torch.uint8 if bits is np.uint8 else torch.int16)
    return raw.numpy().view(np.dtype(target)).copy()


def numpy_to_torch(array: Any) -> Any:
    """A torch tensor holding ``array`` (any jax or NumPy array), bfloat16 and float8
    included, on the CPU. Needs torch installed.

    Raises:
      TypeError: torch has no dtype of that name.
    """
    import torch

    array = np.array(array, copy=True)
    try:
        return torch.from_numpy(array)
    except TypeError:
        pass
    target = getattr(torch, array.dtype.name, None)
    bits = _BITS.get(array.dtype.itemsize)
    if not isinstance(target, torch.dtype) or bits is None:
        raise TypeError(f"torch has no dtype for {array.dtype}") from None
    return torch.from_numpy(array.view(bits)).view(target)


def device_domain(array: Any) -> Hashable | None:
    """Where ``array`` is committed (None: not committed, e.g. NumPy): the ids of its
    devices, with the mesh of a `NamedSharding`. Arrays of one domain can meet in one
    jitted call; those of two meshes over the same devices are kept apart too (jax
    cannot always name the outputs' shardings of a call mixing two meshes)."""
    if not isinstance(array, jax.Array) or not getattr(array, "committed", True):
        return None
    sharding = array.sharding
    ids = frozenset(d.id for d in sharding.device_set)
    return (ids, sharding.mesh) if isinstance(sharding, NamedSharding) else ids


def to_array(value: Any) -> Any:
    """A checkpoint leaf as something jax/numpy can read (torch tensors through numpy,
    bfloat16 and float8 included).

    The copy matters: on the CPU a jax array made from a NumPy view can share
    its memory, and torch may keep updating that tensor in place."""
    if is_torch_tensor(value):
        return torch_to_numpy(value)
    return value
