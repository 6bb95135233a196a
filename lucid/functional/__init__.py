"""Pure, jit-able torch.optim rules as optax transformations, and the schedules.

Every optimizer here is an `optax.GradientTransformation` with torch.optim's
keyword names and defaults; [lucid.functional.schedules][] holds torch's LR
schedulers as step-indexed functions, [lucid.functional.averaging][] torch's
weight averages, and [clip_grad_norm][lucid.functional.clip_grad_norm] torch's
gradient clipping as a transform.
"""

from . import averaging, bnb, rule, schedulefree, schedules, torchao
from .adadelta import AdadeltaState, adadelta
from .adafactor import AdafactorState, adafactor
from .adagrad import AdagradState, adagrad
from .adam import AdamState, adam, adamw
from .adamax import AdamaxState, adamax
from .asgd import ASGDState, asgd
from .clipping import clip_grad_norm
from .kron import KronState, kron
from .lbfgs import LBFGSState, lbfgs
from .muon import MuonState, muon
from .nadam import NAdamState, nadam
from .radam import RAdamState, radam
from .rmsprop import RMSpropState, rmsprop
from .rprop import RpropState, rprop
from .rule import Rule
from .sgd import SGDState, sgd
from .shampoo import ShampooState, shampoo
from .soap import SOAPState, soap
from .sparse_adam import SparseAdamState, sparse_adam

__all__ = [
    "ASGDState",
    "AdadeltaState",
    "AdafactorState",
    "AdagradState",
    "AdamState",
    "AdamaxState",
    "KronState",
    "LBFGSState",
    "MuonState",
    "NAdamState",
    "RAdamState",
    "RMSpropState",
    "RpropState",
    "Rule",
    "SGDState",
    "SOAPState",
    "ShampooState",
    "SparseAdamState",
    "adadelta",
    "adafactor",
    "adagrad",
    "adam",
    "adamax",
    "adamw",
    "asgd",
    "averaging",
    "bnb",
    "clip_grad_norm",
    "kron",
    "lbfgs",
    "muon",
    "nadam",
    "radam",
    "rmsprop",
    "rprop",
    "rule",
    "schedulefree",
    "schedules",
    "sgd",
    "shampoo",
    "soap",
    "sparse_adam",
    "torchao",
]
