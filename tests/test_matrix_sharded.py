"""SOAP and Shampoo with their state sharded over 8 host devices (`shard_state_over`); the
orbax checkpoint of Muon's sharded state too (Kron's loaded state restarts its counters and
draws, as kron-torch's does: docs/optimizers/kron.md).

Each parameter's state (moments, statistics, bases, roots) is kept spread over the mesh
axis as any state of a rule over whole parameters is (cut by rows), and the step deals
same-shaped parameters out whole to the devices (`Execution.whole_per_device`): each
device runs the statistics' products, the eigendecompositions, QRs and roots of its own
parameters, the one-device programs, with no collective inside them. On the newest jax the
parameters and state are then the single-device step's bit for bit. On jax 0.4.35 Shampoo's
float32 statistics may round once differently (XLA fuses its products with what the deal
moves around them otherwise): there the bound is docs/distributed.md's ``sharded_bound``
with, for each step, the sums over the largest axis's ``n`` elements a product adds
(``terms = n``) times the condition of the bases (the eigen- and inverse-root bounds of
tests/test_soap.py and tests/test_shampoo.py): 1e-4 relative in float32 over 6 steps
holds with room on these shapes. The state must be spread: every device holds part of it.
An orbax checkpoint of the sharded state (`lucid.optim.checkpoint`) restores into a fresh
sharded optimizer that then steps bit for bit as the saved one.
"""

from __future__ import annotations

import textwrap

from _distributed import EIGHT_HOST_DEVICES, HOST_DEVICES, run_script

SCRIPT = EIGHT_HOST_DEVICES + textwrap.dedent(
    """
    import jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import lucid

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    # two classes of more than one parameter (each dealt out), one of one, a vector
    shapes = [(8, 8), (8, 8), (16, 8), (16, 8), (16, 8), (24, 16), (8,)]
    init = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(6)]
    EXACT = jax.__version_info__ >= (0, 10)

    def run(cls, options, shard):
        params = [lucid.Parameter(jax.device_put(x, replicated)) for x in init]
        opt = cls(params, **options)
        compiled = lucid.compile_optimizer(opt, shard_state_over="data" if shard else None)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = jax.device_put(g, replicated)
            opt.step()
        spread = compiled.state_bytes_per_device() if shard else None
        state = opt.state_dict()["state"]
        fields = [np.asarray(a) for i in sorted(state) for a in jax.tree_util.tree_leaves(
            [v for k, v in sorted(state[i].items()) if not isinstance(v, (int, float))])]
        return [np.asarray(p.data) for p in params] + fields, spread

    for cls, options in [
        (lucid.optim.SOAP, {"lr": 0.01, "precondition_frequency": 2}),
        # matrix_eps 0.1: the (16, 8) and (8,) statistics are singular for the first steps,
        # and a float32 root of eps = 1e-6 beside O(10) eigenvalues is rounding, not numbers
        (lucid.optim.Shampoo, {"lr": 0.01, "preconditioning_compute_steps": 2,
                               "momentum": 0.5, "matrix_eps": 0.1}),
    ]:
        single, _ = run(cls, options, False)
        sharded, spread = run(cls, options, True)
        assert len(spread) == 8 and min(spread.values()) > 0, spread
        assert len(single) == len(sharded) > len(shapes)
        for a, b in zip(single, sharded):
            if EXACT:
                np.testing.assert_array_equal(b, a)
            else:
                np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * np.abs(a).max())
        print(cls.__name__, "bytes per device", sorted(set(spread.values())))
    print("OK")
    """
)


@HOST_DEVICES
def test_sharded_state_deals_whole_parameters_out_with_the_single_device_numbers(tmp_path):
    run_script(tmp_path / "matrix_sharded.py", SCRIPT, timeout=400)


CHECKPOINT = EIGHT_HOST_DEVICES + textwrap.dedent(
    """
    import tempfile
    import jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import lucid
    from lucid.optim import checkpoint

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    shapes = [(8, 8), (16, 8), (8,)]
    init = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(6)]
    for cls, options in [
        (lucid.optim.SOAP, {"precondition_frequency": 2}),
        (lucid.optim.Shampoo, {"matrix_eps": 0.1, "preconditioning_compute_steps": 2}),
        (lucid.optim.Muon, {"adjust_lr_fn": "match_rms_adamw"}),
    ]:
        matrices = cls is lucid.optim.Muon  # Muon takes matrices only
        kept = [i for i, x in enumerate(init) if x.ndim == 2 or not matrices]

        def make():
            params = [lucid.Parameter(jax.device_put(init[i], replicated)) for i in kept]
            opt = cls(params, lr=0.01, **options)
            lucid.compile_optimizer(opt, shard_state_over="data")
            return params, opt

        def step(params, opt, gs):
            for p, i in zip(params, kept):
                p.grad = jax.device_put(gs[i], replicated)
            opt.step()

        first, saved = make()
        for gs in grads[:3]:
            step(first, saved, gs)
        where = tempfile.mkdtemp() + "/checkpoint"
        checkpoint.save(where, saved)
        second, restored = make()
        for p, q in zip(second, first):
            p.data = q.data
        checkpoint.restore(where, restored)
        for gs in grads[3:]:
            step(first, saved, gs)
            step(second, restored, gs)
        for p, q in zip(first, second):
            np.testing.assert_array_equal(np.asarray(q.data), np.asarray(p.data))
        # read back in one process as the reference's state_dict
        names = set(checkpoint.load(where)["state"][0])
        print(cls.__name__, sorted(names))
    print("OK")
    """
)


@HOST_DEVICES
def test_an_orbax_checkpoint_of_the_sharded_state_restores_bit_for_bit(tmp_path):
    run_script(tmp_path / "matrix_checkpoint.py", CHECKPOINT, timeout=400)
