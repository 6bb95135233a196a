"""The engine that runs lucid's optimizer steps, behind one interface.

An `Optimizer` talks to the engine only through `interface`: it hands a
backend its groups (`Group`) at every call, and asks it for states. See
``README.md`` beside this file for what each module owns and a walk through
one compiled step.
"""

from .compiled import CompiledBackend
from .eager import EagerBackend
from .interface import Backend, FusingBackend, Group, Hyper
from .programs import checked_gradients
from .sharding import state_entry_sharding
from .state import begin, export, load_entry, packed_hyper

__all__ = [
    "Backend",
    "CompiledBackend",
    "EagerBackend",
    "FusingBackend",
    "Group",
    "Hyper",
    "begin",
    "checked_gradients",
    "export",
    "load_entry",
    "packed_hyper",
    "state_entry_sharding",
]
