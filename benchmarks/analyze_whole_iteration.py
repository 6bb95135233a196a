"""Where the kernels of a whole iteration over many small tensors come from.

    PYTHONPATH=. python benchmarks/analyze_whole_iteration.py [--n N] [--size 4096]

The model of `bench_whole_iteration.py` (``n`` separate parameters of ``size`` floats,
the trivial loss ``sum(vdot(p, c))``, Adam). For each way of running one iteration it
runs a few iterations with XLA's HLO dump on, profiles one more, and prints

- the executables one iteration runs (from the profile: every jitted call),
- for each, the ops of its optimized HLO that run as kernels (every instruction of the
  entry computation but parameters, constants, tuples and bitcasts), by opcode, and by
  source: each op is attributed through the stack frames XLA keeps in its metadata to
  the user's loss (forward / backward), lucid's views cut from flat buffers
  (``layout.views_of``), the join of per-parameter gradients into a flat buffer
  (``layout.join_views``), the optimizer's update (the rule), the hyper-parameters, or
  anything else; a fusion holding ops of several sources is counted under all of them
  (``views+loss``);
- on a GPU, the device kernels the profile recorded for one iteration.

The ways: ``backward+compiled`` (``lucid.backward`` then the compiled step),
``fused`` (``lucid.fused_step``), ``fused-stacked`` (``fused_step`` over one
``(n, size)`` Parameter and the batched loss ``sum(P * C)``: the same numbers, had the
model stacked its tensors), and two references that use no lucid at all:
``jax-separate`` (``jax.value_and_grad`` of the same loss over ``n`` separate
arrays: what the user's loss costs by itself) and ``jax-stacked`` (the same loss
over one ``(n, size)`` array, ``sum(P * C)``: what a batched loss costs).

The counts are XLA's and differ between backends (XLA:CPU calls a library for each
dot and cannot fuse a slice into it; XLA:GPU fuses differently): run it where the
numbers are wanted. It needs jax's ``jax.profiler.ProfileData`` (recent jax; 0.4.35 has
none) for the executables and kernels per iteration; without it those columns are blank.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import tempfile
import time

DUMP = tempfile.mkdtemp(prefix="lucid_hlo_")
PROGRAMS = "jit_(run|step|fused|separate|stacked)"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text --xla_dump_hlo_module_re={PROGRAMS}"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import lucid  # noqa: E402

NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all"}
OPCODES = ("fusion", "copy", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate")


def loss_fn(params, consts):
    """The benchmark's loss: every parameter separately."""
    return sum(jnp.vdot(p, c) for p, c in zip(params, consts))


def stacked_loss(stacked, consts):
    """The same loss over one stacked array (what a batched model computes)."""
    return jnp.sum(stacked * consts)


# ----------------------------------------------------------------- HLO parsing
class Module:
    """An optimized HLO module's text: its computations and source locations."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.computations: dict[str, list[str]] = {}
        self.entry = ""
        name, body = None, []
        for line in text.splitlines():
            head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
            if head and not line.startswith(" "):
                name, body = head.group(2), []
                if head.group(1):
                    self.entry = name
            elif line.startswith("}") and name is not None:
                self.computations[name] = body
                name = None
            elif name is not None:
                body.append(line)
        self.frames = self._frames(text)
        self.lines = {}  # instruction name -> its line, over every computation
        for body in self.computations.values():
            for line in body:
                match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
                if match:
                    self.lines.setdefault(match.group(1), line)

    @staticmethod
    def _frames(text: str) -> dict[int, list[tuple[str, str]]]:
        """stack frame id -> [(file, function), ...] innermost first (newer jax);
        empty where the text has no StackFrames section (jax 0.4: source_file)."""

        def section(title: str) -> list[str]:
            match = re.search(rf"^{title}\n((?:\d+ .*\n)+)", text, re.M)
            return match.group(1).splitlines() if match else []

        files = {int(x.split()[0]): x.split(" ", 1)[1].strip('"') for x in section("FileNames")}
        funcs = {int(x.split()[0]): x.split(" ", 1)[1].strip('"') for x in section("FunctionNames")}
        locations = {}
        for line in section("FileLocations"):
            f = re.search(r"file_name_id=(\d+) function_name_id=(\d+)", line)
            locations[int(line.split()[0])] = (files[int(f.group(1))], funcs[int(f.group(2))])
        parents = {}
        for line in section("StackFrames"):
            f = re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)", line)
            parents[int(line.split()[0])] = (int(f.group(1)), int(f.group(2)))
        chains = {}
        for frame in parents:
            chain, seen, current = [], set(), frame
            while current in parents and current not in seen:
                seen.add(current)
                location, parent = parents[current]
                chain.append(locations[location])
                current = parent
            chains[frame] = chain
        return chains

    def kernels(self) -> list[tuple[str, str, str]]:
        """``(name, opcode, fusion kind or '')`` of each entry op that runs as a kernel
        (while loops' bodies counted as their ops, once)."""
        out = []
        todo = [self.entry]
        while todo:
            for line in self.computations.get(todo.pop(), []):
                match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z\-]+)\(", line)
                if not match or match.group(2) in NOT_KERNELS:
                    continue
                if match.group(2) == "while":
                    body = re.search(r"body=%?([\w.\-]+)", line)
                    todo.append(body.group(1))
                    continue
                kind = re.search(r"kind=(k\w+)", line)
                out.append((match.group(1), match.group(2), kind.group(1) if kind else ""))
        return out

    def sources(self, name: str) -> set[str]:
        """The sources of an entry op: its own metadata and, for a fusion, that of
        every op it calls."""
        line = self.lines.get(name, "")
        lines, todo, seen = [line], re.findall(r"calls=%?([\w.\-]+)", line), set()
        while todo:
            called = todo.pop()
            if called in seen:
                continue
            seen.add(called)
            for inner in self.computations.get(called, []):
                lines.append(inner)
                todo += re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", inner)
        found = {source_of(x, self.frames) for x in lines if "metadata=" in x}
        found.discard(None)
        return found or {"other"}


def source_of(line: str, frames: dict) -> str | None:
    """What one HLO op was written for, from its metadata."""
    op_name = re.search(r'op_name="([^"]*)"', line)
    op_name = op_name.group(1) if op_name else ""
    frame = re.search(r"stack_frame_id=(\d+)", line)
    chain = frames.get(int(frame.group(1)), []) if frame else []
    if not chain:  # jax 0.4: only the innermost file and line
        source = re.search(r'source_file="([^"]*)"', line)
        chain = [(source.group(1), "")] if source else []
    for file, function in chain:
        file = file.replace(os.sep, "/")
        if file.endswith("benchmarks/analyze_whole_iteration.py") and function != "<module>":
            if (
                not function
                or function in ("loss_fn", "stacked_loss", "separate", "stacked")
                or ("<genexpr>" in function)
            ):  # the loss, or jax.value_and_grad's own ops around it (the references); no
                # function: jax 0.4's metadata names only the innermost file
                return "loss backward" if "transpose(" in op_name else "loss forward"
            continue
        if file.endswith("_engine/layout.py"):
            if function.startswith("views_of") or (not function and "slice" in op_name):
                return "views"
            return "join"
        if "/lucid/functional/" in file:
            return "update"
        if file.endswith("_engine/programs.py") and function.startswith("_hyper_of"):
            return "hyper"
        if file.endswith("_engine/programs.py") and function.startswith("fused_program"):
            continue
    return None if not op_name else "other"


# ----------------------------------------------------------------- the ways
def build(n: int, size: int):
    key = jax.random.PRNGKey(0)
    shape = (size,)
    values = [jax.random.normal(jax.random.fold_in(key, i), shape) * 0.01 for i in range(n)]
    consts = [jnp.full(shape, 1e-3, jnp.float32) for _ in range(n)]
    return values, consts


def ways(n: int, size: int) -> dict:
    """name -> a function running one iteration and returning what to wait for."""
    out = {}

    def compiled():
        values, consts = build(n, size)
        params = [lucid.Parameter(v) for v in values]
        opt = lucid.optim.Adam(params, lr=1e-3)
        lucid.compile_optimizer(opt)

        def step():
            opt.zero_grad()
            lucid.backward(loss_fn, params, consts)
            opt.step()
            return params[-1].location[0].buffer

        return step

    def fused():
        values, consts = build(n, size)
        params = [lucid.Parameter(v) for v in values]
        opt = lucid.optim.Adam(params, lr=1e-3)
        run = lucid.optim.fused_step(loss_fn, opt)

        def step():
            return run(params, consts), params[-1].location[0].buffer

        return step

    def fused_stacked():
        values, consts = build(n, size)
        param = lucid.Parameter(jnp.stack(values))
        stacked_consts = jnp.stack(consts)
        opt = lucid.optim.Adam([param], lr=1e-3)
        run = lucid.optim.fused_step(stacked_loss, opt)
        return lambda: (run(param, stacked_consts), param.location[0].buffer)

    def separate():
        values, consts = build(n, size)

        def separate(values, consts):
            return jax.value_and_grad(loss_fn)(values, consts)

        program = jax.jit(separate)
        return lambda: program(values, consts)

    def stacked():
        values, consts = build(n, size)
        stacked_values, stacked_consts = jnp.stack(values), jnp.stack(consts)

        def stacked(values, consts):
            return jax.value_and_grad(stacked_loss)(values, consts)

        program = jax.jit(stacked)
        return lambda: program(stacked_values, stacked_consts)

    out["backward+compiled"] = compiled
    out["fused"] = fused
    out["fused-stacked"] = fused_stacked
    out["jax-separate"] = separate
    out["jax-stacked"] = stacked
    return out


def profile_one(step) -> tuple[collections.Counter, collections.Counter] | None:
    """(jitted calls by name, device kernels by name) of one iteration, or None
    without jax's ProfileData."""
    ProfileData = getattr(jax.profiler, "ProfileData", None)
    if ProfileData is None:
        return None
    directory = tempfile.mkdtemp(prefix="lucid_profile_")
    try:
        with jax.profiler.trace(directory):
            jax.block_until_ready(step())
        path = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0]
        data = ProfileData.from_file(path)
    except Exception as error:  # a profiler that cannot run here: the HLO tables still do
        print(f"  (no profile: {type(error).__name__}: {error})")
        return None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    calls, kernels = collections.Counter(), collections.Counter()
    for plane in data.planes:
        device = plane.name.startswith("/device:")
        for line in plane.lines:
            outer_end = -1.0  # a jitted call shows as two nested events: count the outer
            for event in sorted(line.events, key=lambda e: e.start_ns):
                name = event.name
                if not device and name.startswith("PjitFunction("):
                    if event.start_ns >= outer_end:
                        calls[name[len("PjitFunction(") : -1]] += 1
                        outer_end = event.start_ns + event.duration_ns
                elif device and "stream" in line.name.lower():  # a GPU's kernels and copies
                    kernels[name] += 1
    return calls, kernels


def analyze(name: str, make, warmup: int) -> dict:
    before = set(os.listdir(DUMP))
    start = time.perf_counter()
    step = make()
    for _ in range(warmup):
        jax.block_until_ready(step())
    warm_s = time.perf_counter() - start
    profiled = profile_one(step)
    start = time.perf_counter()
    jax.block_until_ready(step())
    iteration_ms = 1e3 * (time.perf_counter() - start)
    new = sorted(set(os.listdir(DUMP)) - before)
    modules = {}
    for file in new:  # the last module compiled under each name
        match = re.match(r"module_\d+\.(jit_\w+?)\..*after_optimizations\.txt$", file)
        if match:
            modules[match.group(1)] = os.path.join(DUMP, file)
    return {
        "name": name,
        "modules": {k: Module(open(v).read()) for k, v in modules.items()},
        "profile": profiled,
        "warm_s": warm_s,
        "iteration_ms": iteration_ms,
    }


SOURCES = ("loss forward", "loss backward", "views", "join", "update", "hyper", "other")


GROUPS = ("user's loss", "lucid views", "lucid join", "optimizer", "copies", "other")


def group_of(opcode: str, sources: set[str], line: str) -> str:
    """The summary's column of one kernel."""
    if sources & {"loss forward", "loss backward"}:
        return "user's loss"
    if "views" in sources:
        return "lucid views"
    if "join" in sources:
        return "lucid join"
    if sources & {"update", "hyper"}:
        return "optimizer"
    if opcode == "copy":
        return "copies"
    return "other"


def report(results: list[dict]) -> None:
    print()
    print("Executables per iteration (profiled) and device kernels (GPU profile only):")
    print(f"  {'way':18s} {'executables':>11s} {'kernels':>8s}  calls")
    for r in results:
        if r["profile"] is None:
            print(f"  {r['name']:18s} {'':>11s} {'':>8s}  (no jax.profiler.ProfileData)")
            continue
        calls, kernels = r["profile"]
        listed = ", ".join(f"{k} x{v}" for k, v in sorted(calls.items()))
        kernel_count = sum(kernels.values())
        print(f"  {r['name']:18s} {sum(calls.values()):11d} {kernel_count or '-':>8}  {listed}")
    print()
    print("Optimized HLO, ops that run as kernels, by opcode:")
    head = " ".join(f"{x[:12]:>12s}" for x in ("total", *OPCODES, "custom-call", "other"))
    print(f"  {'way':18s} {'executable':12s} {head}")
    for r in results:
        for module_name, module in r["modules"].items():
            kernels = module.kernels()
            ops = collections.Counter(op for _, op, _ in kernels)
            row = [len(kernels), *(ops[x] for x in OPCODES), ops["custom-call"]]
            row.append(len(kernels) - sum(row[1:]))
            cells = " ".join(f"{x:12d}" for x in row)
            print(f"  {r['name']:18s} {module_name:12s} {cells}")
    print()
    print("The same ops by source (a fusion of several sources under each, joined by +):")
    for r in results:
        for module_name, module in r["modules"].items():
            by_source = collections.Counter()
            for name, opcode, kind in module.kernels():
                label = "+".join(s for s in SOURCES if s in module.sources(name))
                if opcode == "copy" and label == "other":  # one XLA inserted: of what
                    operand = re.search(
                        r" copy\((?:\S+ )?%?([\w.\-]+)\)", module.lines.get(name, "")
                    )
                    operand = re.sub(r"\d+", "N", operand.group(1)) if operand else "?"
                    label = f"copy of {operand.removesuffix('.N')}"
                by_source[f"{label} [{opcode}{'/' + kind if kind else ''}]"] += 1
            print(f"  {r['name']} / {module_name}:")
            for label, count in sorted(by_source.items(), key=lambda kv: -kv[1]):
                print(f"      {count:6d}  {label}")
    print()
    print("Summary, kernels per iteration by who asked for them (every executable):")
    print(f"  {'way':18s} " + " ".join(f"{x:>14s}" for x in ("total", *GROUPS)))
    for r in results:
        groups = collections.Counter()
        for module in r["modules"].values():
            for name, opcode, _ in module.kernels():
                groups[group_of(opcode, module.sources(name), module.lines.get(name, ""))] += 1
        cells = " ".join(f"{groups[x]:14d}" for x in GROUPS)
        print(f"  {r['name']:18s} {sum(groups.values()):14d} {cells}")
    print(
        "  (user's loss: an op of the loss, forward or backward, a view or gradient piece fused"
        " into it included;\n   views / join: lucid's slices of flat buffers and concatenation"
        " of gradients; copies: XLA's,\n   of the operand named in the listing above)"
    )
    if any(r["profile"] and r["profile"][1] for r in results):
        print()
        print("Device kernels of one iteration, by name (the 8 most frequent prefixes):")
        for r in results:
            _, kernels = r["profile"]
            prefixes = collections.Counter()
            for kernel, count in kernels.items():
                prefixes[re.sub(r"[._]?\d+$", "", kernel)] += count
            top = ", ".join(f"{k} x{v}" for k, v in prefixes.most_common(8))
            print(f"  {r['name']:18s} {top}")
    print()
    for r in results:
        print(
            f"  {r['name']:18s} warm-up {r['warm_s']:6.1f} s, "
            f"one iteration after it {r['iteration_ms']:8.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n",
        type=int,
        help="how many parameters (default 2000; 500 on the CPU, whose "
        "compilation of 2000 separate dots takes minutes; the counts grow linearly)",
    )
    parser.add_argument("--size", type=int, default=4096, help="floats per parameter")
    parser.add_argument(
        "--ways", default="backward+compiled,fused,fused-stacked,jax-separate,jax-stacked"
    )
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if args.n is None:
        args.n = 500 if jax.default_backend() == "cpu" else 2000
    print(f"jax {jax.__version__}, {jax.devices()[0]}, n={args.n} x {args.size}")
    results = []
    available = ways(args.n, args.size)
    for name in args.ways.split(","):
        results.append(analyze(name.strip(), available[name.strip()], args.warmup))
        print(f"  analysed {name.strip()}", flush=True)
    report(results)
    shutil.rmtree(DUMP, ignore_errors=True)


if __name__ == "__main__":
    main()
