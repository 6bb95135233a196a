"""bitsandbytes' optimizers (`bitsandbytes.optim`) with their names, signatures, state and
state_dict format, over [lucid.functional.bnb][]'s rules.

`lucid.optim.bnb.AdamW8bit(params, lr=1e-3)` is `bnb.optim.AdamW8bit`: the same
keywords and defaults, the same checks and errors, 8-bit block-wise state stored as
`uint8` codes with float32 per-block scales, and the same numbers as bitsandbytes' CPU
backend. Its `state_dict()` is bitsandbytes' (`step`, and `state1`, `state2`, `qmap1`,
`qmap2`, `absmax1`, `absmax2` under `__bnb_optimizer_quant_state__`): a torch run's
checkpoint resumes here and a lucid checkpoint, through
[to_torch][lucid.optim.to_torch], resumes in bitsandbytes. `Paged*` classes are the
unpaged ones (paging is CUDA unified memory; JAX places arrays itself).
[compile_optimizer][lucid.compile_optimizer] runs every one of them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from ..functional._lowbit import blockwise
from ..functional._lowbit import bnb as codec
from ..functional.bnb._family import BnbState
from ..functional.bnb._specs import SPECS as _SPECS
from ._declare import torch_optimizer
from .optimizer import Optimizer, to_array

if TYPE_CHECKING:
    from .. import Parameter

_WRAPPED = "__bnb_optimizer_quant_state__"
"""The key under which bitsandbytes' `state_dict` keeps each parameter's quantization
tensors (`state1`, `qmap1`, ...), hidden from FSDP's gathering."""

_QUANT_KEYS = ("state1", "qmap1", "state2", "qmap2", "absmax1", "absmax2", "unorm_vec")


class BnbOptimizer(Optimizer):
    """What every bitsandbytes optimizer class shares: its state in bitsandbytes' names
    and its state_dict in bitsandbytes' format.

    Not constructed itself: each class below (`Adam8bit`, ...) is one with its
    bitsandbytes signature.

    Args:
      params: the parameters (as every `lucid.optim` optimizer takes them).
      defaults: the options.

    Examples:
      >>> import jax.numpy as jnp, lucid, lucid.optim.bnb
      >>> w = lucid.Parameter(jnp.ones(4096))
      >>> opt = lucid.optim.bnb.Adam8bit([w], lr=0.1)
      >>> isinstance(opt, lucid.optim.bnb.BnbOptimizer)
      True
    """

    def state_names(self) -> set[str]:
        """The entry names bitsandbytes keeps (flat, and its wrapper of the quantization
        tensors); other names written into `state` are kept beside them.

        Returns:
          `step`, the quantization entries and `__bnb_optimizer_quant_state__`.
        """
        return {"step", _WRAPPED, *_QUANT_KEYS}

    def export_state(self, state: Any) -> dict[str, Any]:
        """One parameter's state with bitsandbytes' names: `step` (an int), `state1`,
        `state2`, and for 8-bit state `qmap1`, `qmap2`, `absmax1`, `absmax2`.

        Args:
          state: the parameter's `BnbState`.

        Returns:
          `{name: value}`, flat (as bitsandbytes' `opt.state[p]`).
        """
        out: dict[str, Any] = {"step": int(state.step), "state1": state.state1}
        if state.absmax1 is not None:
            out["qmap1"] = jnp.asarray(codec.dynamic_map(True))
        if state.state2 is not None:
            out["state2"] = state.state2
            if state.absmax2 is not None:
                out["qmap2"] = jnp.asarray(codec.dynamic_map(False))
        for name in ("absmax1", "absmax2", "unorm_vec"):
            value = getattr(state, name)
            if value is not None:
                out[name] = value
        return out

    def state_dict(self) -> dict[str, Any]:
        """The state_dict in bitsandbytes' format.

        As [Optimizer.state_dict][lucid.optim.Optimizer.state_dict], then each
        parameter's quantization tensors moved under `__bnb_optimizer_quant_state__`,
        as bitsandbytes' `Optimizer8bit.state_dict` does (after the hooks, as there).

        Returns:
          `{"state": {index: {"step": int, "__bnb_optimizer_quant_state__": {...}}},
          "param_groups": [...]}`.

        Examples:
          >>> import jax.numpy as jnp, lucid, lucid.optim.bnb
          >>> w = lucid.Parameter(jnp.ones(4096))
          >>> opt = lucid.optim.bnb.Adam8bit([w])
          >>> w.grad = jnp.ones(4096)
          >>> opt.step()
          >>> entry = opt.state_dict()["state"][0]
          >>> entry["step"], sorted(entry["__bnb_optimizer_quant_state__"])
          (1, ['absmax1', 'absmax2', 'qmap1', 'qmap2', 'state1', 'state2'])
        """
        state_dict = super().state_dict()
        for entry in state_dict["state"].values():
            quant = {key: entry.pop(key) for key in _QUANT_KEYS if key in entry}
            if quant:
                entry[_WRAPPED] = quant
        return state_dict

    def import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> Any:
        """A saved entry, bitsandbytes' or lucid's, wrapped or flat, as a `BnbState`.

        The kernel follows the saved dtype, as in bitsandbytes: `uint8` `state1` is
        8-bit state (with its `absmax`), float `state1` is 32-bit state.

        Args:
          group: the parameter's group.
          p: the parameter.
          saved: its saved entry.
          key: the entry's key (for error messages).

        Returns:
          The state, or `None` for an empty entry.

        Raises:
          ValueError: a missing or unknown entry, a wrong shape or dtype, or a code map
            other than bitsandbytes' dynamic maps.
        """
        if not isinstance(saved, Mapping):
            raise ValueError(f"state of parameter {key!r} must be a dict")
        saved = dict(saved)
        saved.update(saved.pop(_WRAPPED, {}))
        if not saved:
            return None
        known = {"step", *_QUANT_KEYS}
        unknown = set(saved) - known
        if unknown:
            raise ValueError(
                f"state of parameter {key!r} has unknown entries {sorted(unknown)} for "
                f"{type(self).__name__} (expected some of {sorted(known)})"
            )
        rule = self.rule
        assert rule is not None
        _, flags = rule.split(group)
        probe = rule.init(jnp.zeros(p.shape, jnp.float32), {}, **flags)
        arrays = {name: np.asarray(to_array(value)) for name, value in saved.items()}
        if "state1" not in arrays or "step" not in arrays:
            raise ValueError(f"state of parameter {key!r} needs 'step' and 'state1'")
        eight = arrays["state1"].dtype == np.uint8
        shape = tuple(p.shape)
        first = (2, *shape) if probe.state1.ndim == len(shape) + 1 else shape
        blocks = blockwise.blocks_of(int(np.prod(shape)), codec.BLOCK_SIZE)
        expected: dict[str, tuple[tuple[int, ...], Any]] = {"state1": (first, None)}
        if probe.state2 is not None:
            expected["state2"] = (shape, None)
        if eight:
            expected["qmap1"] = ((256,), True)
            expected["absmax1"] = (((2, blocks) if len(first) > len(shape) else (blocks,)), None)
            if probe.state2 is not None:
                expected["qmap2"] = ((256,), False)
                expected["absmax2"] = ((blocks,), None)
        if probe.unorm_vec is not None:
            expected["unorm_vec"] = ((1,), None)
        missing = set(expected) - set(arrays)
        extra = set(arrays) - set(expected) - {"step"}
        if missing or extra:
            raise ValueError(
                f"state of parameter {key!r} holds {sorted(arrays)}, but {type(self).__name__} "
                f"keeps {sorted(['step', *expected])} for it"
            )
        values: dict[str, Any] = {name: None for name in BnbState._fields}
        for name, (want, signed) in expected.items():
            array = arrays[name]
            if array.shape != want:
                raise ValueError(
                    f"state {name!r} of parameter {key!r} has shape {array.shape}, expected {want}"
                )
            if signed is not None:
                if not codec.is_code_map(array, signed):
                    raise ValueError(
                        f"state {name!r} of parameter {key!r} is not bitsandbytes' "
                        f"{'signed' if signed else 'unsigned'} dynamic map (lucid quantizes "
                        "with those maps only)"
                    )
                continue
            if name in ("state1", "state2") and eight:
                if array.dtype != np.uint8:
                    raise ValueError(f"state {name!r} of parameter {key!r} must be uint8 codes")
                values[name] = jnp.asarray(array)
            else:
                if not jnp.issubdtype(array.dtype, jnp.floating):  # bfloat16 too
                    raise ValueError(f"state {name!r} of parameter {key!r} has dtype {array.dtype}")
                values[name] = jnp.asarray(array, jnp.float32)
        step = arrays["step"]
        if step.shape != () or not np.isfinite(float(step)) or float(step) != int(step):
            raise ValueError(f"state 'step' of parameter {key!r} must be a whole number")
        values["step"] = jnp.asarray(int(step), jnp.int32)
        return BnbState(**values)


# the options every bitsandbytes group holds (SGD's momentum and dampening as `betas`;
# `optim_bits`, `min_8bit_size`, ... are attributes of its optimizer, not of a group)
_SAVED = ("lr", "betas", "eps", "weight_decay")


def _declare(name: str, doc: str) -> type[BnbOptimizer]:
    """The class `name` of bitsandbytes, registered for `compile_optimizer`."""
    rule, signature = _SPECS[name]
    example = textwrap.indent(signature.example.optimizer(f"bnb.{name}"), "  ")
    doc = f"{doc}\n\nExamples:\n{example}"
    cls = type(name, (BnbOptimizer,), {"rule": rule, "__doc__": doc, "__module__": __name__})
    cls.__qualname__ = name
    return torch_optimizer(signature, step_example=False, reference="bitsandbytes", saved=_SAVED)(
        cls
    )


_PAGED = " Paging (CUDA unified memory) means nothing in JAX: this is the unpaged class."
Adam = _declare("Adam", "`bnb.optim.Adam`: Adam with decoupled decay; `optim_bits` 32 or 8.")
Adam8bit = _declare("Adam8bit", "`bnb.optim.Adam8bit`: Adam with 8-bit block-wise state.")
Adam32bit = _declare("Adam32bit", "`bnb.optim.Adam32bit`: Adam with float32 state.")
PagedAdam = _declare("PagedAdam", "`bnb.optim.PagedAdam`." + _PAGED)
PagedAdam8bit = _declare("PagedAdam8bit", "`bnb.optim.PagedAdam8bit`." + _PAGED)
PagedAdam32bit = _declare("PagedAdam32bit", "`bnb.optim.PagedAdam32bit`." + _PAGED)
AdamW = _declare("AdamW", "`bnb.optim.AdamW`: Adam, weight decay 1e-2; `optim_bits` 32 or 8.")
AdamW8bit = _declare("AdamW8bit", "`bnb.optim.AdamW8bit`: AdamW with 8-bit block-wise state.")
AdamW32bit = _declare("AdamW32bit", "`bnb.optim.AdamW32bit`: AdamW with float32 state.")
PagedAdamW = _declare("PagedAdamW", "`bnb.optim.PagedAdamW`." + _PAGED)
PagedAdamW8bit = _declare("PagedAdamW8bit", "`bnb.optim.PagedAdamW8bit`." + _PAGED)
PagedAdamW32bit = _declare("PagedAdamW32bit", "`bnb.optim.PagedAdamW32bit`." + _PAGED)
LAMB = _declare("LAMB", "`bnb.optim.LAMB`: Adam with LAMB's trust ratio; `optim_bits` 32 or 8.")
LAMB8bit = _declare("LAMB8bit", "`bnb.optim.LAMB8bit`: 8-bit LAMB (its 8-bit kernel is Adam's).")
LAMB32bit = _declare("LAMB32bit", "`bnb.optim.LAMB32bit`: LAMB with float32 state.")

Lion = _declare("Lion", "`bnb.optim.Lion`: Lion; `optim_bits` 32 or 8.")
Lion8bit = _declare("Lion8bit", "`bnb.optim.Lion8bit`: Lion with 8-bit block-wise state.")
Lion32bit = _declare("Lion32bit", "`bnb.optim.Lion32bit`: Lion with float32 state.")
PagedLion = _declare("PagedLion", "`bnb.optim.PagedLion`." + _PAGED)
PagedLion8bit = _declare("PagedLion8bit", "`bnb.optim.PagedLion8bit`." + _PAGED)
PagedLion32bit = _declare("PagedLion32bit", "`bnb.optim.PagedLion32bit`." + _PAGED)
SGD = _declare("SGD", "`bnb.optim.SGD`: SGD with momentum; `optim_bits` 32 or 8.")
SGD8bit = _declare("SGD8bit", "`bnb.optim.SGD8bit`: SGD with an 8-bit momentum buffer.")
SGD32bit = _declare("SGD32bit", "`bnb.optim.SGD32bit`: SGD with a float32 momentum buffer.")
LARS = _declare("LARS", "`bnb.optim.LARS`: SGD with LARS's trust ratio; `optim_bits` 32 or 8.")
LARS8bit = _declare("LARS8bit", "`bnb.optim.LARS8bit`: 8-bit LARS (its 8-bit kernel is SGD's).")
LARS32bit = _declare("LARS32bit", "`bnb.optim.LARS32bit`: LARS with a float32 buffer.")
RMSprop = _declare("RMSprop", "`bnb.optim.RMSprop`: RMSprop; `optim_bits` 32 or 8.")
RMSprop8bit = _declare("RMSprop8bit", "`bnb.optim.RMSprop8bit`: RMSprop with 8-bit state.")
RMSprop32bit = _declare("RMSprop32bit", "`bnb.optim.RMSprop32bit`: RMSprop with float32 state.")
Adagrad = _declare("Adagrad", "`bnb.optim.Adagrad`: Adagrad; `optim_bits` 32 or 8.")
Adagrad8bit = _declare("Adagrad8bit", "`bnb.optim.Adagrad8bit`: Adagrad with 8-bit state.")
Adagrad32bit = _declare("Adagrad32bit", "`bnb.optim.Adagrad32bit`: Adagrad with float32 state.")
AdEMAMix = _declare("AdEMAMix", "`bnb.optim.AdEMAMix`: AdEMAMix; `optim_bits` 32 or 8.")
AdEMAMix8bit = _declare("AdEMAMix8bit", "`bnb.optim.AdEMAMix8bit`: AdEMAMix with 8-bit state.")
AdEMAMix32bit = _declare("AdEMAMix32bit", "`bnb.optim.AdEMAMix32bit`: AdEMAMix, float32 state.")
PagedAdEMAMix = _declare("PagedAdEMAMix", "`bnb.optim.PagedAdEMAMix`." + _PAGED)
PagedAdEMAMix8bit = _declare("PagedAdEMAMix8bit", "`bnb.optim.PagedAdEMAMix8bit`." + _PAGED)
PagedAdEMAMix32bit = _declare("PagedAdEMAMix32bit", "`bnb.optim.PagedAdEMAMix32bit`." + _PAGED)

__all__ = [
    "LAMB",
    "LARS",
    "SGD",
    "AdEMAMix",
    "AdEMAMix8bit",
    "AdEMAMix32bit",
    "Adagrad",
    "Adagrad8bit",
    "Adagrad32bit",
    "Adam",
    "Adam8bit",
    "Adam32bit",
    "AdamW",
    "AdamW8bit",
    "AdamW32bit",
    "BnbOptimizer",
    "LAMB8bit",
    "LAMB32bit",
    "LARS8bit",
    "LARS32bit",
    "Lion",
    "Lion8bit",
    "Lion32bit",
    "PagedAdEMAMix",
    "PagedAdEMAMix8bit",
    "PagedAdEMAMix32bit",
    "PagedAdam",
    "PagedAdam8bit",
    "PagedAdam32bit",
    "PagedAdamW",
    "PagedAdamW8bit",
    "PagedAdamW32bit",
    "PagedLion",
    "PagedLion8bit",
    "PagedLion32bit",
    "RMSprop",
    "RMSprop8bit",
    "RMSprop32bit",
    "SGD8bit",
    "SGD32bit",
]
