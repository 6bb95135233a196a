"""Run by tests/test_distributed.py in a subprocess with 8 host CPU devices
(``XLA_FLAGS`` set by the test): optimizer state sharded over 8 devices, ZeRO-1
style (replicated parameters, ``shard_state_over``) and FSDP style (sharded
parameters, state follows), against the same optimizer on one device."""

import jax
import jax.numpy as jnp
import numpy as np
from _distributed import sharded_bound
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

jax.config.update("jax_enable_x64", True)
# one program at a time on the host devices: with asynchronous dispatch, two programs'
# collectives can hold the CPU client's threads waiting for each other (see
# tests/test_distributed.py)
jax.config.update("jax_cpu_enable_async_dispatch", False)

import lucid  # noqa: E402

assert len(jax.devices()) == 8, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
rng = np.random.default_rng(0)
# FSDP: w along its first axis and b along its only one (one (rows, columns)
# buffer), v along its second axis (its own arrays): every one over 8 devices
FSDP = {"w": P("data"), "v": P(None, "data"), "b": P("data")}
init = {"w": rng.normal(size=(16, 6)), "v": rng.normal(size=(6, 16)), "b": rng.normal(size=(8,))}
init_zero = {**init, "s": rng.normal(size=(3,))}  # 203 floats: a padded state buffer
x = rng.normal(size=(16, 16))
grads = [{k: rng.normal(size=v.shape) for k, v in init_zero.items()} for _ in range(3)]


def same(got, expected, scale, what):
    """The same gradients: the one-device numbers to the rounding docs/distributed.md
    derives (XLA:CPU fuses other multiply-adds in a program over pieces), ``scale`` the
    largest magnitude the array took over the one-device steps."""
    limit = sharded_bound(scale, expected.dtype, len(grads))
    difference = np.abs(got - expected).max(initial=0.0)
    assert difference <= limit, f"{what}: {difference:.3g} > {limit:.3g}"


def close(got, expected, what):
    """A data-parallel loss sums its gradient across devices in another order."""
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * scale, err_msg=what)


def loss_fn(m, x):
    h = jnp.tanh(x @ m["w"] @ m["v"] + m["b"].sum())
    return jnp.mean(h**2) + jnp.sum(jnp.sin(m.get("s", jnp.zeros(1))) ** 2)


def run(style, fused):
    values = init_zero if style in ("zero", "single-zero") else init
    spec = {k: FSDP.get(k, P()) if style == "fsdp" else P() for k in values}
    single = style.startswith("single")

    def put(v, s):
        v = jnp.asarray(v)
        return v if single else jax.device_put(v, NamedSharding(mesh, s))

    params = {k: lucid.Parameter(put(v, spec[k])) for k, v in sorted(values.items())}
    largest = {k: float(np.abs(v).max()) for k, v in values.items()}
    opt = lucid.optim.AdamW(list(params.values()), lr=0.05, amsgrad=True, weight_decay=0.1)
    compiled = lucid.compile_optimizer(opt, shard_state_over="data" if style == "zero" else None)
    compiles: list[str] = []

    def listener(name: str, secs: float, **kwargs) -> None:
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    # the first two steps may compile (the state is made outside the program, then comes
    # back placed by it); from the third on, an lr change must compile nothing
    settled = None
    if fused:  # a data-parallel loss: the batch sharded over the devices
        step = lucid.optim.fused_step(loss_fn, opt)
        xs = put(x, P("data"))
        for i in range(3):
            opt.param_groups[0]["lr"] = 0.05 / (i + 1)  # a runtime value: no recompile
            step(params, xs)
            settled = len(compiles) if i == 1 else settled
    else:
        for i, g in enumerate(grads):
            opt.param_groups[0]["lr"] = 0.05 / (i + 1)
            for k, p in params.items():
                p.grad = put(g[k], spec[k])
            opt.step()
            track(largest, params, opt)
            settled = len(compiles) if i == 1 else settled
    assert len(compiles) == settled, "an lr change recompiled"
    for k, p in params.items():  # parameters keep their placement
        if not single:
            assert p.data.sharding.is_equivalent_to(NamedSharding(mesh, spec[k]), p.ndim), k
    return params, opt, compiled, largest


def track(largest, params, opt):
    """Each parameter's and state field's largest magnitude so far, in ``largest``."""
    arrays = {k: p.data for k, p in params.items()}
    for index, entry in opt.state_dict()["state"].items():
        arrays.update({(index, name): value for name, value in entry.items()})
    for key, value in arrays.items():
        largest[key] = max(largest.get(key, 0.0), float(np.abs(np.asarray(value)).max()))


def array_state(opt):
    return [a for a in opt.backend.state_arrays() if a.ndim]


def scalar_bytes(opt):
    return sum(a.nbytes for a in opt.backend.state_arrays() if not a.ndim)


for fused in (False, True):
    for style, reference in (("zero", "single-zero"), ("fsdp", "single")):
        params, opt, compiled, _ = run(style, fused)
        ref_params, ref_opt, _, largest = run(reference, fused)
        # [1] the numbers: the single-device run's to rounding for the same gradients
        for k, p in params.items():
            got, expected = np.asarray(p.data), np.asarray(ref_params[k].data)
            if fused:
                close(got, expected, f"{style} {k}")
            else:
                same(got, expected, largest[k], f"{style} {k}")
        got_sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
        for index, entry in ref_sd["state"].items():
            for name, value in entry.items():
                got, expected = np.asarray(got_sd["state"][index][name]), np.asarray(value)
                if fused:
                    close(got, expected, f"{style} {name}")
                else:
                    same(got, expected, largest[index, name], f"{style} {name}")
        # [2] the memory: every state buffer cut in 8 equal pieces, one per device
        single_bytes = sum(a.nbytes for a in array_state(ref_opt))
        total = 0
        for array in array_state(opt):
            shards = array.addressable_shards
            assert len({d.id for d in array.sharding.device_set}) == 8
            assert len({str(s.index) for s in shards}) == 8, array.sharding  # no replica
            assert all(s.data.nbytes * 8 == array.nbytes for s in shards), array.sharding
            total += array.nbytes
        padding = {"zero": (208 - 203) * 8 * 3, "fsdp": 0}[style]  # 3 fields, float64
        assert total == single_bytes + padding, (total, single_bytes)
        per_device = compiled.state_bytes_per_device()
        assert len(per_device) == 8
        for held in per_device.values():
            assert held == total // 8 + scalar_bytes(opt), (held, total)
        print(style, "fused" if fused else "step", "bytes per device", held, "of", single_bytes)
# a mesh axis the parameters' mesh does not have: refused when compiling
w = lucid.Parameter(jax.device_put(jnp.ones(8), NamedSharding(mesh, P())))
try:
    lucid.compile_optimizer(lucid.optim.SGD([w], lr=0.1), shard_state_over="model")
except ValueError as error:
    assert "no axis 'model'" in str(error), error
else:
    raise AssertionError("an unknown mesh axis was accepted")
print("OK")
