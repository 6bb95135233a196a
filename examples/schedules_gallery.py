"""Plot every lucid schedule with torch's curve underneath, into one PNG, and one per scheduler.

    python examples/schedules_gallery.py [output.png]   # default: docs/assets/schedules.png
    python examples/schedules_gallery.py --each DIR     # default DIR: docs/assets/schedules/

The second form writes ``<Scheduler>.png`` for each class of
``lucid.optim.lr_scheduler`` (its panels side by side where the gallery has two),
the plots the API reference shows on each scheduler's entry, as torch's docs do.

Each panel draws torch.optim.lr_scheduler's learning rate after every
``step()`` (a wide pale line) and ``lucid.functional.schedules``' value at the
same counts, evaluated under ``jax.jit`` in float32 (dots); the title gives
the largest relative difference. NoamScheduler has no torch counterpart: its
panel overlays lucid's class (``lucid.optim.lr_scheduler``) instead.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import torch

import lucid.functional.schedules as S
from lucid.optim import lr_scheduler as LL

TL = torch.optim.lr_scheduler
BASE_LR = 0.1
PLATEAU_METRICS = [1.0 / (1 + 0.2 * t) if t < 25 else 0.17 + 0.001 * math.sin(t) for t in range(80)]


def torch_curve(build: Callable, steps: int, metrics: list[float] | None = None) -> np.ndarray:
    """Group 0's lr after construction and after each of ``steps`` steps."""
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=BASE_LR, momentum=0.9)
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        scheduler = build(optimizer)
        lrs.append(optimizer.param_groups[0]["lr"])
        for t in range(steps):
            optimizer.step()
            scheduler.step() if metrics is None else scheduler.step(metrics[t])
            lrs.append(optimizer.param_groups[0]["lr"])
    return np.array(lrs)


def lucid_curve(schedule: S.Schedule, steps: int) -> np.ndarray:
    return np.asarray(jax.jit(schedule)(jnp.arange(steps + 1)), np.float64)


def plateau_curve(steps: int) -> np.ndarray:
    plateau = S.reduce_lr_on_plateau(BASE_LR, patience=5, factor=0.5)

    def body(state, metric):
        state = plateau.update(state, metric)
        return state, state.lr

    _, lrs = jax.lax.scan(body, plateau.init(), jnp.asarray(PLATEAU_METRICS[:steps]))
    return np.concatenate([[BASE_LR], np.asarray(lrs, np.float64)])


def noam_class_curve(steps: int) -> np.ndarray:
    class Groups:
        def __init__(self):
            self.param_groups = [{"lr": BASE_LR}]

    optimizer = Groups()
    lrs = []
    with warnings.catch_warnings():
        # no optimizer steps here, so the scheduler warns as torch's would: expected
        warnings.simplefilter("ignore", UserWarning)
        scheduler = LL.NoamScheduler(optimizer, d_model=64, warmup_steps=15)
        lrs.append(optimizer.param_groups[0]["lr"])
        for _ in range(steps):
            scheduler.step()
            lrs.append(optimizer.param_groups[0]["lr"])
    return np.array(lrs)


def _inverse(epoch):
    return 1 / (1 + 0.1 * epoch)


def _decay(epoch):
    return 0.97


def panels() -> list[tuple[str, np.ndarray, np.ndarray, str]]:
    """(title, reference curve, lucid curve, reference name) for every schedule."""
    b, out = BASE_LR, []

    def add(title, build, schedule, steps):
        out.append((title, torch_curve(build, steps), lucid_curve(schedule, steps), "torch"))

    add(
        "StepLR(step_size=15, gamma=0.5)",
        lambda o: TL.StepLR(o, 15, 0.5),
        S.step_lr(b, 15, 0.5),
        80,
    )
    add(
        "MultiStepLR([20, 40, 40, 60])",
        lambda o: TL.MultiStepLR(o, [20, 40, 40, 60], 0.5),
        S.multi_step_lr(b, [20, 40, 40, 60], 0.5),
        80,
    )
    add("ExponentialLR(0.95)", lambda o: TL.ExponentialLR(o, 0.95), S.exponential_lr(b, 0.95), 80)
    add(
        "CosineAnnealingLR(T_max=25, eta_min=0.01)",
        lambda o: TL.CosineAnnealingLR(o, 25, 0.01),
        S.cosine_annealing_lr(b, 25, 0.01),
        80,
    )
    add(
        "LambdaLR(1 / (1 + 0.1 t))",
        lambda o: TL.LambdaLR(o, _inverse),
        S.lambda_lr(b, _inverse),
        80,
    )
    add(
        "MultiplicativeLR(0.97)",
        lambda o: TL.MultiplicativeLR(o, _decay),
        S.multiplicative_lr(b, _decay),
        80,
    )
    add(
        "LinearLR(0.25, 1.0, 30)",
        lambda o: TL.LinearLR(o, 0.25, 1.0, 30),
        S.linear_lr(b, 0.25, 1.0, 30),
        80,
    )
    add("ConstantLR(0.5, 30)", lambda o: TL.ConstantLR(o, 0.5, 30), S.constant_lr(b, 0.5, 30), 80)
    add(
        "PolynomialLR(60, power=2)",
        lambda o: TL.PolynomialLR(o, 60, 2.0),
        S.polynomial_lr(b, 60, 2.0),
        80,
    )
    add(
        "CosineAnnealingWarmRestarts(5, T_mult=2)",
        lambda o: TL.CosineAnnealingWarmRestarts(o, 5, 2, 0.005),
        S.cosine_annealing_warm_restarts(b, 5, 2, 0.005),
        80,
    )
    add(
        "CyclicLR(triangular2, up=8, down=12)",
        lambda o: TL.CyclicLR(o, 0.01, 0.1, 8, 12, mode="triangular2"),
        S.cyclic_lr(0.01, 0.1, 8, 12, mode="triangular2"),
        80,
    )
    add(
        "CyclicLR(exp_range, gamma=0.98)",
        lambda o: TL.CyclicLR(o, 0.01, 0.1, 10, mode="exp_range", gamma=0.98),
        S.cyclic_lr(0.01, 0.1, 10, mode="exp_range", gamma=0.98),
        80,
    )
    add("OneCycleLR(cos)", lambda o: TL.OneCycleLR(o, 0.1, 80), S.one_cycle_lr(0.1, 80), 80)
    add(
        "OneCycleLR(linear, three_phase)",
        lambda o: TL.OneCycleLR(o, 0.1, 80, anneal_strategy="linear", three_phase=True),
        S.one_cycle_lr(0.1, 80, anneal_strategy="linear", three_phase=True),
        80,
    )
    add(
        "SequentialLR(LinearLR, CosineAnnealingLR)",
        lambda o: TL.SequentialLR(
            o, [TL.LinearLR(o, 0.1, 1.0, 15), TL.CosineAnnealingLR(o, 65)], [15]
        ),
        S.sequential([S.linear_lr(b, 0.1, 1.0, 15), S.cosine_annealing_lr(b, 65)], [15]),
        80,
    )
    add(
        "ChainedScheduler(ConstantLR, ExponentialLR)",
        lambda o: TL.ChainedScheduler([TL.ConstantLR(o, 0.2, 20), TL.ExponentialLR(o, 0.97)]),
        S.chained(b, [S.constant_lr(b, 0.2, 20), S.exponential_lr(b, 0.97)]),
        80,
    )
    plateau = torch_curve(
        lambda o: TL.ReduceLROnPlateau(o, patience=5, factor=0.5), 80, PLATEAU_METRICS
    )
    out.append(("ReduceLROnPlateau(patience=5, factor=0.5)", plateau, plateau_curve(80), "torch"))
    noam = S.noam(64, 15)
    out.append(
        ("Noam(d_model=64, warmup=15)", noam_class_curve(80), lucid_curve(noam, 80), "lucid class")
    )
    return out


def relative_difference(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = np.maximum(np.abs(expected), np.finfo(np.float64).tiny)
    both_zero = (actual == 0) & (expected == 0)
    return float(np.max(np.where(both_zero, 0.0, np.abs(actual - expected) / scale)))


def _panel(ax: plt.Axes, curve: tuple[str, np.ndarray, np.ndarray, str]) -> None:
    title, reference, ours, reference_name = curve
    steps = np.arange(len(reference))
    ax.plot(steps, reference, color="#f4a259", linewidth=5, alpha=0.6, label=reference_name)
    ax.plot(steps, ours, ".", color="#1d3557", markersize=4, label="lucid (jit, float32)")
    ax.set_title(f"{title}\nmax rel. diff {relative_difference(ours, reference):.1e}", fontsize=10)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("step() calls", fontsize=8)
    ax.set_ylabel("lr", fontsize=8)
    ax.legend(fontsize=7, loc="best")


def draw(curves: list[tuple[str, np.ndarray, np.ndarray, str]], columns: int = 2) -> plt.Figure:
    """One panel per schedule: the reference curve, lucid's values over it.

    Two panels a row by default, so that the figure keeps its titles legible at the width of
    a page (at four a row it shrank to a quarter of that).
    """
    rows = math.ceil(len(curves) / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.6 * columns, 3.0 * rows), squeeze=False, layout="constrained"
    )
    for ax, curve in zip(axes.flat, curves, strict=False):
        _panel(ax, curve)
    for ax in list(axes.flat)[len(curves) :]:
        ax.axis("off")
    # a constrained layout keeps the title clear of the first row's (tight_layout did not)
    figure.suptitle("lucid.functional.schedules against torch.optim.lr_scheduler", fontsize=12)
    return figure


def scheduler_of(title: str) -> str:
    """The lucid.optim.lr_scheduler class a panel's title is about (Noam: NoamScheduler)."""
    name = title.split("(")[0]
    return "NoamScheduler" if name == "Noam" else name


def draw_each(curves: list[tuple[str, np.ndarray, np.ndarray, str]], directory: Path) -> list[Path]:
    """One PNG per scheduler class, ``<class>.png``, its panels side by side."""
    by_class: dict[str, list] = {}
    for curve in curves:
        by_class.setdefault(scheduler_of(curve[0]), []).append(curve)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, mine in by_class.items():
        figure, axes = plt.subplots(1, len(mine), figsize=(4.8 * len(mine), 2.9), squeeze=False)
        for ax, curve in zip(axes.flat, mine, strict=True):
            _panel(ax, curve)
        figure.tight_layout()
        path = directory / f"{name}.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default="docs/assets/schedules.png")
    parser.add_argument(
        "--each",
        type=Path,
        nargs="?",
        const=Path("docs/assets/schedules"),
        help="write one PNG per scheduler into this folder instead",
    )
    args = parser.parse_args(argv)
    output = Path(args.output)

    plt.switch_backend("Agg")
    curves = panels()
    if args.each is not None:
        written = draw_each(curves, args.each)
        print(f"wrote {len(written)} plots into {args.each}")
        return
    figure = draw(curves)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    print(f"wrote {output} ({len(curves)} schedules)")


if __name__ == "__main__":
    main()
