"""Sharded Muon: with ``shard_state_over``, whole matrices per device (8 host devices).

`compile_optimizer(opt, shard_state_over=axis)` over parameters replicated on a mesh deals
Muon's same-shaped matrices out whole to the devices of ``axis`` (`Execution.
whole_per_device`): each device runs the Newton-Schulz iteration on its own matrices, with
no collective inside it, and the new values are gathered once per class of shapes
(docs/optimizers/matrix.md draws it). Three promises, each checked here against the same
optimizer compiled on one device:

* **the numbers**: the momentum buffers bit for bit; the parameters within
  docs/distributed.md's bound (`sharded_bound`: ``6·T·ε·max|x|``). The Newton-Schulz
  products are the one-device products (each device multiplies whole matrices); only the
  last elementwise update of a class whose members' ``lr`` differ (two groups) may round
  once differently, where XLA contracts a product and a sum into one fused multiply-add
  in one program and not in the other.
* **no collective inside the iteration**: the compiled program's collectives (counted
  in its HLO) are as many with ``ns_steps=2`` as with ``ns_steps=6``. Cut by rows, as
  before, each iteration's products added collectives (the count grew with the steps).
* **each device's Newton-Schulz work is 1/N of the total**: the compiled program's
  floating-point operations per device (XLA's cost analysis) for 16 matrices of one shape
  on 8 devices are at most 1.1/8 of the one-device program's (the elementwise update
  beside the products is small at these shapes).

The inputs cross every threshold of the layout: a class of fewer matrices than devices
(3, padded to 8), one of more that is no multiple of them (10, padded to 16) whose members
are in two groups of different ``lr`` (its ``lr`` stacked), a class of one, a matrix whose
rows do not divide over the devices (its state kept replicated), and a stack of matrices
(``batched_matrices=True``); a 1-D mesh, one axis of a 2-D mesh and both of its axes; the
``lr`` changed at every step (a runtime value).
"""

from __future__ import annotations

import textwrap

from _distributed import EIGHT_HOST_DEVICES, HOST_DEVICES, run_script

PREAMBLE = EIGHT_HOST_DEVICES + textwrap.dedent(
    """
    import re
    import jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import lucid
    from _distributed import record_step_programs, sharded_bound

    DEVICES = np.array(jax.devices())
    assert len(DEVICES) == 8, DEVICES
    MESH = Mesh(DEVICES, ("data",))
    MESH_2D = Mesh(DEVICES.reshape(4, 2), ("data", "model"))

    # every step program the optimizers run, as XLA compiled it
    programs = record_step_programs(lambda lowered: lowered.compile())

    def collectives(compiled):
        pattern = r"(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
        return len(re.findall(pattern + r"(?:-start)?\\(", compiled.as_text()))

    def flops(compiled):
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis  # jax 0.4
        return float(analysis["flops"])
    """
)

NUMBERS = PREAMBLE + textwrap.dedent(
    """
    rng = np.random.default_rng(0)
    # (shape, group): group 0 and 1 differ in lr; group 2 stacks of matrices
    LAYOUT = [((16, 8), 0)] * 3 + [((8, 8), 0)] * 5 + [((8, 8), 1)] * 5
    LAYOUT += [((24, 16), 1), ((6, 8), 1), ((3, 8, 16), 2)]
    init = [rng.uniform(-1, 1, size=s).astype(np.float32) for s, _ in LAYOUT]
    grads = [[rng.normal(size=s).astype(np.float32) for s, _ in LAYOUT] for _ in range(4)]

    def run(where, axes):
        put = (lambda x: jnp.asarray(x)) if where is None else (lambda x: jax.device_put(x, where))
        params = [lucid.Parameter(put(x)) for x in init]
        groups = [{"params": [p for p, (_, g) in zip(params, LAYOUT) if g == k]} for k in range(3)]
        groups[1]["lr"] = 0.03
        groups[2]["batched_matrices"] = True
        opt = lucid.optim.Muon(groups, lr=0.02, weight_decay=0.1)
        lucid.compile_optimizer(opt, shard_state_over=axes)
        largest = [np.abs(x).max() for x in init]
        for step in grads:
            for group in opt.param_groups:
                group["lr"] *= 0.9
            for p, g in zip(params, step):
                p.grad = put(g)
            opt.step()
            largest = [max(m, np.abs(np.asarray(p.data)).max()) for m, p in zip(largest, params)]
        state = opt.state_dict()["state"]
        momenta = [np.asarray(state[i]["momentum_buffer"]) for i in range(len(params))]
        return [np.asarray(p.data) for p in params], momenta, largest

    values, momenta, largest = run(None, None)
    for mesh, axes in [(MESH, "data"), (MESH_2D, "data"), (MESH_2D, ("data", "model"))]:
        got_values, got_momenta, _ = run(NamedSharding(mesh, P()), axes)
        for i, (want, got) in enumerate(zip(momenta, got_momenta)):
            np.testing.assert_array_equal(got, want, err_msg=f"momentum {i}, {axes}")
        for i, (want, got, scale) in enumerate(zip(values, got_values, largest)):
            limit = sharded_bound(scale, want.dtype, len(grads))
            assert np.abs(got - want).max() <= limit, (i, axes, np.abs(got - want).max(), limit)
    print("OK")
    """
)

PROGRAM = PREAMBLE + textwrap.dedent(
    """
    rng = np.random.default_rng(1)
    replicated = NamedSharding(MESH, P())
    init = [rng.normal(size=(64, 32)).astype(np.float32) for _ in range(16)]

    def compiled_step(ns_steps, axes):
        params = [lucid.Parameter(jax.device_put(x, replicated)) for x in init]
        opt = lucid.optim.Muon(params, lr=0.02, ns_steps=ns_steps)
        lucid.compile_optimizer(opt, shard_state_over=axes)
        for p, x in zip(params, init):
            p.grad = jax.device_put(x, replicated)
        opt.step()
        return programs[-1]

    counts = {n: collectives(compiled_step(n, "data")) for n in (2, 6)}
    assert counts[2] == counts[6], f"collectives inside the iteration: {counts}"
    one, spread = flops(compiled_step(5, None)), flops(compiled_step(5, "data"))
    assert 0 < spread <= 1.1 * one / 8, f"per device {spread:.4g} of {one:.4g} flops"
    print(f"collectives {counts[2]}; flops per device {spread / one:.3f} of one device's")
    print("OK")
    """
)


@HOST_DEVICES
def test_sharded_muon_gives_the_single_device_numbers(tmp_path):
    run_script(tmp_path / "muon_numbers.py", NUMBERS, timeout=400)


@HOST_DEVICES
def test_sharded_muon_has_no_collective_inside_the_iteration_and_a_share_of_the_work(tmp_path):
    run_script(tmp_path / "muon_program.py", PROGRAM, timeout=400)
