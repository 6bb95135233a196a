"""Draw the benchmarks page's charts from the raw results in benchmarks/results/.

    python benchmarks/plot_results.py              # writes docs/assets/benchmarks/*.svg
    python benchmarks/plot_results.py --out DIR    # somewhere else (the tests use a tmp dir)

Each chart reads one measurement's raw output, the one docs/benchmarks.md quotes, and
says in its title the hardware and date of that run; nothing here is typed in by hand.
Needs matplotlib (the ``test`` extra has it). tests/test_benchmark_charts.py runs this
script, so a change of a results file's format that breaks a chart fails the tests.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# text as text (the page's font, searchable, a tenth of the size of glyphs drawn as paths)
plt.rcParams["svg.fonttype"] = "none"

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "assets" / "benchmarks"
SETS = ["gpt2_small", "gpt2_xl", "one_tensor", "many_small"]
SET_LABELS = [
    "gpt2_small\n148 tensors",
    "gpt2_xl\n580 tensors",
    "one_tensor\n1 tensor",
    "many_small\n2000 tensors",
]
COLORS = {
    "torch fused": "#ee4c2c",
    "torch foreach": "#f4a582",
    "optax": "#4393c3",
    "lucid compiled": "#3f51b5",
    "lucid fused_step": "#9fa8da",
}


def _rows(*names: str) -> list[dict]:
    rows = []
    for name in names:
        rows += json.loads((RESULTS / name).read_text())["results"]
    return rows


def _save(fig: plt.Figure, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    # no timestamp or random ids in the file: the same results draw the same bytes
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return path


def compiled_step(out: Path) -> Path:
    """Speed-up over torch's fused step (pipelined), Adam, AdamW and SGD, every set."""
    rows = _rows("h200_adam_large.json", "h200_adam_many_small.json")
    rows += _rows("h200_adamw_sgd_large.json", "h200_adamw_sgd_many_small.json")
    impls = {
        "torch_foreach": "torch foreach",
        "optax": "optax",
        "compiled": "lucid compiled",
        "fused": "lucid fused_step",
    }
    optimizers = ["adam", "adamw", "sgd"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, optimizer in zip(axes, optimizers):
        ms = {(r["set"], r["impl"]): r["pipelined_ms"] for r in rows if r["optimizer"] == optimizer}
        width = 0.8 / len(impls)
        for k, (impl, label) in enumerate(impls.items()):
            xs, ys = [], []
            for i, s in enumerate(SETS):
                if (s, impl) in ms and (s, "torch_fused") in ms:
                    xs.append(i + (k - 1.5) * width)
                    ys.append(ms[(s, "torch_fused")] / ms[(s, impl)])
            ax.bar(xs, ys, width, label=label, color=COLORS[label])
        ax.axhline(1.0, color=COLORS["torch fused"], lw=1.2, ls="--", label="torch fused (= 1)")
        ax.set_yscale("log")
        ax.set_xticks(range(len(SETS)), SET_LABELS, fontsize=8)
        ax.set_title({"adam": "Adam", "adamw": "AdamW", "sgd": "SGD, momentum 0.9"}[optimizer])
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0].set_ylabel("speed-up over torch fused\n(pipelined step; log scale)")
    axes[-1].legend(fontsize=8, loc="upper left")
    fig.suptitle("One optimizer step, float32, NVIDIA H200, 2026-11-30", fontsize=11, y=1.03)
    return _save(fig, out, "compiled_step.svg")


def _gpt_loop_rows(text: str) -> dict[str, tuple[float, float]]:
    """loop name -> (synchronised, pipelined) ms per iteration, from the script's table."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(torch eager|optax jit|lucid \w+)\s+([\d.]+)\s+([\d.]+)\s+\d+", line)
        if m:
            out[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return out


def gpt_loop(out: Path) -> Path:
    """ms per iteration of the same GPT loop in torch, optax and lucid's three forms."""
    rows = _gpt_loop_rows((RESULTS / "h200_2026-12-02_gpt_loop.txt").read_text())
    names = ["torch eager", "optax jit", "lucid eager", "lucid compiled", "lucid fused"]
    colors = ["#ee4c2c", "#4393c3", "#9fa8da", "#3f51b5", "#7986cb"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], [rows[n][0] for n in names], 0.38, color=colors)
    ax.barh([y - 0.2 for y in ys], [rows[n][1] for n in names], 0.38, color=colors, alpha=0.5)
    for y, n in zip(ys, names):
        ax.text(rows[n][0] + 0.2, y + 0.2, f"{rows[n][0]:.2f}", va="center", fontsize=8)
        ax.text(rows[n][1] + 0.2, y - 0.2, f"{rows[n][1]:.2f} pipelined", va="center", fontsize=8)
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per iteration (solid: synchronised; light: pipelined)")
    ax.set_xlim(0, max(v[0] for v in rows.values()) * 1.25)
    ax.set_title("A 29.5M-parameter GPT, AdamW + LambdaLR + clipping, NVIDIA H200, 2026-12-02")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out, "gpt_loop.svg")


def _markdown_table(text: str, header_start: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, [c.strip() for c in line.strip("|").split("|")])))
    return rows


def eager_host(out: Path) -> Path:
    """The eager step's host time against torch foreach, tiny tensors, by tensor count."""
    text = (RESULTS / "cpu_eager_host_pieces_2026-12-06.txt").read_text()
    rows = _markdown_table(text, "| optimizer | params |")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, optimizer in zip(axes, ["Adam", "AdamW", "SGD"]):
        mine = [r for r in rows if r["optimizer"] == optimizer and r["groups"] == "1"]
        params = [int(r["params"]) for r in mine]
        for column, label, color in [
            ("torch for-loop", "torch for-loop", "#f4a582"),
            ("torch foreach", "torch foreach", "#ee4c2c"),
            ("lucid eager", "lucid eager", "#9fa8da"),
            ("lucid compiled", "lucid compiled", "#3f51b5"),
        ]:
            ax.plot(params, [float(r[column]) for r in mine], "o-", label=label, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(params, [str(p) for p in params])
        ax.set_xlabel("tensors of 16 floats (one group)")
        ax.set_title(optimizer + (" (momentum 0.9)" if optimizer == "SGD" else ""))
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("ms per opt.step() (log)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Host cost of one step, 2-core AMD EPYC CPU, 2026-12-06", fontsize=11, y=1.03)
    return _save(fig, out, "eager_host.svg")


def lowbit_step(out: Path) -> Path:
    """Low-bit compiled steps' speed relative to float32 AdamW, per parameter set."""
    text = (RESULTS / "h200_2026-12-04_torchao_flat.txt").read_text()
    data = json.loads(next(line for line in text.splitlines() if line.startswith('{"device"')))
    sets = list(data["sets"])
    variants = [v for v in data["sets"][sets[0]]["rows"] if v != "AdamW float32"]
    colors = ["#3f51b5", "#66bb6a", "#26a69a", "#ffa726"]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    width = 0.8 / len(variants)
    for k, variant in enumerate(variants):
        xs = [i + (k - (len(variants) - 1) / 2) * width for i in range(len(sets))]
        ys = [data["sets"][s]["rows"][variant]["ratio"] for s in sets]
        ax.bar(xs, ys, width, label=variant, color=colors[k % len(colors)])
    ax.axhline(1.0, color="black", lw=1, ls="--", label="float32 AdamW (= 1)")
    ax.set_xticks(range(len(sets)), sets)
    ax.set_ylabel("speed relative to\nfloat32 AdamW's step")
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    ax.set_ylim(0, 1.8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Compiled low-bit steps, NVIDIA H200, 2026-12-04 (above 1: faster)")
    return _save(fig, out, "lowbit_step.svg")


CHARTS = [compiled_step, gpt_loop, eager_host, lowbit_step]


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the SVGs")
    args = parser.parse_args(argv)
    paths = [chart(args.out) for chart in CHARTS]
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
