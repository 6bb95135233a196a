"""torch.optim.lr_scheduler's classes, for lucid optimizers (or any object with
torch-style `param_groups`).

Same constructors, defaults, validation errors, `step()`, `get_last_lr()`,
`last_epoch`, `base_lrs`, `initial_lr` in the groups and `state_dict()`
keys as torch 2.13; learning rates are Python floats computed as torch
computes them (recursive forms scale the current lr, so schedulers chain and
edited learning rates carry through). The schedules' math is
that of [lucid.functional.schedules][], evaluated in Python floats.

Call `scheduler.step()` after `optimizer.step()`, once per epoch or per
batch as the schedule is meant; a compiled optimizer reads the new lr as a
runtime input, so no scheduler ever recompiles its step.
"""

from ._schedulers.base import LRScheduler
from ._schedulers.composite import ChainedScheduler, SequentialLR
from ._schedulers.cosine import CosineAnnealingLR, CosineAnnealingWarmRestarts
from ._schedulers.cyclic import CyclicLR, OneCycleLR
from ._schedulers.decay import (
    ConstantLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    StepLR,
)
from ._schedulers.noam import NoamScheduler
from ._schedulers.plateau import ReduceLROnPlateau

__all__ = [
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "NoamScheduler",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
]
