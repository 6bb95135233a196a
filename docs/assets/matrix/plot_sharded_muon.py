"""Draw sharded Muon's layout: whole matrices per device (docs/optimizers/matrix.md).

    python docs/assets/matrix/plot_sharded_muon.py            # writes sharded_muon.png beside it
    python docs/assets/matrix/plot_sharded_muon.py OUT.png    # somewhere else

One shape class of K = 12 matrices (GPT-2 small's 12 ``mlp.c_fc`` weights, say) over a mesh
axis of D = 8 devices: the class's [K, M, N] stack, padded with zero matrices to a multiple
of D; device d takes slices d·K'/D ... (d+1)·K'/D - 1 (K' the padded count) and runs the
Newton-Schulz iteration on them alone; one all-gather gives every device the K new values.
The momentum buffers, stored sharded by rows, are moved into that layout and back.

Nothing is measured or random: the same matplotlib draws the same image (no date in it).
Needs matplotlib (the ``test`` extra has it).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

K = 12  # matrices in the shape class
D = 8  # devices of the mesh axis
PADDED = D * math.ceil(K / D)  # 16
PER_DEVICE = PADDED // D  # 2
COLORS = plt.get_cmap("tab10").colors
OUT = Path(__file__).resolve().with_name("sharded_muon.png")


def owner(k: int) -> int:
    """The device that runs slice ``k``'s iteration."""
    return k // PER_DEVICE


def _matrix(ax, x: float, y: float, w: float, h: float, k: int, label: bool = True) -> None:
    """Slice ``k`` of the stack as a box at (x, y), colored by its device; padding hatched."""
    pad = k >= K
    ax.add_patch(
        Rectangle(
            (x, y),
            w,
            h,
            facecolor="white" if pad else COLORS[owner(k)],
            edgecolor=COLORS[owner(k)],
            hatch="///" if pad else None,
            lw=1.2,
        )
    )
    if label:
        ax.text(
            x + w / 2,
            y + h / 2,
            "0" if pad else str(k),
            ha="center",
            va="center",
            fontsize=8,
            color="black" if pad else "white",
            weight="bold",
        )


def _arrow(ax, start: tuple[float, float], end: tuple[float, float], lw: float = 1.0) -> None:
    style = {"arrowstyle": "-|>", "mutation_scale": 10, "lw": lw, "color": "0.35"}
    ax.add_patch(FancyArrowPatch(start, end, **style))


def _label(ax, x: float, y: float, text: str, **style) -> None:
    ax.text(x, y, text, ha="center", va="center", **style)


def draw(output: Path = OUT) -> Path:
    """Draws the figure into ``output`` (a PNG) and returns its path."""
    fig = plt.figure(figsize=(10, 7))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 7)
    ax.axis("off")
    w = h = 0.42
    gap = 0.06
    col_w = 10 / D

    # 1. the class's stack, padded to a multiple of D
    _label(
        ax,
        5,
        6.7,
        f"one shape class: K = {K} matrices stacked [K, M, N], padded with {PADDED - K} zero "
        f"matrices to {PADDED} = {PER_DEVICE} x D\n(D = {D} devices of the mesh axis; device d "
        f"takes slices d·{PADDED}/D ... (d+1)·{PADDED}/D - 1: {PER_DEVICE}d and {PER_DEVICE}d+1)",
        fontsize=10,
    )
    top = 5.9
    left = (10 - PADDED * (w + gap)) / 2
    stack_x = [left + k * (w + gap) for k in range(PADDED)]
    for k, x in enumerate(stack_x):
        _matrix(ax, x, top, w, h, k)

    # 2. each device's own whole matrices: slices d*K'/D ... (d+1)*K'/D - 1
    box_y = 4.25
    for d in range(D):
        cx = d * col_w + col_w / 2
        frame = Rectangle(
            (d * col_w + 0.1, box_y - 0.12),
            col_w - 0.2,
            h + 0.24,
            facecolor="none",
            edgecolor="0.6",
            lw=0.8,
            ls="--",
        )
        ax.add_patch(frame)
        for i, k in enumerate(range(d * PER_DEVICE, (d + 1) * PER_DEVICE)):
            x = cx - PER_DEVICE * (w + gap) / 2 + gap / 2 + i * (w + gap)
            _matrix(ax, x, box_y, w, h, k)
            _arrow(ax, (stack_x[k] + w / 2, top), (x + w / 2, box_y + h + 0.12), lw=0.6)
        real = sum(k < K for k in range(d * PER_DEVICE, (d + 1) * PER_DEVICE))
        _label(ax, cx, box_y - 0.32, f"device {d}", fontsize=9, color=COLORS[d], weight="bold")
        _label(
            ax,
            cx,
            box_y - 0.55,
            f"NS on {real} of {K}" if real else "padding only",
            fontsize=7.5,
            color="0.25",
        )
    _label(
        ax,
        5,
        3.25,
        "each device runs the Newton-Schulz iteration on its own whole matrices inside "
        "shard_map:\nno collective inside the iteration; each device's work is "
        f"ceil(K/D)/K = {PER_DEVICE}/{K} of the class's",
        fontsize=9.5,
    )

    # 3. one all-gather per class: every device holds the K new values
    _label(ax, 5, 2.65, "one all-gather per class: every device gets the K new values", fontsize=10)
    gathered_y = 1.55
    small = (col_w - 0.3) / K
    for d in range(D):
        cx = d * col_w + col_w / 2
        _arrow(ax, (cx, 2.45), (cx, gathered_y + 0.5))
        for k in range(K):
            _matrix(ax, d * col_w + 0.15 + k * small, gathered_y, small * 0.9, 0.42, k, False)
        _label(ax, cx, gathered_y - 0.2, f"device {d}", fontsize=8, color=COLORS[d])

    # the momentum at rest: one matrix's rows over the D devices, moved to its owner and back
    band_x, whole_x, y0 = 0.4, 1.6, 0.3
    for d in range(D):
        band = Rectangle((band_x, y0 + (D - 1 - d) * h / D), w, h / D, facecolor=COLORS[d], lw=0)
        ax.add_patch(band)
    ax.add_patch(Rectangle((band_x, y0), w, h, facecolor="none", edgecolor="0.3", lw=0.8))
    _matrix(ax, whole_x, y0, w, h, 4)
    _arrow(ax, (band_x + w + 0.1, y0 + 0.28), (whole_x - 0.1, y0 + 0.28))
    _arrow(ax, (whole_x - 0.1, y0 + 0.14), (band_x + w + 0.1, y0 + 0.14))
    ax.text(
        whole_x + w + 0.2,
        y0 + h / 2,
        "the momentum buffers stay stored sharded by rows at rest (left: matrix 4's rows over "
        "the 8 devices);\nthey are moved into the by-matrix layout (right: matrix 4 whole, on "
        "device 2) before the update, and back after it",
        va="center",
        fontsize=8.5,
        style="italic",
        color="0.2",
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    # no date or software version in the file: the same drawing gives the same bytes
    fig.savefig(output, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", type=Path, default=OUT)
    args = parser.parse_args(argv)
    print(f"wrote {draw(args.output)}")


if __name__ == "__main__":
    main()
