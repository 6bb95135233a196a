"""Every optimizer x option set the parity tests run, shared by the functional,
shell and compiled test modules. Options are torch's keywords, used verbatim on
both sides."""

from __future__ import annotations

from typing import Any

# (torch class name, options)
CASES: list[tuple[str, dict[str, Any]]] = [
    ("SGD", {"lr": 0.05}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "maximize": True}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01, "amsgrad": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True, "amsgrad": True}),
    ("Adam", {"lr": 0.01, "maximize": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.3, "amsgrad": True, "maximize": True}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "centered": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "maximize": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.1, "maximize": True}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.95, "centered": True, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-6, "maximize": True}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-5, "weight_decay": 0.1}),
    ("Adadelta", {"lr": 0.5, "maximize": True}),
    ("Adadelta", {"lr": 0.5, "rho": 0.95, "weight_decay": 0.1, "maximize": True}),
    ("Adamax", {"lr": 0.01}),
    ("Adamax", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("Adamax", {"lr": 0.01, "maximize": True}),
    ("Adamax", {"lr": 0.01, "betas": (0.95, 0.9), "weight_decay": 0.1, "maximize": True}),
    ("Adamax", {"lr": 0.01, "betas": (0.5, 0.999), "eps": 1e-2}),
    ("RAdam", {"lr": 0.01}),
    ("RAdam", {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("RAdam", {"lr": 0.01, "maximize": True}),
    ("RAdam", {"lr": 0.01, "betas": (0.9, 0.6)}),  # rho_inf < 5: never rectified
    ("RAdam", {"lr": 0.01, "betas": (0.9, 0.9999)}),  # rho_t's float32 cancellation at its worst
    ("NAdam", {"lr": 0.01}),
    ("NAdam", {"lr": 0.01, "betas": (0.8, 0.99), "momentum_decay": 0.01, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("NAdam", {"lr": 0.01, "maximize": True}),
    ("ASGD", {"lr": 0.05}),
    ("ASGD", {"lr": 0.05, "lambd": 1e-2, "alpha": 0.5, "t0": 10, "weight_decay": 0.1}),
    ("ASGD", {"lr": 0.05, "t0": 0, "maximize": True}),
    ("Rprop", {"lr": 0.01}),
    ("Rprop", {"lr": 0.01, "etas": (0.3, 1.5), "step_sizes": (1e-4, 0.05)}),
    ("Rprop", {"lr": 0.01, "maximize": True}),
    # Adafactor: w (5, 3) is factored (row_var, col_var), b (3,) keeps a full variance
    ("Adafactor", {}),
    ("Adafactor", {"lr": 0.05, "weight_decay": 0.1}),
    ("Adafactor", {"lr": 0.05, "beta2_decay": -0.5, "eps": (1e-30, 1e-2), "d": 2.0}),
    ("Adafactor", {"lr": 0.05, "eps": (1e-2, 1e-3), "weight_decay": 0.05, "maximize": True}),
]


# Parameter shapes on both sides of every threshold the engine lays parameters out by
# (`lucid.optim._engine.policy.EAGER`): an elementwise rule's parameters of at most `small`
# elements run laid end to end on the CPU, in pieces of at most `piece_bytes`, in calls of
# at most `chunk` members, each member's fields apart where XLA would run the call inline.
def _thresholds() -> tuple[int, int, int]:
    from lucid.optim._engine.policy import EAGER

    return EAGER.small, EAGER.piece_bytes, EAGER.chunk


_SMALL, _SEGMENT, _CHUNK = _thresholds()
PIECE = _SEGMENT // 4  # float32 elements of one piece; float64 crosses at half of it
# One group, small parameters before and after large ones: empty (first, where it opens
# the first piece, and again later), 1 element, exactly one float32 piece (two of float64)
# and one element more, half a piece (one of float64) and one more, at and one above
# SMALL, a large 2-D weight, and small 2-D ones.
ACROSS_THRESHOLDS = [
    (0,),
    (1,),
    (PIECE,),
    (256, 200),
    (3, 2),
    (_SMALL,),
    (PIECE + 1,),
    (_SMALL + 1,),
    (0,),
    (PIECE // 2,),
    (PIECE // 2 + 1,),
    (4, 5),
]
# a group of two tiny parameters: a call XLA runs inline
TINY_GROUP = [(2,), (5,)]
# a group of one empty parameter
EMPTY_GROUP = [(0,)]
# a group of more parameters than one eager call holds
MANY_SMALL = [(4,)] * (_CHUNK + 2)


def case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, options = case
    parts = [f"{k}={v}" for k, v in options.items() if k != "lr"]
    return name + ("[" + ",".join(parts) + "]" if parts else "")


def functional(name: str):
    """The lucid.functional transform factory for a torch class name (the registry's)."""
    from lucid.optim._registry import named

    return named(name).transform


def snake(name: str) -> str:
    """torch class name -> lucid.functional name."""
    return functional(name).__name__
