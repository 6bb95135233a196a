"""torch.optim's stateful API over [lucid.functional][]'s rules.

The optimizers take torch's constructor arguments and defaults, keep torch's
`param_groups` and state names, and load and save torch's `state_dict`
format; [lucid.optim.lr_scheduler][] and [lucid.optim.swa_utils][] work on
them as torch's do. [compile_optimizer][lucid.compile_optimizer] runs a
step as one compiled executable; [lucid.optim.checkpoint][] saves sharded
state with orbax; [lucid.optim.functional][] holds torch's functional
optimizers over lists of arrays.
"""

from . import bnb, functional, kron, lr_scheduler, schedulefree, swa_utils, torchao
from ._by_name import StateLayout, from_torch, to_torch_by_name
from ._torch_format import to_torch
from .adadelta import Adadelta
from .adafactor import Adafactor
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .adamax import Adamax
from .asgd import ASGD
from .compile import (
    CompiledOptimizer,
    CompiledScheduleFree,
    FusedStep,
    compile_optimizer,
    fused_step,
)
from .kron import Kron
from .lbfgs import LBFGS
from .lr_scheduler import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    NoamScheduler,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from .muon import Muon
from .nadam import NAdam
from .optimizer import Optimizer
from .radam import RAdam
from .rmsprop import RMSprop
from .rprop import Rprop
from .sgd import SGD
from .shampoo import Shampoo
from .soap import SOAP
from .sparse_adam import SparseAdam

__all__ = [
    "ASGD",
    "LBFGS",
    "SGD",
    "SOAP",
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "ChainedScheduler",
    "CompiledOptimizer",
    "CompiledScheduleFree",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "FusedStep",
    "Kron",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "Muon",
    "NAdam",
    "NoamScheduler",
    "OneCycleLR",
    "Optimizer",
    "PolynomialLR",
    "RAdam",
    "RMSprop",
    "ReduceLROnPlateau",
    "Rprop",
    "SequentialLR",
    "Shampoo",
    "SparseAdam",
    "StateLayout",
    "StepLR",
    "bnb",
    "compile_optimizer",
    "from_torch",
    "functional",
    "fused_step",
    "kron",
    "lr_scheduler",
    "schedulefree",
    "swa_utils",
    "to_torch",
    "to_torch_by_name",
    "torchao",
]
