"""The one registry of lucid's optimizer classes.

Adding an optimizer touches these places (a torch.optim one; the other families are alike):

1. ``lucid/functional/<name>.py``: its state, its `Rule`, its `Signature` (torch's
   keywords, defaults, types and meanings, written once) and ``<name> = transform_of(...)``,
   listed in the module's ``__all__``.
2. ``lucid/optim/<name>.py``: ``@torch_optimizer(SIGNATURE) class <Name>(Optimizer)`` with
   ``rule = ...``; the decorator records it here, which is how `compile_optimizer`, the
   registry test and the docs check (below) learn of it.
3. The two exports, one line each in ``lucid/functional/__init__.py`` and
   ``lucid/optim/__init__.py`` (with their ``__all__``): static, so that type checkers
   and ``from lucid.optim import *`` see them. Then ``python tools/stubs.py`` writes the
   stubs (generated; ``tests/test_typing.py`` fails until it is run).
4. ``tests/cases.py``: the option sets its trajectories are tested with (data: the
   functional, eager, compiled, stateful and non-finite tests all read this list).
   ``tests/test_registry.py`` then names every other hand-kept table that must list the
   new optimizer or give the reason it does not (the bad-input, validation and non-finite
   tables hold data only a person can write).
5. ``docs/optimizers/<name>.md`` (its page, in ``mkdocs.yml``'s nav); the overview tables
   (``docs/optimizers/index.md``, ``docs/reference/optim.md``) are checked against this
   registry by ``tests/test_registry.py``, which names a missing row.

Every optimizer class that runs a `lucid.functional` rule is declared with
``@torch_optimizer(SIGNATURE, reference=...)`` (`lucid.optim._declare`), which
records it here with its rule, its signature and the package whose numbers it
gives (``"torch.optim"``, ``"bitsandbytes"``, ``"torchao"``, ``"schedulefree"``,
``"kron-torch"``).
Everything that needs "every optimizer" reads this list instead of keeping its
own: `compile_optimizer` (which classes it runs), the tests (which classes they
cover) and the docs' tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..functional._signature import Signature, factory_of
from ..functional.rule import Rule

REFERENCES = (
    "torch.optim",
    "bitsandbytes",
    "torchao",
    "schedulefree",
    "kron-torch",
    "pytorch_optimizer",
)


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

    @property
    def transform(self) -> Any:
        """Its functional form (``lucid.functional.adamw`` for ``AdamW``: the factory made
        from the same signature), or ``None`` where there is none (Schedule-Free's closure
        classes)."""
        return factory_of(self.signature)


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


def named(name: str, reference: str = "torch.optim") -> Registered:
    """The entry of the class ``name`` of ``reference`` (``named("Adam8bit", "torchao")``).

    Raises:
      KeyError: no such class is registered.
    """
    for entry in registered(reference):
        if entry.name == name:
            return entry
    raise KeyError(f"no {reference} optimizer {name!r} is registered")


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
