"""Which storages parameters live in: how the flat-buffer tests see a layout."""

from __future__ import annotations


def stores_of(params) -> list:
    """The distinct storages the parameters live in, in order of first use."""
    found: dict[int, object] = {}
    for p in params:
        storage = p.location[0]
        found.setdefault(id(storage), storage)
    return list(found.values())
