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

A checkpoint is a directory: the non-empty arrays in an orbax checkpoint
(`arrays/`), and a manifest, `lucid_checkpoint.json`, holding everything
else (the groups' options, the state's structure, numbers, empty arrays)
and the SHA-256 of every file written. Any state a `state_dict` holds is
saved: no state at all (`SGD` without momentum, any optimizer before its
first step), L-BFGS's lists and numbers, zero-size arrays, integer and
Python values, your own optimizer's entries. `restore` and `load` check
every file against its checksum first and name the one that differs.

`save` writes into a hidden directory beside `directory` and renames it
into place once complete, so a failed save leaves no partial checkpoint, and
the previous one (with `overwrite=True`) intact; a hidden directory that a
killed save left behind is removed by the next save to that path.

orbax-checkpoint is an optional dependency: `pip install orbax-checkpoint`.
In a multi-process job every process calls `save` and `restore` alike (the
directory must be on a file system they share). For a single device,
`opt.state_dict()` with [to_torch][lucid.optim.to_torch] and `torch.save`
is enough.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from .._arrays import is_torch_tensor, numpy_to_torch, torch_to_numpy
from .._parameter import Parameter
from ._engine import CompiledBackend, state_entry_sharding

__all__ = ["load", "restore", "save"]

MANIFEST = "lucid_checkpoint.json"
_FORMAT = "lucid.optim.checkpoint"
_VERSION = 1
_ARRAYS = "arrays"  # the orbax checkpoint of the non-empty arrays, inside the directory
_ALLOWED = "arrays, numbers, strings, None, and lists, tuples and string-keyed dicts of these"


def _orbax() -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "lucid.optim.checkpoint needs orbax-checkpoint: pip install orbax-checkpoint"
        ) from error
    return ocp


# ------------------------------------------------------------------ encoding
def _is_array(value: Any) -> bool:
    return isinstance(value, jax.Array | np.ndarray | np.generic) or is_torch_tensor(value)


def _array(value: Any, where: str) -> Any:
    """An array leaf as jax or NumPy (torch tensors through NumPy), numeric dtypes only."""
    if is_torch_tensor(value):
        value = torch_to_numpy(value)
    elif isinstance(value, np.generic):
        value = np.asarray(value)
    if not (jnp.issubdtype(value.dtype, jnp.number) or jnp.issubdtype(value.dtype, jnp.bool_)):
        raise TypeError(
            f"checkpoint.save: {where} is an array of dtype {value.dtype}, which a checkpoint "
            "cannot hold (numeric and bool arrays only)"
        )
    return value


def _encode(value: Any, where: str, arrays: dict[str, Any] | None) -> Any:
    """`value` as JSON, its non-empty arrays moved to `arrays` (by key), or, where
    `arrays` is None (the groups' options), written out in the JSON."""
    if _is_array(value):
        array = _array(value, where)
        dtype, shape = str(array.dtype), list(array.shape)
        if arrays is None:
            if not shape:
                return _encode(np.asarray(array).item(), where, None)  # a 0-d lr: a number
            return {"ndarray": np.asarray(array).tolist(), "dtype": dtype}
        if array.size == 0:
            return {"empty": shape, "dtype": dtype}
        key = str(len(arrays))
        arrays[key] = array
        return {"array": key, "dtype": dtype, "shape": shape}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(v, f"{where}[{i}]", arrays) for i, v in enumerate(value)]}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(
                f"checkpoint.save: {where} is a dict with a key that is not a string, which "
                f"a checkpoint cannot hold ({_ALLOWED})"
            )
        return {"dict": {k: _encode(v, f"{where}[{k!r}]", arrays) for k, v in value.items()}}
    raise TypeError(
        f"checkpoint.save: {where} is of type {type(value).__name__}, which a checkpoint "
        f"cannot hold ({_ALLOWED})"
    )


def _decode(value: Any, array: Callable[[Mapping[str, Any]], Any]) -> Any:
    """The inverse of `_encode`; `array(spec)` gives a stored array (and an empty one)."""
    if not isinstance(value, dict):
        return value
    if "array" in value or "empty" in value:
        return array(value)
    if "ndarray" in value:
        return np.asarray(value["ndarray"], jnp.dtype(value["dtype"]))
    ((kind, body),) = value.items()
    if kind == "float":
        return float(body)
    if kind in ("list", "tuple"):
        items = [_decode(v, array) for v in body]
        return items if kind == "list" else tuple(items)
    return {k: _decode(v, array) for k, v in body.items()}


def _array_specs(value: Any, found: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every stored (non-empty) array's spec in an encoded value, in order."""
    if not isinstance(value, dict) or "empty" in value or "ndarray" in value:
        return found
    if "array" in value:
        found.append(value)
        return found
    ((kind, body),) = value.items()
    if kind in ("list", "tuple", "dict"):
        for item in body.values() if kind == "dict" else body:
            _array_specs(item, found)
    return found


# --------------------------------------------------------------- the manifest
def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _digests(root: str) -> dict[str, str]:
    """`{relative path: sha256}` of every file under `root`."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            full = os.path.join(folder, name)
            out[os.path.relpath(full, root).replace(os.sep, "/")] = _sha256(full)
    return dict(sorted(out.items()))


def _sealed(body: Mapping[str, Any]) -> str:
    """The SHA-256 of a manifest's body, which the manifest holds to check itself."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _write_json(path: str, content: Mapping[str, Any]) -> None:
    with open(path, "w") as file:
        json.dump(content, file, allow_nan=False)
        file.flush()
        os.fsync(file.fileno())


def _opened(directory: str | os.PathLike, verify: bool) -> tuple[str, dict]:
    """A checkpoint's path and manifest body, every file checked against its checksum.

    Raises:
      FileNotFoundError: no directory there.
      ValueError: not a lucid checkpoint, or a file missing or corrupted (named).
    """
    path = os.path.abspath(os.fspath(directory))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint: no checkpoint directory at {path}")
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise ValueError(
            f"checkpoint: {path} holds no {MANIFEST}, so it was not written by "
            "lucid.optim.checkpoint.save (or by a lucid from before checkpoints had a "
            "manifest; read it with that version and save it again)"
        )
    try:
        with open(manifest_path) as file:
            manifest = json.load(file)
        body, seal = manifest["body"], manifest["sha256"]
        fmt = body["format"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(
            f"checkpoint: {manifest_path} is corrupted (not a lucid manifest)"
        ) from None
    if fmt != _FORMAT or not isinstance(body.get("version"), int):
        raise ValueError(f"checkpoint: {manifest_path} is not a lucid checkpoint manifest")
    if body["version"] > _VERSION:
        raise ValueError(
            f"checkpoint: {path} has format version {body['version']}; this lucid reads up "
            f"to {_VERSION}"
        )
    if _sealed(body) != seal:
        raise ValueError(
            f"checkpoint: {manifest_path} is corrupted: its content differs from its checksum"
        )
    if verify:
        for name, digest in body["files"].items():
            full = os.path.join(path, *name.split("/"))
            if not os.path.isfile(full):
                raise ValueError(f"checkpoint: {path} is incomplete: the file {name} is missing")
            if _sha256(full) != digest:
                raise ValueError(
                    f"checkpoint: the file {full} is corrupted: its SHA-256 differs from the "
                    "one recorded when it was saved"
                )
    return path, body


# ----------------------------------------------------------------------- save
def save(directory: str | os.PathLike, optimizer: Any, *, overwrite: bool = False) -> None:
    """Write `optimizer`'s state_dict to a new directory, with orbax-checkpoint.

    Every process of a multi-process job calls it; each writes the shards of
    the state its devices hold (nothing is gathered). Everything is checked
    before anything is written; the checkpoint is written into a hidden
    directory beside `directory` (`.<name>.lucid-partial`) and renamed into
    place when complete, with the SHA-256 of every file in its manifest.

    Args:
      directory: the directory to create; a relative path is made absolute
        here.
      optimizer: a lucid optimizer (your own subclass too) or a
        [CompiledOptimizer][lucid.optim.CompiledOptimizer].
      overwrite: replace a checkpoint already at `directory`; it is kept
        until the new one is complete, and stays if the save fails.

    Raises:
      ImportError: orbax-checkpoint is not installed.
      TypeError: the state_dict holds a value a checkpoint cannot hold
        (named; arrays of numbers, numbers, strings, `None` and lists,
        tuples and string-keyed dicts of these are fine). Nothing written.
      FileExistsError: `directory` exists, and `overwrite` is off or it is
        not a lucid checkpoint. Nothing written.
      RuntimeError: orbax-checkpoint failed to write the arrays; nothing is
        left behind, a previous checkpoint stays.

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
    final = os.path.abspath(os.fspath(directory))
    state_dict = optimizer.state_dict()
    arrays: dict[str, Any] = {}
    state = []
    for key, entry in dict(state_dict["state"]).items():
        if not isinstance(key, int | str) or isinstance(key, bool):
            raise TypeError(
                f"checkpoint.save: the state_dict's state has a key {key!r} of type "
                f"{type(key).__name__}; a checkpoint keeps int (parameter index) or str keys"
            )
        state.append([key, _encode(entry, f"state[{key!r}]", arrays)])
    groups = [
        {k: _encode(v, f"param_groups[{i}][{k!r}]", None) for k, v in dict(group).items()}
        for i, group in enumerate(state_dict["param_groups"])
    ]
    body: dict[str, Any] = {
        "format": _FORMAT,
        "version": _VERSION,
        "param_groups": groups,
        "state": state,
    }
    json.dumps(body, allow_nan=False)  # every value is JSON by now: checked before writing
    if os.path.lexists(final):
        if not overwrite:
            raise FileExistsError(
                f"checkpoint.save: {final} exists; pass overwrite=True to replace it (the old "
                "checkpoint is kept until the new one is complete)"
            )
        if not os.path.isfile(os.path.join(final, MANIFEST)):
            raise FileExistsError(
                f"checkpoint.save: {final} exists and is not a lucid checkpoint; not replaced"
            )
    parent, name = os.path.split(final)
    staging = os.path.join(parent, f".{name}.lucid-partial")
    written = os.path.join(staging, "checkpoint")
    previous = os.path.join(staging, "previous")
    primary = jax.process_index() == 0
    if primary:
        os.makedirs(parent, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # what a killed save left behind
        os.makedirs(written)
    _barrier(f"lucid-checkpoint-start:{final}")
    moved = False
    try:
        if arrays:
            try:
                checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
                checkpointer.save(
                    os.path.join(written, _ARRAYS), args=ocp.args.StandardSave(arrays)
                )
            except OSError:
                raise
            except Exception as error:
                raise RuntimeError(
                    f"checkpoint.save: orbax-checkpoint could not write the arrays of {final}: "
                    f"{type(error).__name__}: {error}"
                ) from error
        if primary:
            body["files"] = _digests(written)
            _write_json(os.path.join(written, MANIFEST), {"body": body, "sha256": _sealed(body)})
            if os.path.lexists(final):
                os.rename(final, previous)
                moved = True
            os.rename(written, final)
            moved = False
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        if primary:
            if moved and not os.path.lexists(final):
                os.rename(previous, final)  # the old checkpoint back in place
            shutil.rmtree(staging, ignore_errors=True)
        raise
    _barrier(f"lucid-checkpoint-done:{final}")


# -------------------------------------------------------------------- restore
def _state_sharding(optimizer: Any, p: Parameter, shape: tuple[int, ...]) -> Any:
    """Where a restored state array of ``p`` goes: as the compiled optimizer keeps it
    (sharded over ``shard_state_over`` for replicated parameters), else as ``p`` is."""
    backend = optimizer.backend
    axes = backend.shard_state_over if isinstance(backend, CompiledBackend) else None
    return state_entry_sharding(p.data.sharding, shape, axes)


def _arrays_of(
    path: str, body: Mapping[str, Any], sharding: Callable[[Any, Mapping[str, Any]], Any]
) -> dict[str, Any]:
    """The stored arrays, each read into `sharding(key, spec)`."""
    abstract = {}
    for key, entry in body["state"]:
        for spec in _array_specs(entry, []):
            abstract[spec["array"]] = jax.ShapeDtypeStruct(
                tuple(spec["shape"]), jnp.dtype(spec["dtype"]), sharding=sharding(key, spec)
            )
    if not abstract:
        return {}
    ocp = _orbax()
    try:
        checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
        return dict(
            checkpointer.restore(
                os.path.join(path, _ARRAYS), args=ocp.args.StandardRestore(abstract)
            )
        )
    except Exception as error:
        raise ValueError(
            f"checkpoint: orbax-checkpoint could not read the arrays of {path}: "
            f"{type(error).__name__}: {error}"
        ) from error


def _groups(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{k: _decode(v, _no_array) for k, v in group.items()} for group in body["param_groups"]]


def _no_array(spec: Mapping[str, Any]) -> Any:
    return np.zeros(spec["empty"], jnp.dtype(spec["dtype"]))


def restore(directory: str | os.PathLike, optimizer: Any, *, verify: bool = True) -> None:
    """Load a checkpoint written by [save][lucid.optim.checkpoint.save] into `optimizer`.

    Every file is first checked against the SHA-256 recorded when it was
    saved. Each process reads only the shards its devices keep: every state
    array shaped as its parameter is read straight into the sharding the
    optimizer keeps it in (the parameter's, or sharded over
    `shard_state_over` for a compiled optimizer's replicated parameters);
    other arrays (L-BFGS's history) replicated. Then
    `optimizer.load_state_dict` checks everything before changing anything.

    Args:
      directory: what [save][lucid.optim.checkpoint.save] wrote.
      optimizer: a lucid optimizer or a
        [CompiledOptimizer][lucid.optim.CompiledOptimizer] with the same
        parameters (same order, shapes and dtypes) as the saved one.
      verify: check every file's checksum first (each process reads every
        file once to do so); `False` skips it.

    Raises:
      ImportError: orbax-checkpoint is not installed.
      FileNotFoundError: no directory at `directory`.
      ValueError: not a lucid checkpoint; a file missing or corrupted (the
        error names it); or the checkpoint does not fit `optimizer`. Nothing
        changed.

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
    path, body = _opened(directory, verify)
    runner = getattr(optimizer, "optimizer", optimizer)
    params = [p for group in runner.param_groups for p in group["params"]]
    for key, _ in body["state"]:
        if isinstance(key, int) and not 0 <= key < len(params):
            raise ValueError(
                f"the checkpoint holds state for parameter {key}, which no group lists"
            )

    def where(p: Parameter | None, shape: tuple[int, ...]) -> Any:
        if p is None:
            return SingleDeviceSharding(jax.local_devices()[0])
        if shape == tuple(p.shape) or not shape:
            return _state_sharding(runner, p, shape)
        sharding = p.data.sharding
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec())
        return SingleDeviceSharding(next(iter(sharding.device_set)))

    def sharding(key: Any, spec: Mapping[str, Any]) -> Any:
        p = params[key] if isinstance(key, int) else None
        return where(p, tuple(spec["shape"]))

    arrays = _arrays_of(path, body, sharding)

    def array(spec: Mapping[str, Any]) -> Any:
        if "array" in spec:
            return arrays[spec["array"]]
        return jnp.zeros(spec["empty"], jnp.dtype(spec["dtype"]))

    state = {key: _decode(entry, array) for key, entry in body["state"]}
    optimizer.load_state_dict({"state": state, "param_groups": _groups(body)})


def load(
    directory: str | os.PathLike, *, as_torch: bool = False, verify: bool = True
) -> dict[str, Any]:
    """Read a checkpoint of [save][lucid.optim.checkpoint.save] as one process's state_dict.

    Every file is first checked against its recorded SHA-256; every array is
    read whole onto this process's CPU, whatever number of processes wrote
    it: the single-device state_dict that an optimizer's `load_state_dict`
    (lucid's or, with `as_torch`, torch's) takes.

    Args:
      directory: what [save][lucid.optim.checkpoint.save] wrote (by any
        number of processes).
      as_torch: torch tensors instead of NumPy arrays, ready for a torch
        optimizer's `load_state_dict` (needs torch installed).
      verify: check every file's checksum first; `False` skips it.

    Returns:
      torch's format: `{"state": {index: {name: array}}, "param_groups": [...]}`.

    Raises:
      ImportError: orbax-checkpoint (or, with `as_torch`, torch) is not installed.
      FileNotFoundError: no directory at `directory`.
      ValueError: not a lucid checkpoint, or a file missing or corrupted
        (the error names it).

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
    path, body = _opened(directory, verify)
    device = jax.local_devices(backend="cpu")[0]
    arrays = _arrays_of(path, body, lambda key, spec: SingleDeviceSharding(device))
    convert: Callable[[Any], Any] = np.asarray
    if as_torch:
        convert = numpy_to_torch

    def array(spec: Mapping[str, Any]) -> Any:
        if "array" in spec:
            return convert(np.asarray(arrays[spec["array"]]))
        return convert(np.zeros(spec["empty"], jnp.dtype(spec["dtype"])))

    state = {key: _decode(entry, array) for key, entry in body["state"]}
    return {"state": state, "param_groups": _groups(body)}
