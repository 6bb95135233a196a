"""Run by tests/test_error_messages.py in a subprocess with 8 host CPU devices
(``XLA_FLAGS`` set by the test): one optimizer over parameters sharded over a mesh,
replicated over it, on a 2-D mesh of the same devices, and on single devices, stepped
eager, compiled and fused with clipping, against the same steps on one device; the
clipping functions over gradients on several devices; and a gradient assigned on other
devices than its parameter's, refused as torch refuses it."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

jax.config.update("jax_enable_x64", True)
# one program at a time on the host devices (see tests/_distributed.py)
jax.config.update("jax_cpu_enable_async_dispatch", False)

import lucid  # noqa: E402
import lucid.functional as LF  # noqa: E402

DEVICES = jax.devices()
assert len(DEVICES) == 8, DEVICES
MESH = Mesh(np.array(DEVICES), ("data",))
GRID = Mesh(np.array(DEVICES).reshape(2, 4), ("x", "y"))
PLACES = {
    "sharded": NamedSharding(MESH, P("data")),
    "replicated": NamedSharding(MESH, P()),
    "grid": NamedSharding(GRID, P("x", "y")),
    "one": DEVICES[0],
    "other": DEVICES[3],
}
# the single-device parameters small (laid end to end by the eager step), the others large
SHAPES = {
    "sharded": (8, 2056),
    "replicated": (16400,),
    "grid": (2, 8200),
    "one": (128,),
    "other": (2, 8),
}
rng = np.random.default_rng(0)
INIT = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
X = rng.normal(size=(4,)).astype(np.float32)


def loss_fn(m, x):
    return sum(jnp.sum(jnp.tanh(p * x.sum() + 0.1) ** 2) for p in m.values())


def devices_of(array):
    return {d.id for d in array.sharding.device_set}


def boxed(placed):
    return {
        k: lucid.Parameter(jax.device_put(v, PLACES[k]) if placed else jnp.asarray(v))
        for k, v in INIT.items()
    }


def run(form, placed):
    params = boxed(placed)
    opt = lucid.optim.AdamW(
        [
            {"params": [params["sharded"], params["one"]], "weight_decay": 0.1},
            {"params": [params["replicated"], params["grid"], params["other"]]},
        ],
        lr=0.05,
        weight_decay=0.0,
    )
    clip = LF.clip_grad_norm(0.5)
    x = jnp.asarray(X)
    for step in range(3):
        if form == "fused":
            lucid.fused_step(loss_fn, opt, grad_transform=clip)(params, x)
            continue
        if form == "compiled" and step == 1:
            lucid.compile_optimizer(opt)
        opt.zero_grad()
        lucid.backward(loss_fn, params, x)
        lucid.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
    if placed:
        for k, p in params.items():
            expected = devices_of(jax.device_put(jnp.zeros(SHAPES[k]), PLACES[k]))
            assert devices_of(p.data) == expected, (form, k, p.data.sharding)
    return {k: np.asarray(p.data) for k, p in params.items()}


def close(got, expected, what):
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=2e-6, atol=2e-7, err_msg=f"{what} {k}")


reference = run("eager", placed=False)
for form in ("eager", "compiled", "fused"):
    close(run(form, placed=True), reference, form)

# the clipping functions, gradients on every domain at once (and a bfloat16 one)
grads = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
for norm_type in (2.0, 1.0, float("inf"), 0.0):
    results = []
    for placed in (False, True):
        params = boxed(placed)
        for k, p in params.items():
            dtype = jnp.bfloat16 if k == "other" else jnp.float32
            p.data = p.data.astype(dtype)
            g = jnp.asarray(grads[k], dtype)
            p.grad = jax.device_put(g, PLACES[k]) if placed else g
        listed = list(params.values())
        total = lucid.nn.utils.get_total_norm([p.grad for p in listed], norm_type)
        clipped = lucid.nn.utils.clip_grad_norm_(listed, 0.5, norm_type)
        lucid.nn.utils.clip_grads_with_norm_(listed, 0.25, jax.device_put(total, DEVICES[5]))
        lucid.nn.utils.clip_grad_value_(listed, 0.01)
        if placed:
            for k, p in params.items():
                assert devices_of(p.grad) == devices_of(p.data), (k, p.grad.sharding)
        results.append(
            (float(total), float(clipped), [np.asarray(p.grad, np.float32) for p in listed])
        )
    (total, clipped, final), (total_p, clipped_p, final_p) = results
    np.testing.assert_allclose(total_p, total, rtol=1e-6, err_msg=str(norm_type))
    np.testing.assert_allclose(clipped_p, clipped, rtol=1e-6, err_msg=str(norm_type))
    for a, b in zip(final_p, final):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8, err_msg=str(norm_type))

# a gradient on other devices than its parameter's: torch's refusal, nothing changed; the
# same devices under another sharding are taken
for compiled in (False, True):
    params = boxed(placed=True)
    opt = lucid.optim.SGD(list(params.values()), lr=0.1)
    if compiled:
        lucid.compile_optimizer(opt)
    for k, p in params.items():
        p.grad = jax.device_put(jnp.ones(SHAPES[k], jnp.float32), PLACES[k])
        before = np.asarray(p.grad)
        outside = DEVICES[7] if k != "sharded" else DEVICES[1:]
        elsewhere = (
            jax.device_put(jnp.zeros(SHAPES[k], jnp.float32), outside)
            if k != "sharded"
            else jax.device_put(
                jnp.zeros(SHAPES[k], jnp.float32),
                NamedSharding(Mesh(np.array(outside), ("d",)), P()),
            )
        )
        try:
            p.grad = elsewhere
        except RuntimeError as error:
            message = str(error)
            assert (
                "Please ensure that the gradient and the tensor are on the same device" in message
            )
            assert "jax.device_put(grad, p.data.sharding)" in message, message
        else:
            raise AssertionError(f"{k}: a gradient on other devices was taken")
        np.testing.assert_array_equal(np.asarray(p.grad), before)
        assert devices_of(p.grad) == devices_of(p.data)
    # the same devices, replicated: taken
    params["sharded"].grad = jax.device_put(
        jnp.ones(SHAPES["sharded"], jnp.float32), PLACES["replicated"]
    )
    opt.step()

print("OK")
