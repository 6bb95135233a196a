"""bitsandbytes' and torchao's low-bit optimizers past one device: their block-wise
quantized state sharded over 8 host CPU devices, ZeRO-1 style (replicated
parameters, ``shard_state_over``: each device updates and keeps the rows of every
state array) and FSDP style (parameters sharded along their first axis: the state
follows them), compiled and fused, with the single-device eager run's numbers; and
orbax checkpoints of that state. Each part runs `_lowbit_sharded_script.py` in a
subprocess (the device count is fixed when jax starts), one at a time
(tests/_distributed.py).

What is compared, and how exactly: codes, scales and float32 state bit for bit with
the eager run on one device, parameters bit for bit too, except after LAMB's and
LARS's trust ratio (a norm over the whole parameter, summed by each device over its
rows and then across devices: to float32 rounding). A fused step's gradient comes
from a partitioned backward pass: to rounding, codes one apart at most where a
value lies at a code boundary.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from _distributed import HOST_DEVICES, rendezvous_flags, run_host_program

HERE = Path(__file__).parent
pytestmark = HOST_DEVICES
TIMEOUT = 300  # seconds for one subprocess: far above the ~10-25 s each takes


def _run(part: str, directory: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    env["XLA_FLAGS"] = " ".join(["--xla_force_host_platform_device_count=8", *rendezvous_flags()])
    env["JAX_PLATFORMS"] = "cpu"
    env["TORCHDYNAMO_DISABLE"] = "1"
    result = run_host_program(
        [str(HERE / "_lowbit_sharded_script.py"), part, str(directory)], env, TIMEOUT
    )
    return result.stdout


def test_compiled_sharded_low_bit_state_is_cut_over_devices_with_the_eager_numbers(tmp_path):
    """compile_optimizer(shard_state_over="data") for bnb Adam8bit, AdamW8bit,
    Lion8bit, LAMB32bit, LARS32bit and torchao AdamW8bit, AdamW4bit, AdamWFp8
    (replicated parameters), and FSDP-sharded parameters for three of them: the
    eager single-device state and parameters, every state array whose first axis
    divides by 8 in 8 pieces, no float64 or host callback in the lowered float32
    step programs, and a mesh axis the mesh lacks refused when compiling."""
    out = _run("compiled", tmp_path)
    assert "lowered step programs checked" in out


def test_fused_step_with_sharded_low_bit_state_follows_eager_backward_and_step(tmp_path):
    """fused_step(loss_fn, opt, shard_state_over="data"): forward, backward and the
    sharded low-bit update in one executable, as eager backward + step to rounding."""
    out = _run("fused", tmp_path)
    assert "lowered fused programs checked" in out


def test_orbax_checkpoint_of_sharded_low_bit_state_resumes_sharded_or_on_one_device(
    tmp_path,
):
    """Saved piecewise with uint8 codes (orbax's own metadata), restored into a fresh
    sharded optimizer and into a single-device one: both step as the uninterrupted
    run, bit for bit. A failed save keeps the previous checkpoint; a checkpoint of
    another optimizer is refused and changes nothing."""
    pytest.importorskip("orbax.checkpoint")
    out = _run("checkpoint", tmp_path)
    assert "refused:" in out
