"""`opt.state` as torch's live mapping, over state the engine keeps.

torch's `optimizer.state` is a `defaultdict(dict)` that code reads and writes:
`opt.state[p]["exp_avg"] = torch.zeros_like(p)` resets a moment,
`opt.state["note"] = 1` (a key that is not a parameter) travels in the
state_dict. lucid's state lives in the engine (flat buffers for a compiled
step), so `StateMapping` is a view: reads see the engine's current state with
every write made since, and writes are *pending* until the next step, which
checks them as a checkpoint's entries are checked (names, shapes, dtypes) and
hands them to the engine. A write that does not fit is an error at that step,
and the step then changes nothing (the write stays pending until it is
replaced or deleted).

Entries under names the optimizer does not keep (`opt.state[p]["note"]`),
and keys that are not parameters, are kept beside the engine's state, shown
by `state_dict()` and loaded back, as torch keeps them.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from .._parameter import Parameter


class ParamState(MutableMapping):
    """One parameter's entry of [StateMapping][lucid.optim._live_state.StateMapping]:
    `{name: value}` with torch's names, live.

    Args:
      owner: the mapping it belongs to.
      param: the parameter.
    """

    def __init__(self, owner: StateMapping, param: Parameter) -> None:
        self.owner = owner
        self.param = param

    def _current(self) -> dict[str, Any]:
        return self.owner.entries_of(self.param)

    def __getitem__(self, name: str) -> Any:
        return self._current()[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.owner.write(self.param, name, value)

    def __delitem__(self, name: str) -> None:
        if name not in self._current():
            raise KeyError(name)
        self.owner.write(self.param, name, _DELETED)

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return repr(self._current())


_DELETED = object()  # a pending deletion of an entry


class StateMapping(MutableMapping):
    """torch's `optimizer.state`, live over the engine's state (see the module docstring).

    `state[p]` is the parameter's entry (a live `{name: value}` mapping; empty
    for a parameter that has no state yet); `state[key]` for a key that is not a
    Parameter is whatever was stored under it.

    Args:
      read: `read(p) -> {name: value}`, the parameter's state as the engine keeps
        it now, with torch's names (empty without state).
      read_all: `() -> {p: {name: value}}`, every parameter's state the engine
        keeps, with torch's names.
    """

    def __init__(
        self,
        read: Callable[[Parameter], dict[str, Any]],
        read_all: Callable[[], dict[Parameter, dict[str, Any]]],
    ) -> None:
        # held weakly: the optimizer owns this mapping, and a strong reference back
        # would be a cycle that keeps both alive until the cyclic gc runs
        self._read = _weakly(read)
        self._read_all = _weakly(read_all)
        self.pending: dict[Parameter, dict[str, Any]] = {}  # writes not yet stepped
        self.extra: dict[Parameter, dict[str, Any]] = {}  # entries under other names
        self.other: dict[Any, Any] = {}  # keys that are not parameters
        self.dropped: set[Parameter] = set()  # `del state[p]`, not yet stepped

    def read(self, p: Parameter) -> dict[str, Any]:
        """The parameter's state as the engine keeps it now (torch's names)."""
        return self._read()(p)

    def read_all(self) -> dict[Parameter, dict[str, Any]]:
        """Every parameter's state as the engine keeps it now (torch's names)."""
        return self._read_all()()

    # ---------------------------------------------------------- per parameter
    def entries_of(self, p: Parameter) -> dict[str, Any]:
        """The parameter's entries as they read now: the engine's, the extras, then
        the pending writes."""
        entries = {} if p in self.dropped else dict(self.read(p))
        entries.update(self.extra.get(p, {}))
        for name, value in self.pending.get(p, {}).items():
            if value is _DELETED:
                entries.pop(name, None)
            else:
                entries[name] = value
        return entries

    def write(self, p: Parameter, name: str, value: Any) -> None:
        """Record a write (or, with the deletion marker, a deletion) for the next step."""
        if not isinstance(name, str):
            raise TypeError(f"a state entry's name must be a str, got {type(name).__name__}")
        self.pending.setdefault(p, {})[name] = value

    def take_writes(self, known: Callable[[Parameter], set[str]]) -> dict[Parameter, dict]:
        """The parameters whose state changed since the last step, each with its entries
        as they read now (engine names only; other names move to the extras). Clears
        nothing: call `writes_applied` once the engine took them.

        Args:
          known: `known(p) -> the names the optimizer keeps for p`.

        Returns:
          `{p: {name: value}}` for every parameter written or deleted.
        """
        changed = {}
        for p in set(self.pending) | self.dropped:
            names = known(p)
            changed[p] = {k: v for k, v in self.entries_of(p).items() if k in names}
        return changed

    def writes_applied(self, known: Callable[[Parameter], set[str]]) -> None:
        """The engine holds the pending writes now: keep the other names as extras."""
        for p, writes in self.pending.items():
            names = known(p)
            extra = self.extra.setdefault(p, {})
            for name, value in writes.items():
                if name in names:
                    continue
                if value is _DELETED:
                    extra.pop(name, None)
                else:
                    extra[name] = value
            if not extra:
                self.extra.pop(p, None)
        for p in self.dropped:
            self.extra.pop(p, None)
        self.pending.clear()
        self.dropped.clear()

    def reset(self, extra: dict[Parameter, dict[str, Any]], other: dict[Any, Any]) -> None:
        """After a load: nothing pending, these extras and non-parameter keys."""
        self.pending.clear()
        self.dropped.clear()
        self.extra = extra
        self.other = other

    # ---------------------------------------------------------- the mapping
    def _params(self) -> list[Parameter]:
        seen = {p: None for p in self.read_all() if p not in self.dropped}
        seen.update((p, None) for p in self.extra)
        seen.update((p, None) for p in self.pending)
        return [p for p in seen if self.entries_of(p)]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, Parameter):
            return ParamState(self, key)
        return self.other[key]

    def get(self, key: Any, default: Any = None) -> Any:
        """`state[key]` if the key has state (a parameter with entries), else `default`."""
        return self[key] if key in self else default  # noqa: SIM401 (this is get)

    def __contains__(self, key: Any) -> bool:
        if isinstance(key, Parameter):
            return bool(self.entries_of(key))
        return key in self.other

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, Parameter):
            self.other[key] = value
            return
        if not isinstance(value, Mapping):
            raise TypeError(f"a parameter's state must be a dict, got {type(value).__name__}")
        self.dropped.add(key)
        self.pending[key] = {name: value[name] for name in value}

    def __delitem__(self, key: Any) -> None:
        if not isinstance(key, Parameter):
            del self.other[key]
            return
        if key not in self:
            raise KeyError(key)
        self.dropped.add(key)
        self.pending.pop(key, None)

    def __iter__(self) -> Iterator[Any]:
        yield from self._params()
        yield from list(self.other)

    def __len__(self) -> int:
        return len(self._params()) + len(self.other)

    def snapshot(self) -> dict[Any, Any]:
        """Every key with its value as it reads now (a parameter's entries as a new
        dict), reading the engine once."""
        found: dict[Any, Any] = {}
        for p, entries in self.read_all().items():
            if p not in self.dropped:
                found[p] = dict(entries)
        for p in [*self.extra, *self.pending, *self.dropped]:
            found[p] = self.entries_of(p)
        found = {p: entries for p, entries in found.items() if entries}
        found.update(self.other)
        return found

    def __repr__(self) -> str:
        return repr(self.snapshot())


def _weakly(function: Callable) -> Callable[[], Callable]:
    """``() -> function``, holding a bound method's object weakly."""
    if inspect.ismethod(function):
        return weakref.WeakMethod(function)  # type: ignore[return-value]
    return lambda: function
