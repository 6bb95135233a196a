"""Pure, jit-able torch.optim rules as optax transformations, and the schedules."""

from ._rule import Rule
from .adam import AdamState, adam, adamw
from .sgd import SGDState, sgd

__all__ = ["AdamState", "Rule", "SGDState", "adam", "adamw", "sgd"]
