"""Telling a state_dict that another optimizer saved, before it loads.

torch's `load_state_dict` takes any optimizer's state_dict: it replaces the groups by
the saved ones and keeps the state as saved, so `Adam.load_state_dict` of an SGD's
state_dict loads without a word and fails at the next step (`KeyError: 'step'`), or
steps with another optimizer's options. lucid refuses such a state_dict when it is
loaded, in words, and changes nothing. A group is another optimizer's when

* it lacks an option that every state_dict of this optimizer holds (the class's
  `saved` options in the registry: torch's group keys less those its `__setstate__`
  fills in when a group lacks them, so a state_dict torch's own step could not run
  on), or
* it holds an option of another of lucid's optimizers (their constructors' keywords)
  that this optimizer's groups do not have.

The options every family shares (`maximize`, `foreach`, `capturable`,
`differentiable`, `fused`, `decoupled_weight_decay`, which torch adds to one class
after another) prove nothing between torch's classes, but torch.optim's kernel
switches (`foreach`, `fused`, `capturable`, `differentiable`) mark a torch.optim
state_dict given to a class of another package (bitsandbytes', torchao's groups never
hold them). Options a group of this optimizer holds now (your own keys, a
scheduler's, your subclass's defaults) are its own. Your own `Optimizer` subclass
that writes its own step loads any state_dict, as torch's does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from ..functional._signature import (
    CAPTURABLE,
    DECOUPLED_WEIGHT_DECAY,
    DIFFERENTIABLE,
    FOREACH,
    FUSED,
    MAXIMIZE,
)
from ._registry import REFERENCES, Registered, nearest_entry, registered

__all__ = ["check_saved_by", "state_saved_by"]

# options torch adds to one optimizer after another: they tell no optimizer from another
_SHARED = frozenset(
    arg.name
    for arg in (MAXIMIZE, FOREACH, CAPTURABLE, DIFFERENTIABLE, FUSED, DECOUPLED_WEIGHT_DECAY)
)
# torch.optim's kernel switches: no other package's groups hold them (bitsandbytes',
# torchao's), so they tell a torch.optim state_dict from one of those
_TORCH_KERNELS = frozenset(arg.name for arg in (FOREACH, CAPTURABLE, DIFFERENTIABLE, FUSED))


def _options_of(entry: Registered) -> frozenset[str]:
    """Every option a group of ``entry``'s class holds: its keywords, the options its
    signature adds (AdamW's ``decoupled_weight_decay``, bitsandbytes' ``betas`` of SGD)
    and the ones its reference saves."""
    signature = entry.signature
    names = set(signature.names()) | set(signature.fixed) | entry.saved
    required = {p.name: 1e-3 for p in signature.parameters if p.default is inspect.Parameter.empty}
    with contextlib.suppress(TypeError, ValueError):  # one that needs real values
        names |= set(signature.bind(entry.name, (), required))
    return frozenset(names)


def _catalogue() -> tuple[tuple[Registered, frozenset[str]], ...]:
    """Every registered class with its options (read again when a class is registered)."""
    return _catalogue_of(tuple(registered()))


@functools.cache
def _catalogue_of(entries: tuple[Registered, ...]) -> tuple[tuple[Registered, frozenset[str]], ...]:
    return tuple((entry, _options_of(entry)) for entry in entries)


def _telling() -> frozenset[str]:
    """The options some optimizer has and another has not: every class's keywords, less
    the ones every family shares (not the bookkeeping a class adds to its groups, as
    Schedule-Free's `k`, which `ScheduleFreeWrapper` adds to any optimizer's groups)."""
    names: set[str] = set()
    for entry, _ in _catalogue():
        names |= set(entry.signature.names())
    return frozenset(names - _SHARED)


def _state_names() -> frozenset[str]:
    """Every state name a registered class's rule keeps (torch's names)."""
    names: set[str] = set()
    for entry, _ in _catalogue():
        names |= set(entry.rule.state._fields) - set(entry.rule.fields.hidden)
    return frozenset(names)


def _label(entry: Registered) -> str:
    if entry.reference == "torch.optim":
        return entry.name
    owner = entry.reference + ("'" if entry.reference.endswith("s") else "'s")
    return f"{owner} {entry.name}"


def _one_of(entries: Sequence[Registered]) -> str | None:
    """``entries`` in words: one name, or "another optimizer (one of A, B, C, D, ...)"."""
    labels = list(dict.fromkeys(_label(entry) for entry in entries))
    if len(labels) <= 1:
        return labels[0] if labels else None
    more = ", ..." if len(labels) > 4 else ""
    return f"another optimizer (one of {', '.join(labels[:4])}{more})"


def _saver(group: Mapping[str, Any], own: type) -> str | None:
    """The optimizer whose group ``group`` looks like: of those whose saved options it
    holds, whose options cover its telling ones and whose fixed options (AdamW's
    `decoupled_weight_decay=True`) it holds at their values, the ones holding most of
    their options (torch's classes first; ties all named); ``None`` when none fits."""
    keys = frozenset(group) - {"params"}
    telling = keys & _telling()
    scored = []
    for entry, options in _catalogue():
        fixed = entry.signature.fixed
        if (
            issubclass(own, entry.cls)
            or not entry.saved <= keys
            or not telling <= options
            or any(k in group and _differs(group[k], v) for k, v in fixed.items())
        ):
            continue
        score = (len(options & keys), -REFERENCES.index(entry.reference), len(fixed))
        scored.append((score, entry))
    if not scored:
        return None
    best = max(score for score, _ in scored)
    return _one_of([entry for score, entry in scored if score == best])


def _differs(saved: Any, fixed: Any) -> bool:
    try:
        return bool(saved != fixed)
    except Exception:  # an array, or a value that does not compare to a bool: not fixed's
        return True


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(repr(name) for name in sorted(names))


def _strays(saved_state: Mapping[Any, Any], own_state_names: set[str]) -> set[str]:
    """The state names in ``saved_state`` that another optimizer keeps and this one not
    (also one level down: bitsandbytes keeps its quantized state in a dict of its own)."""
    every = _state_names()
    names: set[str] = set()
    for entry in saved_state.values():
        if not isinstance(entry, Mapping):
            continue
        for key, value in entry.items():
            names.add(key)
            if isinstance(value, Mapping):
                names |= set(value)
    return {name for name in names if name in every and name not in own_state_names}


def _advice(name: str, saver: str | None) -> str:
    one = saver is not None and not saver.startswith("another")
    into = f"into {saver}" if one else "into the optimizer that saved it"
    return (
        f"Load it {into} over the same parameters, or give {name} a state_dict that "
        f"{name} saved. Nothing was changed."
    )


def check_saved_by(
    optimizer: Any,
    saved_groups: Sequence[Mapping[str, Any]],
    saved_state: Mapping[Any, Any],
    own_state_names: set[str],
) -> None:
    """Refuse a state_dict whose groups another optimizer saved (see the module's
    docstring).

    Args:
      optimizer: the optimizer loading it (a lucid optimizer that runs a rule).
      saved_groups: the state_dict's groups, as many as the optimizer's.
      saved_state: the state_dict's state.
      own_state_names: the state names the optimizer keeps (for the message).

    Raises:
      ValueError: a group is another optimizer's: the message names both optimizers,
        the options the group lacks and the ones it should not hold, and the state
        names the optimizer does not keep.
    """
    mine = nearest_entry(type(optimizer))
    if mine is None:
        return
    name = _label(mine) if type(optimizer) is mine.cls else type(optimizer).__name__
    own = set(optimizer.defaults) | mine.saved
    for group in optimizer.param_groups:
        own |= set(group)
    telling = _telling()
    if mine.reference != "torch.optim":  # torch.optim's kernel switches mark its groups
        telling |= _TORCH_KERNELS
    for i, group in enumerate(saved_groups):
        keys = frozenset(group) - {"params"}
        missing = sorted(mine.saved - keys)
        foreign = sorted((keys & telling) - own)
        if not missing and not foreign:
            continue
        saver = _saver(group, type(optimizer))
        said = []
        if missing:
            said.append(f"lacks {_quoted(missing)} (every {name} state_dict holds them)")
        if foreign:
            said.append(f"holds {_quoted(foreign)} (options {name} does not have)")
        strays = _strays(saved_state, own_state_names)
        kept = f"; its state holds {_quoted(strays)}, which {name} does not keep" if strays else ""
        raise ValueError(
            f"{type(optimizer).__name__}.load_state_dict: this state_dict was saved by "
            f"{saver or 'another optimizer'}, not by {name}: param_groups[{i}] "
            f"{' and '.join(said)}{kept}. " + _advice(name, saver)
        )


def state_saved_by(
    optimizer: Any, saved_state: Mapping[Any, Any], own_state_names: set[str]
) -> str | None:
    """Why a state that did not fit may be another optimizer's: ``None``, or words for
    a `ValueError` when the state holds names another optimizer keeps and this one not
    (Adamax's `exp_inf` given to Adam), naming that optimizer.

    Args:
      optimizer: the optimizer loading it.
      saved_state: the state_dict's state.
      own_state_names: the state names the optimizer keeps.

    Returns:
      The words to add to the error, or `None` when the state holds no such name.
    """
    strays = _strays(saved_state, own_state_names)
    if not strays:
        return None
    mine = nearest_entry(type(optimizer))
    exact = mine is not None and type(optimizer) is mine.cls
    name = _label(mine) if exact else type(optimizer).__name__  # type: ignore[arg-type]
    keepers = [
        entry
        for entry, _ in _catalogue()
        if not isinstance(optimizer, entry.cls)
        and strays <= set(entry.rule.state._fields) - set(entry.rule.fields.hidden)
    ]
    first = min((REFERENCES.index(entry.reference) for entry in keepers), default=0)
    saver = _one_of([e for e in keepers if REFERENCES.index(e.reference) == first])
    return (
        f"its state holds {_quoted(strays)}, which {name} does not keep: this state_dict "
        f"was saved by {saver or 'another optimizer'}, not by {name}. " + _advice(name, saver)
    )
