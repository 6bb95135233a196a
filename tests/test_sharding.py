"""Sharded parameters keep their sharding through eager, compiled and fused
steps, their state is created with the same sharding, and the numbers equal an
unsharded run. Runs in a subprocess with 8 host CPU devices."""

from __future__ import annotations

import textwrap

from _distributed import HOST_DEVICES, run_script

SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # see tests/test_distributed.py
    import lucid

    assert len(jax.devices()) == 8
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    # w: sharded on two axes (keeps its own arrays); u and v: sharded along their
    # first axis over the same mesh axis (share a (rows, columns) buffer); b: along
    # its only axis; s: replicated (a replicated flat buffer)
    specs = {"w": P("data", "model"), "b": P("model"), "s": P(), "u": P("data"), "v": P("data")}
    rng = np.random.default_rng(0)
    init = {"w": rng.normal(size=(16, 6)), "b": rng.normal(size=(6,)), "s": rng.normal(size=(3,)),
            "u": rng.normal(size=(8, 3)), "v": rng.normal(size=(4,))}
    x = jnp.asarray(rng.normal(size=(5, 16)))

    def loss_fn(m, x):
        return (jnp.mean(jnp.tanh(x @ m["w"] + m["b"]) ** 2) + jnp.sum(jnp.sin(m["s"]) ** 2)
                + jnp.sum(jnp.cos(m["u"]) * m["v"].sum()))

    def make(sharded):
        def put(k, v):
            v = jnp.asarray(v)
            return jax.device_put(v, NamedSharding(mesh, specs[k])) if sharded else v

        return {k: lucid.Parameter(put(k, v)) for k, v in sorted(init.items())}

    def check_sharding(params, opt):
        for k, p in params.items():
            expected = NamedSharding(mesh, specs[k])
            assert p.data.sharding.is_equivalent_to(expected, p.ndim), (k, p.data.sharding)
        sd = opt.state_dict()
        for index, (k, p) in enumerate(sorted(params.items())):
            for name, value in sd["state"][index].items():
                if getattr(value, "ndim", 0):
                    expected = NamedSharding(mesh, specs[k])
                    assert value.sharding.is_equivalent_to(expected, value.ndim), (k, name)

    results = {}
    for mode in ("eager", "compiled", "fused"):
        for sharded in (False, True):
            params = make(sharded)
            opt = lucid.optim.AdamW(list(params.values()), lr=0.05, amsgrad=True)
            if mode == "compiled":
                lucid.compile_optimizer(opt)
            fused = lucid.optim.fused_step(loss_fn, opt) if mode == "fused" else None
            for _ in range(6):
                if fused is not None:
                    fused(params, x)
                else:
                    opt.zero_grad()
                    lucid.backward(loss_fn, params, x)
                    opt.step()
            if sharded:
                check_sharding(params, opt)
                if mode != "eager":
                    where = {k: p.location for k, p in params.items()}
                    assert where["u"][0] is where["v"][0], "u and v share one flat buffer"
                    layouts = {k: storage.layout for k, (storage, _) in where.items()}
                    assert layouts["u"].rows == 4 and layouts["u"].flat, layouts
                    assert not layouts["w"].flat and layouts["s"].flat, layouts
            results[mode, sharded] = {k: np.asarray(p.data) for k, p in params.items()}
    for key, value in results.items():
        for k in value:
            expected = results["eager", False][k]
            np.testing.assert_allclose(value[k], expected, rtol=1e-12, err_msg=str(key))
    print("OK")
    """
)


@HOST_DEVICES
def test_sharded_parameters_keep_their_sharding_and_their_numbers(tmp_path):
    run_script(tmp_path / "sharded.py", SCRIPT)
