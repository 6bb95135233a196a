"""A checksum of every optimizer's numbers, to hold a refactor to them bit for bit.

    PYTHONPATH=. python benchmarks/checksum.py --out before.json
    PYTHONPATH=. python benchmarks/checksum.py --out after.json --compare before.json

For every optimizer x option set of `tests/cases.py`, and every other registered class
(bitsandbytes', torchao's, Schedule-Free's, Muon, SparseAdam, LBFGS) with its defaults,
x {eager, compiled, fused} x {float32, float64} (and bfloat16 for each class's first
option set), it runs 20 steps over
parameters on both sides of every size threshold of the engine (`tests/test_thresholds.py`
names them), in two groups, with gradients drawn per step (some absent at one step),
and records the SHA-256 of the parameters' bytes, the state_dict's arrays and its groups'
values. A run that raises records its error's type and message instead, so a refactor
also keeps what it refuses. `--compare` lists every run whose digest differs (exit 1).

Runs are spread over `--jobs` processes, a fresh one for every `BATCH` runs (one process
that compiles every run's programs runs out of memory maps: LLVM's "Cannot allocate
memory" after some hundred runs); the digests do not depend on that (each run is one
process's deterministic XLA:CPU program).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import multiprocessing
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

STEPS = 20
BATCH = 8  # runs per process
FORMS = ("eager", "compiled", "fused")
DTYPES = ("float32", "float64", "bfloat16")


def _shapes(rule_name: str, dtype: str) -> list[list[tuple[int, ...]]]:
    """The parameters' shapes, per group (`tests/cases.py`'s threshold-crossing groups; the
    group of more parameters than one eager call holds only in float32, where it costs the
    least to compile). The matrix optimizers take small matrices (and SOAP, Shampoo and
    Kron a vector): a preconditioner of the threshold groups' 16385-element vector is a
    16385 x 16385 matrix, decomposed at every step."""
    from cases import ACROSS_THRESHOLDS, MANY_SMALL, TINY_GROUP

    if rule_name == "Muon":  # matrices only
        return [[(3, 2), (64, 260), (4, 5), (129, 128)], [(2, 2), (5, 3)]]
    if rule_name in ("SOAP", "Shampoo", "Kron"):
        return [[(3, 2), (40, 24), (7,), (2, 3, 4)], [(2, 2), (5, 3)]]
    groups = [ACROSS_THRESHOLDS, TINY_GROUP]
    return [*groups, MANY_SMALL] if dtype == "float32" else groups


def runs() -> list[tuple[str, str, dict[str, Any], str, str]]:
    """Every ``(run id, class path, options, form, dtype)``."""
    from cases import CASES, case_id

    import lucid  # noqa: F401
    from lucid.optim._registry import registered

    # (id, class path, options, whether bfloat16 runs too: each class's first set)
    configs: list[tuple[str, str, dict[str, Any], bool]] = []
    seen: set[str] = set()
    for name, options in CASES:
        key = f"torch.optim.{case_id((name, options))}"
        configs.append((key, f"lucid.optim.{name}", options, name not in seen))
        seen.add(name)
    for entry in registered():
        if entry.reference == "torch.optim" and entry.name in seen:
            continue
        path = f"{entry.cls.__module__}.{entry.name}"
        lr = inspect.signature(entry.cls).parameters.get("lr")
        # a required lr (bitsandbytes' SGD and LARS, as theirs) is given one, with the
        # momentum those refuse to run without
        required = lr is not None and lr.default is lr.empty
        options = {"lr": 0.01, "momentum": 0.9} if required else {}
        configs.append((f"{entry.reference}.{entry.name}", path, options, True))
    return [
        (f"{key}|{form}|{dtype}", path, options, form, dtype)
        for key, path, options, half in configs
        for form in FORMS
        for dtype in DTYPES
        if half or dtype != "bfloat16"
    ]


def _class(path: str) -> type:
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _leaves(key: str, value: Any) -> list[tuple[str, Any]]:
    """A state entry's arrays with their dotted keys, nested mappings (bitsandbytes'
    ``__bnb_optimizer_quant_state__``) entered in sorted order and lists in theirs."""
    if isinstance(value, dict):
        return [leaf for name in sorted(value) for leaf in _leaves(f"{key}.{name}", value[name])]
    if isinstance(value, list | tuple):  # a list of arrays of several shapes (SOAP's, Kron's)
        return [leaf for i, item in enumerate(value) for leaf in _leaves(f"{key}.{i}", item)]
    return [(key, value)]


def _digest_of(params: list, opt: Any) -> str:
    import numpy as np

    h = hashlib.sha256()
    for p in params:
        a = np.asarray(p.data)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    sd = opt.state_dict()
    for index in sorted(sd["state"]):
        for key, value in _leaves(str(index), sd["state"][index]):
            if value is None:  # an entry not yet filled (LBFGS' history)
                h.update(f"{key}None".encode())
                continue
            a = np.asarray(value)
            if a.dtype == object:  # its bytes would be pointers, different every run
                raise TypeError(f"state entry {key} is no array: {type(value).__name__}")
            h.update(f"{key}{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
    for group in sd["param_groups"]:
        h.update(repr(sorted((k, v) for k, v in group.items() if k != "params")).encode())
    return h.hexdigest()


def run_one(path: str, options: dict[str, Any], form: str, dtype: str) -> str:
    """One run's digest (or ``error: Type: message``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import lucid

    cls = _class(path)
    groups = _shapes(cls.rule.name if hasattr(cls, "rule") else cls.__name__, dtype)
    rng = np.random.default_rng(0)
    boxes = [
        [lucid.Parameter(jnp.asarray(rng.normal(size=s), dtype)) for s in shapes]
        for shapes in groups
    ]
    params = [p for ps in boxes for p in ps]
    closure_class = "Closure" in cls.__name__ or cls.__name__ == "LBFGS"
    try:
        # LBFGS takes one group (torch's refuses several)
        opt = cls(
            params if cls.__name__ == "LBFGS" else [{"params": ps} for ps in boxes], **options
        )
        if hasattr(opt, "train"):
            opt.train()
        if form == "compiled":
            opt = lucid.compile_optimizer(opt)
        fused = None
        if form == "fused":
            fused = lucid.fused_step(
                lambda tree, gs: sum(jnp.sum(p * g) for p, g in zip(tree, gs)), opt
            )
        targets = [jnp.asarray(rng.normal(size=p.shape), dtype) for p in params]
        for step in range(STEPS):
            grads = [jnp.asarray(rng.normal(size=p.shape), dtype) for p in params]
            if cls.__name__ == "SparseAdam":
                grads = [jax.experimental.sparse.BCOO.fromdense(g) for g in grads]
            if fused is not None:
                fused(params, grads)
                continue
            absent = step == 3
            if closure_class:

                def closure(params=params, targets=targets):
                    opt.zero_grad()
                    return lucid.backward(
                        lambda tree: sum(
                            0.5 * jnp.sum((p - t).astype(jnp.float32) ** 2)
                            for p, t in zip(tree, targets)
                        ),
                        params,
                    )

                opt.step(closure)
                continue
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = None if absent and i % 3 == 1 else g
            opt.step()
        return _digest_of(params, opt)
    except Exception as error:  # the refusal is part of what a refactor must keep
        return f"error: {type(error).__name__}: {str(error).splitlines()[0][:200]}"


def _worker(batch: list[tuple[str, str, dict, str, str]]) -> dict[str, str]:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.experimental.sparse

    return {key: run_one(path, options, form, dtype) for key, path, options, form, dtype in batch}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the digests (JSON)")
    parser.add_argument("--compare", help="digests of an earlier run (JSON) to compare with")
    parser.add_argument(
        "--only",
        default="",
        help="run only ids containing this text (or one of several, comma-separated)",
    )
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()

    only = args.only.split(",")
    todo = [r for r in runs() if any(text in r[0] for text in only)]
    batches = [todo[k : k + BATCH] for k in range(0, len(todo), BATCH)]
    context = multiprocessing.get_context("spawn")
    digests: dict[str, str] = {}
    with context.Pool(args.jobs, maxtasksperchild=1) as pool:
        for part in pool.imap_unordered(_worker, batches):
            digests.update(part)
    digests = dict(sorted(digests.items()))
    with open(args.out, "w") as f:
        json.dump(digests, f, indent=1)
    errors = sum(v.startswith("error") for v in digests.values())
    print(f"{len(digests)} runs, {errors} refused with an error; written to {args.out}")
    if not args.compare:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    differing = [k for k in digests if k in before and before[k] != digests[k]]
    missing = [k for k in before if k not in digests and any(text in k for text in only)]
    for key in differing:
        print(f"DIFFERS {key}: {before[key][:60]} -> {digests[key][:60]}")
    for key in missing:
        print(f"MISSING {key}")
    print(f"{len(differing)} differ, {len(missing)} missing of {len(before)} compared")
    return 1 if differing or missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
