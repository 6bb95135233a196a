"""Run the torch-parity state machine (tests/test_stateful_torch.py) for a long profile.

    PYTHONPATH=. python benchmarks/stateful_profile.py --sequences 2000 --steps 30

The CI profile of the test is small and derandomized; this one is random (or
seeded with ``--seed``) and as long as asked. It runs the machine in chunks of
``--chunk`` examples; a failing chunk is one divergence from torch, whose
minimal operation sequence hypothesis prints (``--no-shrink`` prints the
unshrunk one and saves the shrinking time), and the run goes on with the next
chunk. At the end it prints the sequences and operations run (shrinking
replays included), the divergences found (0 expected) and the time taken.
Exit status 1 when any divergence was found.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # as tests/conftest.py does

from hypothesis import HealthCheck, Phase, seed, settings  # noqa: E402
from hypothesis.stateful import get_state_machine_test  # noqa: E402
from test_stateful_torch import ORBAX, STATS, TorchParityMachine  # noqa: E402

from lucid.optim._engine import eager, programs  # noqa: E402


def distinct_failures(error: BaseException) -> list[BaseException]:
    """Hypothesis reports several distinct failures as an exception group."""
    return list(getattr(error, "exceptions", None) or [error])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=2000, help="examples to generate")
    parser.add_argument("--steps", type=int, default=30, help="operations per sequence (at most)")
    parser.add_argument("--chunk", type=int, default=200, help="examples per hypothesis run")
    parser.add_argument("--seed", type=int, default=None, help="base seed (default: random)")
    parser.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    parser.add_argument(
        "--orbax-one-in",
        type=int,
        default=ORBAX["one_in"],
        help="orbax checkpoints in one sequence of this many (1: in every sequence)",
    )
    args = parser.parse_args()
    ORBAX["one_in"] = args.orbax_one_in
    # lucid's order warning for schedulers stepped before the optimizer, as torch's:
    # legitimate in random sequences, and thousands of lines otherwise
    warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)

    base_seed = args.seed if args.seed is not None else random.getrandbits(32)
    phases = [Phase.generate] if args.no_shrink else [Phase.generate, Phase.shrink]
    print(f"base seed {base_seed}; {args.sequences} sequences of up to {args.steps} operations")

    divergences = 0
    start = time.perf_counter()
    done, chunk_index = 0, 0
    while done < args.sequences:
        n = min(args.chunk, args.sequences - done)
        profile = settings(
            max_examples=n,
            stateful_step_count=args.steps,
            deadline=None,
            database=None,
            derandomize=False,
            phases=phases,
            suppress_health_check=list(HealthCheck),
        )
        test = seed(base_seed + chunk_index)(
            get_state_machine_test(TorchParityMachine, settings=profile)
        )
        try:
            test()
        except Exception as error:  # every failure is a finding; go on with the next chunk
            failures = distinct_failures(error)
            divergences += len(failures)
            print(
                f"\n=== chunk {chunk_index} (seed {base_seed + chunk_index}): "
                f"{len(failures)} divergence(s) ==="
            )
            traceback.print_exception(error)
        done += n
        chunk_index += 1
        # every sequence compiles programs of its own; without this a long profile
        # grows jax's caches until compilation runs out of memory
        jax.clear_caches()
        for cache in (
            eager.group_program,
            programs.step_program,
            programs.fused_program,
            programs.transformed_step_program,
        ):
            cache.cache_clear()
        gc.collect()
        elapsed = time.perf_counter() - start
        print(
            f"[{elapsed:7.1f} s] {done}/{args.sequences} examples, "
            f"{STATS['sequences']} sequences and {STATS['operations']} operations run, "
            f"{divergences} divergence(s)",
            flush=True,
        )

    elapsed = time.perf_counter() - start
    print("\nsummary")
    print(f"  examples requested: {done} (a chunk stops at its first failure)")
    print(f"  sequences run:      {STATS['sequences']} (shrinking replays included)")
    print(f"  operations run:     {STATS['operations']}")
    print(f"  divergences found:  {divergences} (0 expected)")
    print(f"  time:               {elapsed:.1f} s")
    print(
        "  operations by rule: " + ", ".join(f"{k} {v}" for k, v in sorted(STATS["rules"].items()))
    )
    return 1 if divergences else 0


if __name__ == "__main__":
    sys.exit(main())
