"""Checkpoints of sharded optimizer state, with orbax-checkpoint.

[save][lucid.optim.checkpoint.save] writes `opt.state_dict()` (torch's
format, state entries by parameter index) with orbax-checkpoint, the JAX
ecosystem's checkpoint library: each process writes the shards its devices
hold, nothing is gathered. [restore][lucid.optim.checkpoint.restore] reads
each state array straight into the sharding the optimizer keeps it in (each
process reads its own shards) and loads it with `opt.load_state_dict`.
[load][lucid.optim.checkpoint.load] reads a checkpoint in one process, on
one device, as the single-device state_dict (NumPy arrays, or torch tensors
with `as_torch=True`) that torch's `load_state_dict` takes.

orbax-checkpoint is an optional dependency: `pip install orbax-checkpoint`.
In a multi-process job every process calls `save` and `restore` alike. For a
single device, `opt.state_dict()` with
[to_torch][lucid.optim.to_torch] and `torch.save` is enough.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from .._parameter import Parameter

__all__ = ["load", "restore", "save"]


def _orbax() -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "lucid.optim.checkpoint needs orbax-checkpoint: pip install orbax-checkpoint"
        ) from error
    return ocp


def _json_value(value: Any) -> Any:
    """A param-group option as JSON (tuples become lists; 0-d arrays numbers)."""
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    if isinstance(value, np.generic | np.ndarray | jax.Array):
        return np.asarray(value).item()
    return value


def _from_json(value: Any, like: Any = ()) -> Any:
    """Lists back to tuples, as the optimizer's own options are (``betas``...)."""
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value) if isinstance(like, tuple) else value
    return value


def save(directory: str | os.PathLike, optimizer: Any) -> None:
    """Write `optimizer`'s state_dict to a new directory, with orbax-checkpoint.

    Every process of a multi-process job calls it; each writes the shards of
    the state its devices hold (nothing is gathered). The param groups'
    options go to a JSON entry beside the arrays.

    Args:
      directory: the directory to create (it must not exist); a relative path
        is made absolute here.
      optimizer: a lucid optimizer or a
        [CompiledOptimizer][lucid.optim.CompiledOptimizer].

    Raises:
      ImportError: orbax-checkpoint is not installed.

    Examples:
      >>> import os, tempfile, jax.numpy as jnp, lucid
      >>> from lucid.optim import checkpoint
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> opt = lucid.optim.Adam([w], lr=0.1)
      >>> w.grad = jnp.ones(2)
      >>> opt.step()
      >>> tmp = tempfile.TemporaryDirectory()
      >>> checkpoint.save(os.path.join(tmp.name, "step1"), opt)
      >>> again = lucid.optim.Adam([w], lr=0.5)
      >>> checkpoint.restore(os.path.join(tmp.name, "step1"), again)
      >>> again.param_groups[0]["lr"], [round(x, 4) for x in again.state[w]["exp_avg"].tolist()]
      (0.1, [0.1, 0.1])
      >>> tmp.cleanup()
    """
    ocp = _orbax()
    state_dict = optimizer.state_dict()
    arrays = {
        str(index): {name: value for name, value in entry.items()}
        for index, entry in state_dict["state"].items()
    }
    shapes = {
        index: {name: [str(value.dtype), list(value.shape)] for name, value in entry.items()}
        for index, entry in arrays.items()
    }
    groups = [
        {key: _json_value(value) for key, value in group.items()}
        for group in state_dict["param_groups"]
    ]
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    checkpointer.save(
        os.path.abspath(directory),
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(arrays),
            meta=ocp.args.JsonSave({"param_groups": groups, "shapes": shapes}),
        ),
    )


def _read(directory: str | os.PathLike, target: Mapping[str, Any] | None) -> tuple[dict, dict]:
    """The checkpoint's metadata, and its arrays restored as ``target(meta)`` says."""
    ocp = _orbax()
    path = os.path.abspath(directory)
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    meta = checkpointer.restore(path, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    abstract = target(meta)
    if not abstract:
        return meta, {}
    restored = checkpointer.restore(
        path, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
    )
    return meta, restored["state"]


def _state_sharding(optimizer: Any, p: Parameter, shape: tuple[int, ...]) -> Any:
    """Where a restored state array of ``p`` goes: as the compiled optimizer keeps it
    (sharded over ``shard_state_over`` for replicated parameters), else as ``p`` is."""
    sharding = p.data.sharding
    if not isinstance(sharding, NamedSharding):
        return SingleDeviceSharding(next(iter(sharding.device_set)))
    mesh = sharding.mesh
    if not shape:
        return NamedSharding(mesh, PartitionSpec())
    axes = getattr(optimizer.backend, "shard_state_over", None)
    if axes is not None and sharding.is_fully_replicated:
        named = axes if isinstance(axes, tuple) else (axes,)
        if all(a in mesh.axis_names for a in named):
            shards = int(np.prod([mesh.shape[a] for a in named]))
            if shape[0] % shards == 0:
                return NamedSharding(mesh, PartitionSpec(axes))
    return sharding


def restore(directory: str | os.PathLike, optimizer: Any) -> None:
    """Load a checkpoint written by [save][lucid.optim.checkpoint.save] into `optimizer`.

    Each process reads only the shards its devices keep: every state array is
    read straight into the sharding the optimizer keeps it in (the
    parameter's, or sharded over `shard_state_over` for a compiled
    optimizer's replicated parameters). Then `optimizer.load_state_dict`
    checks everything before changing anything.

    Args:
      directory: what [save][lucid.optim.checkpoint.save] wrote.
      optimizer: a lucid optimizer or a
        [CompiledOptimizer][lucid.optim.CompiledOptimizer] with the same
        parameters (same order, shapes and dtypes) as the saved one.

    Raises:
      ImportError: orbax-checkpoint is not installed.
      ValueError: the checkpoint does not fit `optimizer` (nothing changed).

    Examples:
      >>> import os, tempfile, jax.numpy as jnp, lucid
      >>> from lucid.optim import checkpoint
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> opt = lucid.optim.SGD([w], lr=0.1, momentum=0.9)
      >>> w.grad = jnp.ones(2)
      >>> opt.step()
      >>> tmp = tempfile.TemporaryDirectory()
      >>> checkpoint.save(os.path.join(tmp.name, "ckpt"), opt)
      >>> compiled = lucid.compile_optimizer(lucid.optim.SGD([w], lr=0.1, momentum=0.9))
      >>> checkpoint.restore(os.path.join(tmp.name, "ckpt"), compiled)
      >>> compiled.state[w]["momentum_buffer"].tolist()
      [1.0, 1.0]
      >>> tmp.cleanup()
    """
    runner = getattr(optimizer, "optimizer", optimizer)
    params = [p for group in runner.param_groups for p in group["params"]]

    def target(meta: Mapping[str, Any]) -> dict:
        out: dict[str, dict[str, Any]] = {}
        for index, entry in meta["shapes"].items():
            if int(index) >= len(params):
                raise ValueError(
                    f"the checkpoint holds state for parameter {index}, which no group lists"
                )
            p = params[int(index)]
            out[index] = {
                name: jax.ShapeDtypeStruct(
                    tuple(shape), np.dtype(dtype), sharding=_state_sharding(runner, p, tuple(shape))
                )
                for name, (dtype, shape) in entry.items()
            }
        return out

    meta, arrays = _read(directory, target)
    groups = []
    for saved, group in zip(meta["param_groups"], runner.param_groups):
        groups.append({k: _from_json(v, group.get(k)) for k, v in saved.items()})
    state = {int(index): dict(entry) for index, entry in arrays.items()}
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def load(directory: str | os.PathLike, *, as_torch: bool = False) -> dict[str, Any]:
    """Read a checkpoint of [save][lucid.optim.checkpoint.save] as one process's state_dict.

    Every array is read whole onto this process's CPU, whatever number of
    processes wrote it: the single-device state_dict that an optimizer's
    `load_state_dict` (lucid's or, with `as_torch`, torch's) takes.

    Args:
      directory: what [save][lucid.optim.checkpoint.save] wrote (by any
        number of processes).
      as_torch: torch tensors instead of NumPy arrays, ready for a torch
        optimizer's `load_state_dict` (needs torch installed).

    Returns:
      torch's format: `{"state": {index: {name: array}}, "param_groups": [...]}`.

    Raises:
      ImportError: orbax-checkpoint (or, with `as_torch`, torch) is not installed.

    Examples:
      >>> import os, tempfile, jax.numpy as jnp, lucid
      >>> from lucid.optim import checkpoint
      >>> w = lucid.Parameter(jnp.zeros(2))
      >>> opt = lucid.optim.Adam([w], lr=0.1)
      >>> w.grad = jnp.ones(2)
      >>> opt.step()
      >>> tmp = tempfile.TemporaryDirectory()
      >>> checkpoint.save(os.path.join(tmp.name, "ckpt"), opt)
      >>> sd = checkpoint.load(os.path.join(tmp.name, "ckpt"), as_torch=True)
      >>> sorted(sd["state"][0]), type(sd["state"][0]["exp_avg"]).__name__
      (['exp_avg', 'exp_avg_sq', 'step'], 'Tensor')
      >>> tmp.cleanup()
    """
    device = jax.local_devices(backend="cpu")[0]

    def target(meta: Mapping[str, Any]) -> dict:
        return {
            index: {
                name: jax.ShapeDtypeStruct(
                    tuple(shape), np.dtype(dtype), sharding=SingleDeviceSharding(device)
                )
                for name, (dtype, shape) in entry.items()
            }
            for index, entry in meta["shapes"].items()
        }

    meta, arrays = _read(directory, target)
    convert: Any = np.asarray
    if as_torch:
        import torch

        def convert(value: Any) -> Any:
            return torch.from_numpy(np.array(value))

    state = {
        int(index): {name: convert(value) for name, value in entry.items()}
        for index, entry in sorted(arrays.items(), key=lambda item: int(item[0]))
    }
    groups = [
        {k: v if k == "params" else _from_json(v, ()) for k, v in group.items()}
        for group in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}
