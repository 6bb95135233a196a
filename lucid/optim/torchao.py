"""torchao's low-bit Adam optimizers (`torchao.optim`) with torch's stateful API.

`Adam8bit`, `AdamW8bit`, `Adam4bit`, `AdamW4bit`, `AdamFp8` and `AdamWFp8` take
torchao's constructor arguments, defaults and checks, run the rules of
[lucid.functional.torchao][] and keep their moments quantized: `uint8` codes
(4-bit: two a byte) or `float8_e4m3fn` values, with one float32 scale per block.

Their `state_dict` shows each quantized moment as the tensors torchao's
`OptimState8bit` / `OptimState4bit` / `OptimStateFp8` hold:
`{"codes", "scale", "qmap"}` (8 bits), the same plus `"shape"` (4 bits, whose
codes are flat), `{"codes", "scale"}` (fp8); a small tensor's moment is a plain
array, as in torchao. `load_state_dict` takes that, or a torchao optimizer's
`state_dict()` (its tensor subclasses read directly), and `to_torchao` turns
lucid's into what a torchao optimizer's `load_state_dict` takes.

`block_size` and `bf16_stochastic_round` are attributes of a torchao optimizer;
here they are options of every parameter group (defaults from the constructor),
so they appear in `param_groups`. `to_torchao` leaves them out, and a torchao
state_dict, which lacks them, loads with the constructor's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._arrays import to_array
from ..functional._lowbit.floats import FP8
from ..functional.torchao import adam as _rules
from ..functional.torchao import qmap
from ..functional.torchao.adam import LowBitAdamState, first_key, is_quantized
from ._declare import torch_optimizer
from ._torch_format import to_torch
from .optimizer import Optimizer

__all__ = [
    "Adam4bit",
    "Adam8bit",
    "AdamFp8",
    "AdamW4bit",
    "AdamW8bit",
    "AdamWFp8",
    "to_torchao",
]

_LUCID_ONLY_OPTIONS = ("block_size", "bf16_stochastic_round")


def _copy(value: Any) -> Any:
    return jnp.array(value, copy=True)


class _LowBitAdam(Optimizer):
    """What the six classes share: the state_dict format of torchao's quantized state."""

    def state_names(self) -> set[str]:
        """The entry names torchao keeps; other names written into `state` are kept
        beside them.

        Returns:
          `step` and the moments' names.
        """
        return {"step", *_rules.MOMENTS}

    def export_state(self, state: Any) -> dict[str, Any]:
        """A parameter's state as torchao shows it: ``step``, and each moment as a plain
        array or as its quantized tensors (``{"codes", "scale", "qmap"}``; fp8:
        ``{"codes", "scale"}``), fresh copies.

        Args:
          state: the parameter's `LowBitAdamState`.

        Returns:
          `{name: value}` with torchao's names.
        """
        form = _rules.FORM_OF[self.rule]
        shown: dict[str, Any] = {"step": _copy(state.step)}
        for name in _rules.MOMENTS:
            codes, scale = getattr(state, name), getattr(state, name + "_scale")
            if codes is None:
                continue
            if scale is None:
                shown[name] = _copy(codes)
                continue
            entry = {"codes": _copy(codes), "scale": _copy(scale)}
            if form != "fp8":
                entry["qmap"] = jnp.asarray(qmap(8 if form == "8bit" else 4, _rules.SIGNED[name]))
            shown[name] = entry
        return shown

    def state_dict(self) -> dict[str, Any]:
        """The state and options, in torchao's format but for the quantized moments,
        which are dicts of their tensors (`to_torchao` makes torchao's tensor
        subclasses of them).

        Returns:
          `{"state": {index: {name: value}}, "param_groups": [...]}`, as
          [Optimizer.state_dict][lucid.optim.Optimizer.state_dict]; a 4-bit moment
          also records the parameter's `"shape"` (its codes are flat, as torchao's).
        """
        state_dict = super().state_dict()
        if _rules.FORM_OF[self.rule] == "4bit":
            params = [p for group in self.param_groups for p in group["params"]]
            for index, entry in state_dict["state"].items():
                if not isinstance(index, int):  # a key that is not a parameter's
                    continue
                for value in entry.values():
                    if isinstance(value, dict):
                        value["shape"] = tuple(params[index].shape)
        return state_dict

    def import_state(self, group: Mapping[str, Any], p: Any, saved: Any, key: Any) -> Any:
        """A saved entry (lucid's, or torchao's with its tensor subclasses) as the state.

        Args:
          group: the parameter's group, with the loaded options.
          p: the parameter.
          saved: its entry in the state_dict's `state`.
          key: the entry's key (for error messages).

        Returns:
          The `LowBitAdamState`, or `None` for an empty entry.

        Raises:
          ValueError: the entry does not fit this optimizer or this parameter: unknown
            or missing entries, a quantized moment where torchao keeps the tensor in
            full precision or the other way round, another format (8-bit state for a
            4-bit optimizer), block size, shape, dtype or code map.
        """
        if not isinstance(saved, Mapping):
            raise ValueError(
                f"state of parameter {key!r} must be a dict, got {type(saved).__name__}"
            )
        if not saved:
            return None
        name = self.rule.name
        unknown = set(saved) - {"step", *_rules.MOMENTS}
        if unknown:
            raise ValueError(
                f"state of parameter {key!r} has unknown entries {sorted(unknown)} for {name} "
                f"(expected step, {', '.join(_rules.MOMENTS)})"
            )
        missing = {"step", "exp_avg", "exp_avg_sq"} - set(saved)
        if missing:
            raise ValueError(f"state of parameter {key!r} is missing {sorted(missing)}")
        step = np.asarray(to_array(saved["step"]))
        if step.shape != () or not jnp.issubdtype(step.dtype, jnp.number):
            raise ValueError(f"state 'step' of parameter {key!r} must be a scalar")
        block = int(group["block_size"])
        shape, size = tuple(p.shape), int(np.prod(p.shape))
        quantized = is_quantized(size, block)
        fields: dict[str, Any] = {f: None for f in LowBitAdamState._fields}
        fields["step"] = jnp.asarray(step, jnp.float32)
        for moment in _rules.MOMENTS:
            if moment in saved:
                where = f"state {moment!r} of parameter {key!r}"
                codes, scale = self._moment(
                    saved[moment], moment, where, shape, p.dtype, block, quantized
                )
                fields[moment], fields[moment + "_scale"] = codes, scale
        if jnp.dtype(p.dtype) == jnp.bfloat16:
            fields["rng"] = first_key(p.data, fields["step"])
        return LowBitAdamState(**fields)

    def _moment(
        self,
        value: Any,
        moment: str,
        where: str,
        shape: tuple,
        dtype: Any,
        block: int,
        quantized: bool,
    ) -> tuple[Any, Any]:
        """One saved moment, checked, as ``(codes or values, scale or None)``."""
        form = _rules.FORM_OF[self.rule]
        parts = _quantized_parts(value)
        size = int(np.prod(shape))
        if not quantized:
            if parts is not None:
                raise ValueError(
                    f"{where} is quantized, but {self.rule.name} keeps a parameter of shape "
                    f"{shape} in full precision (fewer than 4096 elements, or a size that is "
                    f"no multiple of block_size={block})"
                )
            array = np.asarray(to_array(value))
            # jnp's issubdtype knows bfloat16 and the float8 types as floats; NumPy's does not
            if array.shape != shape or not jnp.issubdtype(array.dtype, jnp.inexact):
                raise ValueError(
                    f"{where} has shape {array.shape} and dtype {array.dtype}; expected a "
                    f"float array of shape {shape}"
                )
            return jnp.asarray(array, dtype), None
        if parts is None:
            raise ValueError(
                f"{where} is a full-precision array, but {self.rule.name} keeps a parameter of "
                f"shape {shape} quantized in blocks of {block}"
            )
        codes, scale, table = parts
        want_shape = (size // 2,) if form == "4bit" else shape
        want_dtype = np.dtype(FP8) if form == "fp8" else np.dtype(np.uint8)
        if codes.dtype != want_dtype or codes.shape != want_shape:
            raise ValueError(
                f"{where} holds {codes.dtype} codes of shape {codes.shape}; {self.rule.name} "
                f"keeps {want_dtype} codes of shape {want_shape} (another format: an "
                "8-bit, 4-bit or fp8 state for another optimizer)"
            )
        if scale.shape != (size // block,):
            raise ValueError(
                f"{where} has {scale.size} scales; blocks of block_size={block} give "
                f"{size // block} (the state was made with another block_size)"
            )
        if form != "fp8":
            expected = qmap(8 if form == "8bit" else 4, _rules.SIGNED[moment])
            if table is not None and not np.array_equal(np.asarray(table, np.float32), expected):
                raise ValueError(f"{where} has a code map that is not torchao's for {moment}")
        return jnp.asarray(codes), jnp.asarray(scale, jnp.float32)


def _quantized_parts(value: Any) -> tuple[np.ndarray, np.ndarray, Any] | None:
    """``(codes, scale, qmap or None)`` of a quantized moment (a torchao tensor
    subclass, or lucid's dict of its tensors); ``None`` for a plain array."""
    if isinstance(value, Mapping):
        if not {"codes", "scale"} <= set(value):
            raise ValueError(f"a quantized moment needs 'codes' and 'scale', got {sorted(value)}")
        table = value.get("qmap")
        return (
            np.asarray(to_array(value["codes"])),
            np.asarray(to_array(value["scale"])),
            None if table is None else np.asarray(to_array(table)),
        )
    if hasattr(value, "codes") and hasattr(value, "scale"):  # torchao's OptimState*
        table = getattr(value, "qmap", None)
        return (
            np.asarray(to_array(value.codes)),
            np.asarray(to_array(value.scale)),
            None if table is None else np.asarray(to_array(table)),
        )
    return None


def to_torchao(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A lucid low-bit Adam's state_dict as a torchao optimizer's `load_state_dict` takes it.

    Each quantized moment becomes torchao's tensor subclass (`OptimState8bit`,
    `OptimState4bit`, `OptimStateFp8`) around the same codes and scales, every
    other array a torch tensor (`lucid.optim.to_torch`); each group's `lr` becomes
    the float32 tensor torchao keeps, and lucid's own group options
    (`block_size`, `bf16_stochastic_round`: attributes of a torchao optimizer) are
    left out. Needs torch and torchao installed.

    Args:
      state_dict: what a `lucid.optim.torchao` optimizer's `state_dict()` returned.

    Returns:
      The state_dict in torchao's format.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones((2, 4096)))
      >>> opt = lucid.optim.torchao.AdamW8bit([w])
      >>> w.grad = jnp.ones((2, 4096))
      >>> opt.step()
      >>> sd = lucid.optim.torchao.to_torchao(opt.state_dict())
      >>> type(sd["state"][0]["exp_avg"]).__name__, sd["param_groups"][0]["lr"].dtype
      ('OptimState8bit', torch.float32)
    """
    import torch
    from torchao.optim.subclass_4bit import OptimState4bit
    from torchao.optim.subclass_8bit import OptimState8bit
    from torchao.optim.subclass_fp8 import OptimStateFp8

    def moment(name: str, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return to_torch(value)
        codes, scale = to_torch(value["codes"]), to_torch(value["scale"])
        if codes.dtype == torch.float8_e4m3fn:
            return OptimStateFp8(codes, scale, dtype=torch.float32)
        table = to_torch(value["qmap"])
        if "shape" in value:
            shape = tuple(int(d) for d in value["shape"])
            return OptimState4bit(
                codes, scale, table, _rules.SIGNED[name], shape, dtype=torch.float32
            )
        return OptimState8bit(codes, scale, table, _rules.SIGNED[name], dtype=torch.float32)

    state = {
        index: {name: moment(name, value) for name, value in entry.items()}
        for index, entry in state_dict["state"].items()
    }
    groups = []
    for group in state_dict["param_groups"]:
        kept = {k: to_torch(v) for k, v in group.items() if k not in _LUCID_ONLY_OPTIONS}
        lr = np.asarray(to_array(kept["lr"]), np.float32).reshape(())
        kept["lr"] = torch.tensor(float(lr), dtype=torch.float32)
        groups.append(kept)
    return {"state": state, "param_groups": groups}


# the options torchao has always kept in its groups (block_size and bf16_stochastic_round
# are attributes of its optimizer, not of a group)
_SAVED = ("lr", "betas", "eps", "weight_decay")


@torch_optimizer(_rules.ADAM8BIT_SIGNATURE, reference="torchao", saved=_SAVED)
class Adam8bit(_LowBitAdam):
    """torchao.optim.Adam8bit: Adam with 8-bit block-wise quantized moments (blocks of 256)."""

    rule = _rules.ADAM8BIT


@torch_optimizer(_rules.ADAMW8BIT_SIGNATURE, reference="torchao", saved=_SAVED)
class AdamW8bit(_LowBitAdam):
    """torchao.optim.AdamW8bit: AdamW with 8-bit block-wise quantized moments (blocks of 256)."""

    rule = _rules.ADAMW8BIT


@torch_optimizer(_rules.ADAM4BIT_SIGNATURE, reference="torchao", saved=_SAVED)
class Adam4bit(_LowBitAdam):
    """torchao.optim.Adam4bit: Adam with 4-bit quantized moments, two codes a byte
    (blocks of 128)."""

    rule = _rules.ADAM4BIT


@torch_optimizer(_rules.ADAMW4BIT_SIGNATURE, reference="torchao", saved=_SAVED)
class AdamW4bit(_LowBitAdam):
    """torchao.optim.AdamW4bit: AdamW with 4-bit quantized moments, two codes a byte
    (blocks of 128)."""

    rule = _rules.ADAMW4BIT


@torch_optimizer(_rules.ADAMFP8_SIGNATURE, reference="torchao", saved=_SAVED)
class AdamFp8(_LowBitAdam):
    """torchao.optim.AdamFp8: Adam with moments in float8_e4m3fn, scaled per block of 256."""

    rule = _rules.ADAMFP8


@torch_optimizer(_rules.ADAMWFP8_SIGNATURE, reference="torchao", saved=_SAVED)
class AdamWFp8(_LowBitAdam):
    """torchao.optim.AdamWFp8: AdamW with moments in float8_e4m3fn, scaled per block of 256."""

    rule = _rules.ADAMWFP8
