"""Every scheduler configuration the schedule tests run, and how to run one.

A case builds a scheduler from a library module (``torch.optim.lr_scheduler``
or ``lucid.optim.lr_scheduler``) on an optimizer, so both sides run the same
construction code; ``functional`` builds the matching
``lucid.functional.schedules`` schedule for group 0 (``None`` where the case
has no functional counterpart). The torch side drives a real
``torch.optim.SGD`` (with momentum) or ``Adam``; the lucid side a stand-in
holding copies of torch's groups (real lucid optimizers are tested elsewhere).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import torch

import lucid.functional.schedules as S

Build = Callable[[Any, Any], Any]  # (library module, optimizer) -> scheduler


class StandIn:
    """The smallest optimizer-like object a scheduler needs."""

    def __init__(self, param_groups: list[dict], defaults: dict | None = None):
        self.param_groups = param_groups
        if defaults is not None:
            self.defaults = defaults


def torch_optimizer(kind: str = "sgd", lrs: tuple[float, ...] = (0.1,)) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in lrs]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, lrs, strict=True)]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)
    return torch.optim.Adam(groups, lr=lrs[0], betas=(0.9, 0.999))


def stand_in_like(optimizer: torch.optim.Optimizer) -> StandIn:
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return StandIn(groups, dict(optimizer.defaults))


def snapshot(optimizer: Any) -> list[tuple[float, float | None]]:
    """(lr, momentum or beta1) of every group."""
    rows = []
    for group in optimizer.param_groups:
        momentum = group["betas"][0] if "betas" in group else group.get("momentum")
        rows.append((group["lr"], momentum))
    return rows


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """torch warns when a scheduler is stepped with ``epoch`` or before the optimizer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def run(
    build: Build,
    library: Any,
    optimizer: Any,
    steps: int,
    *,
    metrics: list[float] | None = None,
    edit: Callable[[int, Any], None] | None = None,
) -> tuple[list, Any]:
    """Snapshots after construction and after each of ``steps`` steps."""
    with quiet():
        scheduler = build(library, optimizer)
        rows = [snapshot(optimizer)]
        for t in range(1, steps + 1):
            if isinstance(optimizer, torch.optim.Optimizer):
                optimizer.step()  # no gradients: only marks the optimizer as stepped
            if edit is not None:
                edit(t, optimizer)
            if metrics is None:
                scheduler.step()
            else:
                scheduler.step(metrics[t - 1])
            rows.append(snapshot(optimizer))
    return rows, scheduler


@contextlib.contextmanager
def x64(enabled: bool) -> Iterator[None]:
    """Switch x64 for a block, on every supported jax (``jax.enable_x64`` is newer)."""
    if hasattr(jax, "enable_x64"):
        with jax.enable_x64(enabled):
            yield
    else:
        from jax.experimental import disable_x64, enable_x64

        with enable_x64() if enabled else disable_x64():
            yield


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    build: Build
    steps: int = 40
    optimizer: str = "sgd"
    lrs: tuple[float, ...] = (0.1, 0.05)
    functional: Callable[[float], S.Schedule] | None = None  # base_lr -> schedule
    momentum: S.Schedule | None = None  # the momentum curve of group 0


def _cls(name: str, *args: Any, **kwargs: Any) -> Build:
    return lambda lib, opt: getattr(lib, name)(opt, *args, **kwargs)


def _inverse(epoch: Any) -> Any:
    return 1 / (1 + 0.3 * epoch)


def _half_life(epoch: Any) -> Any:
    return 0.5 + 0.5 / (1 + epoch)


def _constant_decay(epoch: Any) -> Any:
    return 0.95


def _alternating_decay(epoch: Any) -> Any:
    return 0.9 + 0.05 * (epoch % 3)


def _cycle_scale(x: Any) -> Any:
    return 1 / (1 + 0.5 * x)


def _sequential(lib: Any, opt: Any) -> Any:
    children = [lib.LinearLR(opt), lib.ExponentialLR(opt, 0.9), lib.CosineAnnealingLR(opt, 6)]
    return lib.SequentialLR(opt, children, milestones=[5, 12])


def _sequential_mixed(lib: Any, opt: Any) -> Any:
    children = [
        lib.ConstantLR(opt, factor=0.5, total_iters=3),
        lib.StepLR(opt, 4, 0.5),
        lib.CosineAnnealingWarmRestarts(opt, 3),
        lib.LambdaLR(opt, _inverse),
    ]
    return lib.SequentialLR(opt, children, milestones=[4, 13, 20])


def _chained(lib: Any, opt: Any) -> Any:
    children = [lib.ConstantLR(opt), lib.ExponentialLR(opt, 0.95), lib.CosineAnnealingLR(opt, 40)]
    return lib.ChainedScheduler(children)


def _chained_decays(lib: Any, opt: Any) -> Any:
    children = [
        lib.LinearLR(opt, 0.2, 1.0, 6),
        lib.MultiStepLR(opt, [3, 8, 8]),
        lib.PolynomialLR(opt, 30, 0.5),
        lib.MultiplicativeLR(opt, _alternating_decay),
    ]
    return lib.ChainedScheduler(children, optimizer=opt)


CASES: list[Case] = [
    Case("step", _cls("StepLR", 3, 0.5), functional=lambda b: S.step_lr(b, 3, 0.5)),
    Case("step-default", _cls("StepLR", step_size=7), functional=lambda b: S.step_lr(b, 7)),
    Case(
        "multistep-repeated",
        _cls("MultiStepLR", [2, 5, 5, 9], 0.3),
        functional=lambda b: S.multi_step_lr(b, [2, 5, 5, 9], 0.3),
    ),
    Case(
        "multistep-zero",
        _cls("MultiStepLR", [0, 4], 0.5),
        functional=lambda b: S.multi_step_lr(b, [0, 4], 0.5),
    ),
    Case("exponential", _cls("ExponentialLR", 0.9), functional=lambda b: S.exponential_lr(b, 0.9)),
    Case(
        "exponential-long",
        _cls("ExponentialLR", 0.97),
        steps=200,
        functional=lambda b: S.exponential_lr(b, 0.97),
    ),
    Case(
        "cosine",
        _cls("CosineAnnealingLR", 10),
        steps=45,
        functional=lambda b: S.cosine_annealing_lr(b, 10),
    ),
    Case(
        "cosine-eta-min",
        _cls("CosineAnnealingLR", T_max=7, eta_min=0.01),
        steps=50,
        functional=lambda b: S.cosine_annealing_lr(b, 7, 0.01),
    ),
    Case(
        "cosine-long",
        _cls("CosineAnnealingLR", 50),
        steps=160,
        lrs=(0.1,),
        functional=lambda b: S.cosine_annealing_lr(b, 50),
    ),
    Case("lambda", _cls("LambdaLR", _inverse), functional=lambda b: S.lambda_lr(b, _inverse)),
    Case(
        "lambda-per-group",
        _cls("LambdaLR", [_inverse, _half_life]),
        functional=lambda b: S.lambda_lr(b, _inverse),
    ),
    Case(
        "multiplicative",
        _cls("MultiplicativeLR", _constant_decay),
        steps=90,
        functional=lambda b: S.multiplicative_lr(b, _constant_decay),
    ),
    Case(
        "multiplicative-per-group",
        _cls("MultiplicativeLR", [_alternating_decay, _constant_decay]),
        steps=30,
        functional=lambda b: S.multiplicative_lr(b, _alternating_decay),
    ),
    Case("linear", _cls("LinearLR"), functional=lambda b: S.linear_lr(b)),
    Case(
        "linear-down",
        _cls("LinearLR", start_factor=0.5, end_factor=0.1, total_iters=7),
        functional=lambda b: S.linear_lr(b, 0.5, 0.1, 7),
    ),
    Case("constant", _cls("ConstantLR"), functional=lambda b: S.constant_lr(b)),
    Case(
        "constant-half",
        _cls("ConstantLR", factor=0.5, total_iters=3),
        functional=lambda b: S.constant_lr(b, 0.5, 3),
    ),
    Case("polynomial", _cls("PolynomialLR"), functional=lambda b: S.polynomial_lr(b)),
    Case(
        "polynomial-square",
        _cls("PolynomialLR", total_iters=8, power=2.0),
        functional=lambda b: S.polynomial_lr(b, 8, 2.0),
    ),
    Case(
        "warm-restarts",
        _cls("CosineAnnealingWarmRestarts", T_0=5),
        functional=lambda b: S.cosine_annealing_warm_restarts(b, 5),
    ),
    Case(
        "warm-restarts-mult2",
        _cls("CosineAnnealingWarmRestarts", T_0=2, T_mult=2, eta_min=0.001),
        steps=70,
        functional=lambda b: S.cosine_annealing_warm_restarts(b, 2, 2, 0.001),
    ),
    Case(
        "warm-restarts-mult3",
        _cls("CosineAnnealingWarmRestarts", T_0=3, T_mult=3),
        steps=130,
        lrs=(0.1,),
        functional=lambda b: S.cosine_annealing_warm_restarts(b, 3, 3),
    ),
    Case(
        "cyclic-triangular",
        _cls("CyclicLR", 0.01, 0.1, step_size_up=4, step_size_down=2),
        functional=lambda b: S.cyclic_lr(0.01, 0.1, 4, 2),
        momentum=S.cyclic_momentum(0.8, 0.9, 4, 2),
    ),
    Case(
        "cyclic-triangular2",
        _cls("CyclicLR", [0.01, 0.02], 0.1, step_size_up=3, mode="triangular2"),
        functional=lambda b: S.cyclic_lr(0.01, 0.1, 3, mode="triangular2"),
        momentum=S.cyclic_momentum(0.8, 0.9, 3, mode="triangular2"),
    ),
    Case(
        "cyclic-exp-range-adam",
        _cls("CyclicLR", 0.001, [0.1, 0.05], 5, 3, mode="exp_range", gamma=0.97),
        optimizer="adam",
        functional=lambda b: S.cyclic_lr(0.001, 0.1, 5, 3, mode="exp_range", gamma=0.97),
        momentum=S.cyclic_momentum(0.8, 0.9, 5, 3, mode="exp_range", gamma=0.97),
    ),
    Case(
        "cyclic-scale-fn-cycle",
        _cls("CyclicLR", 0.01, 0.1, 3, scale_fn=_cycle_scale, base_momentum=0.7),
        functional=lambda b: S.cyclic_lr(0.01, 0.1, 3, scale_fn=_cycle_scale),
        momentum=S.cyclic_momentum(0.7, 0.9, 3, scale_fn=_cycle_scale),
    ),
    Case(
        "cyclic-scale-fn-iterations",
        _cls("CyclicLR", 0.01, 0.1, 2, 5, scale_fn=_cycle_scale, scale_mode="iterations"),
        functional=lambda b: S.cyclic_lr(
            0.01, 0.1, 2, 5, scale_fn=_cycle_scale, scale_mode="iterations"
        ),
    ),
    Case(
        "cyclic-no-momentum",
        _cls("CyclicLR", 0.05, 0.2, 6, cycle_momentum=False),
        functional=lambda b: S.cyclic_lr(0.05, 0.2, 6),
    ),
    Case(
        "cyclic-long-period",
        _cls("CyclicLR", 0.0, 0.1, 300, 200),
        steps=1100,
        lrs=(0.1,),
        functional=lambda b: S.cyclic_lr(0.0, 0.1, 300, 200),
    ),
    Case(
        "one-cycle-cos",
        _cls("OneCycleLR", 0.1, total_steps=50),
        steps=50,
        functional=lambda b: S.one_cycle_lr(0.1, 50),
        momentum=S.one_cycle_momentum(50),
    ),
    Case(
        "one-cycle-linear-adam",
        _cls("OneCycleLR", [0.1, 0.3], epochs=4, steps_per_epoch=10, anneal_strategy="linear"),
        steps=40,
        optimizer="adam",
        functional=lambda b: S.one_cycle_lr(
            0.1, epochs=4, steps_per_epoch=10, anneal_strategy="linear"
        ),
        momentum=S.one_cycle_momentum(epochs=4, steps_per_epoch=10, anneal_strategy="linear"),
    ),
    Case(
        "one-cycle-three-phase",
        _cls("OneCycleLR", 0.2, total_steps=47, pct_start=0.25, three_phase=True),
        steps=47,
        functional=lambda b: S.one_cycle_lr(0.2, 47, pct_start=0.25, three_phase=True),
        momentum=S.one_cycle_momentum(47, pct_start=0.25, three_phase=True),
    ),
    Case(
        "one-cycle-factors",
        _cls(
            "OneCycleLR",
            0.5,
            total_steps=31,
            pct_start=0.4,
            div_factor=10.0,
            final_div_factor=100.0,
            cycle_momentum=False,
            base_momentum=0.5,
        ),
        steps=31,
        functional=lambda b: S.one_cycle_lr(
            0.5, 31, pct_start=0.4, div_factor=10.0, final_div_factor=100.0
        ),
    ),
    Case(
        "sequential",
        _sequential,
        functional=lambda b: S.sequential(
            [S.linear_lr(b), S.exponential_lr(b, 0.9), S.cosine_annealing_lr(b, 6)], [5, 12]
        ),
    ),
    Case(
        "sequential-mixed",
        _sequential_mixed,
        functional=lambda b: S.sequential(
            [
                S.constant_lr(b, 0.5, 3),
                S.step_lr(b, 4, 0.5),
                S.cosine_annealing_warm_restarts(b, 3),
                S.lambda_lr(b, _inverse),
            ],
            [4, 13, 20],
        ),
    ),
    Case(
        "chained",
        _chained,
        functional=lambda b: S.chained(
            b, [S.constant_lr(b), S.exponential_lr(b, 0.95), S.cosine_annealing_lr(b, 40)]
        ),
    ),
    Case(
        "chained-decays",
        _chained_decays,
        functional=lambda b: S.chained(
            b,
            [
                S.linear_lr(b, 0.2, 1.0, 6),
                S.multi_step_lr(b, [3, 8, 8]),
                S.polynomial_lr(b, 30, 0.5),
                S.multiplicative_lr(b, _alternating_decay),
            ],
        ),
    ),
]


def case_id(case: Case) -> str:
    return case.id


def torch_rows(case: Case, **kwargs: Any) -> tuple[list, Any]:
    """The torch trajectory of ``case`` (and the scheduler)."""
    opt = torch_optimizer(case.optimizer, case.lrs)
    return run(case.build, torch.optim.lr_scheduler, opt, case.steps, **kwargs)
