"""The one registry of lucid's optimizer classes.

Every optimizer class that runs a `lucid.functional` rule is declared with
``@torch_optimizer(SIGNATURE, reference=...)`` (`lucid.optim._declare`), which
records it here with its rule, its signature and the package whose numbers it
gives (``"torch.optim"``, ``"bitsandbytes"``, ``"torchao"``, ``"schedulefree"``).
Everything that needs "every optimizer" reads this list instead of keeping its
own: `compile_optimizer` (which classes it runs), the tests (which classes they
cover) and the docs' tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..functional._rule import Rule
from ..functional._signature import Signature

REFERENCES = ("torch.optim", "bitsandbytes", "torchao", "schedulefree")


@dataclasses.dataclass(frozen=True)
class Registered:
    """One optimizer class and what it is made from.

    Attributes:
      name: the class name (the reference package's name for it).
      cls: the class.
      rule: the `lucid.functional` rule it runs.
      signature: its constructor's signature (the reference's keywords and defaults).
      reference: the package whose numbers it gives (one of `REFERENCES`).
      saved: the options every state_dict of the class holds in each group, whatever
        the reference's version: those the reference has always saved (torch fills the
        others in when a loaded group lacks them). A group without one of them was
        saved by another optimizer (`lucid.optim._provenance`).
    """

    name: str
    cls: type
    rule: Rule
    signature: Signature
    reference: str
    saved: frozenset[str] = frozenset()


_REGISTRY: dict[type, Registered] = {}


def register(cls: type, signature: Signature, reference: str, saved: tuple[str, ...] = ()) -> None:
    """Record ``cls`` (called by ``@torch_optimizer``).

    Raises:
      ValueError: an unknown ``reference``.
    """
    if reference not in REFERENCES:
        raise ValueError(f"unknown reference package {reference!r}; expected one of {REFERENCES}")
    _REGISTRY[cls] = Registered(
        cls.__name__,
        cls,
        cls.rule,  # type: ignore[attr-defined]
        signature,
        reference,
        frozenset(saved),
    )


def registered(reference: str | None = None) -> list[Registered]:
    """Every registered optimizer (of ``reference`` only, when given), in declaration order."""
    return [entry for entry in _REGISTRY.values() if reference in (None, entry.reference)]


def entry_of(cls: Any) -> Registered | None:
    """The registry's entry of exactly ``cls`` (a subclass is not registered), or ``None``."""
    return _REGISTRY.get(cls)


def nearest_entry(cls: type) -> Registered | None:
    """The entry of ``cls`` or of its nearest registered base class (your subclass of
    `Adam` gets `Adam`'s), or ``None``."""
    for base in cls.__mro__:
        entry = _REGISTRY.get(base)
        if entry is not None:
            return entry
    return None
