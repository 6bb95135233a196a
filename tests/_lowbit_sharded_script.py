"""Run by tests/test_lowbit_sharded.py in a subprocess with 8 host CPU devices
(``XLA_FLAGS`` set by the test): bitsandbytes' and torchao's low-bit optimizers
with their state sharded over the devices, ZeRO-1 style (replicated parameters,
``shard_state_over``) and FSDP style (parameters sharded along their first axis),
compiled and fused, against the same optimizer's eager steps on one device; and
their orbax checkpoints. ``python _lowbit_sharded_script.py PART [DIR]``, PART one of
``compiled``, ``fused``, ``checkpoint``."""

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# x64 on, as in the test suite: a float64 op in the float32 program would show
jax.config.update("jax_enable_x64", True)
# one program at a time on the host devices (see tests/_distributed.py)
jax.config.update("jax_cpu_enable_async_dispatch", False)
if sys.argv[1] in ("compiled", "fused"):  # every program's lowered (StableHLO) text there
    jax.config.update("jax_dump_ir_to", sys.argv[2])

import lucid  # noqa: E402

assert len(jax.devices()) == 8, jax.devices()
MESH = Mesh(np.array(jax.devices()), ("data",))
SHARDS = 8
rng = np.random.default_rng(0)
# "big": 8 rows of 128 a device, whole blocks of 256 (and of 128) on each device;
# "odd": 6400 elements, 800 a device, so blocks of 256 straddle two devices;
# "small": under the 4096 elements from which state is quantized (32-bit state)
SHAPES = {"big": (64, 128), "odd": (64, 100), "small": (40,)}
INIT = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
STEPS = 3
GRADS = [
    {
        k: (0.1 * rng.normal(size=s) * np.exp(rng.normal(size=s))).astype(np.float32)
        for k, s in SHAPES.items()
    }
    for _ in range(STEPS + 2)
]
X = rng.normal(size=(16, 64)).astype(np.float32)

OPTIMIZERS = {
    "bnb.Adam8bit": lambda ps: lucid.optim.bnb.Adam8bit(ps, lr=1e-2),
    "bnb.AdamW8bit": lambda ps: lucid.optim.bnb.AdamW8bit(ps, lr=1e-2, weight_decay=0.1),
    "bnb.Lion8bit": lambda ps: lucid.optim.bnb.Lion8bit(ps, lr=1e-3, weight_decay=0.1),
    "bnb.LAMB32bit": lambda ps: lucid.optim.bnb.LAMB32bit(ps, lr=1e-2),
    "bnb.LARS32bit": lambda ps: lucid.optim.bnb.LARS32bit(ps, lr=1e-2, momentum=0.9),
    "torchao.AdamW8bit": lambda ps: lucid.optim.torchao.AdamW8bit(ps, lr=1e-2),
    "torchao.AdamW4bit": lambda ps: lucid.optim.torchao.AdamW4bit(ps, lr=1e-2),
    "torchao.AdamWFp8": lambda ps: lucid.optim.torchao.AdamWFp8(ps, lr=1e-2),
}
# LAMB and LARS scale the update by |p| / |update|, sums over the whole parameter:
# sharded, each device sums its rows and XLA adds the pieces, in another order
NORMS = {"bnb.LAMB32bit", "bnb.LARS32bit"}
OLD_XLA = jax.__version_info__[:2] == (0, 4)


def spec(style, k):
    if style == "fsdp" and k != "small":
        return P("data")
    return P()


def put(value, style, k):
    value = jnp.asarray(value)
    if style == "single":
        return jax.device_put(value, jax.devices()[0])
    return jax.device_put(value, NamedSharding(MESH, spec(style, k)))


def make(name, style):
    keys = sorted(INIT) if name in STRADDLE else ["big", "small"]  # fewer programs to build
    params = {k: lucid.Parameter(put(INIT[k], style, k)) for k in keys}
    return params, OPTIMIZERS[name](list(params.values()))


def train(params, opt, style, grads):
    for g in grads:
        for k, p in params.items():
            p.grad = put(g[k], style, k)
        opt.step()


def flat(state_dict):
    """Every array of a state_dict's state, by a path name, as NumPy (fp8 codes as their
    bytes); numbers as 0-d arrays."""
    out = {}
    for index, entry in state_dict["state"].items():
        for path, value in jax.tree_util.tree_flatten_with_path(entry)[0]:
            array = np.asarray(value)
            if array.dtype.itemsize == 1 and array.dtype != np.uint8:  # float8 codes
                array = array.view(np.uint8)
            out[f"{index}{jax.tree_util.keystr(path)}"] = array
    return out


def leaves(opt):
    return flat(opt.state_dict())


def same_state_dicts(got, expected):
    """Two state_dicts equal: groups, and every array bit for bit with its dtype."""
    assert got["param_groups"] == expected["param_groups"]
    got, expected = flat(got), flat(expected)
    assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
    for key, value in expected.items():
        assert got[key].dtype == value.dtype, (key, got[key].dtype, value.dtype)
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def compare(name, got, expected, what):
    """Codes, scales and state bit for bit, parameters too, but for two roundings:
    LAMB's and LARS's trust ratio (``NORMS``: a sum over the whole parameter, which
    each device sums over its rows before XLA adds the pieces) moves their parameters
    and ``unorm_vec`` to float32 rounding; and jax 0.4's XLA rounds the sharded
    program's parameter update differently in the last place (as for AdamW in
    tests/_sharded_state_script.py), the state still bit for bit."""
    assert got.keys() == expected.keys(), (what, sorted(got), sorted(expected))
    for key, value in expected.items():
        if np.array_equal(got[key], value):
            continue
        message = f"{what} {key}"
        assert value.dtype.kind == "f", message  # codes (uint8, fp8 bytes): always equal
        scale = float(np.abs(value).max(initial=0.0))
        if name in NORMS:
            np.testing.assert_allclose(
                got[key], value, rtol=2e-6, atol=2e-6 * scale, err_msg=message
            )
        else:
            assert OLD_XLA and key in SHAPES, message + " differs"  # a parameter
            ulp = np.finfo(np.float32).eps * scale
            np.testing.assert_allclose(got[key], value, rtol=0, atol=4 * ulp, err_msg=message)
        print(f"{message}: to rounding, {np.abs(got[key] - value).max():.2e} at most")


def values(params):
    return {k: np.asarray(p.data) for k, p in params.items()}


def reference(name, grads=GRADS[:STEPS]):
    params, opt = make(name, "single")
    train(params, opt, "single", grads)
    return params, opt


def check_placement(name, style, params, opt, compiled):
    """Parameters keep their sharding. ZeRO-1: every state array whose first axis
    divides by 8 is cut in 8 (no replica), the rest whole on every device, and the
    bytes per device add up. FSDP: the state of a parameter whose blocks straddle
    devices is placed as XLA's partitioner chose (whole, or partly replicated on jax
    0.4): only the total is checked here, the rest by the caller.

    Returns:
      ``(state bytes in all, bytes per device)``.
    """
    for k, p in params.items():
        expected = NamedSharding(MESH, spec(style, k))
        assert p.data.sharding.is_equivalent_to(expected, p.ndim), (name, style, k)
    per_device = compiled.state_bytes_per_device()
    assert len(per_device) == SHARDS, per_device
    arrays = opt.backend.state_arrays()
    total = sum(array.nbytes for array in arrays)
    if style != "zero":
        return total, max(per_device.values())
    cut = whole = 0
    for array in arrays:
        pieces = {str(s.index) for s in array.addressable_shards}
        if array.ndim and array.shape[0] % SHARDS == 0:
            assert len(pieces) == SHARDS, (name, style, array.shape, array.sharding)
            cut += array.nbytes
        else:
            assert len(pieces) == 1, (name, style, array.shape, array.sharding)
            whole += array.nbytes
    assert set(per_device.values()) == {cut // SHARDS + whole}, (per_device, cut, whole)
    return total, cut // SHARDS + whole


def part_compiled():
    """compile_optimizer(shard_state_over=...) with replicated parameters (ZeRO-1), and
    FSDP-sharded parameters with a low-bit rule, against eager steps on one device."""
    for name in OPTIMIZERS:
        ref_params, ref_opt = reference(name)
        expected = {**leaves(ref_opt), **values(ref_params)}
        for style in ("zero", "fsdp") if name in FSDP else ("zero",):
            params, opt = make(name, style)
            compiled = lucid.compile_optimizer(opt, shard_state_over="data")
            train(params, opt, style, GRADS[:STEPS])
            compare(name, {**leaves(opt), **values(params)}, expected, f"{name} {style}")
            total, held = check_placement(name, style, params, opt, compiled)
            if style == "fsdp":  # "big" holds whole blocks on each device: its state too
                big = opt.state_dict()["state"][list(params).index("big")]
                for path, array in jax.tree_util.tree_flatten_with_path(big)[0]:
                    where = jax.tree_util.keystr(path)  # the code maps are constants
                    if "qmap" not in where and getattr(array, "size", 0) >= SHARDS:
                        pieces = {str(s.index) for s in array.addressable_shards}
                        assert len(pieces) == SHARDS, (name, where, array.sharding)
            print(f"{name} {style}: state {total} bytes, {held} per device")

    # a mesh axis the parameters' mesh does not have: refused when compiling, as for
    # elementwise rules
    params, opt = make("bnb.Adam8bit", "zero")
    try:
        lucid.compile_optimizer(opt, shard_state_over="model")
    except ValueError as error:
        assert "no axis 'model'" in str(error), error
    else:
        raise AssertionError("an unknown mesh axis was accepted")


def loss_fn(m, x):
    return (
        jnp.mean(jnp.tanh(x @ m["big"]) ** 2)
        + jnp.mean(jnp.cos(x @ m["odd"]))
        + jnp.sum(jnp.sin(m["small"]) ** 2)
    )


def close(name, got, expected, what):
    """A fused step's gradient comes from a partitioned backward pass, summed in
    another order: values to float32 rounding, codes equal but where a value lies
    within that rounding of a code boundary (then one code apart)."""
    for key, value in expected.items():
        if value.dtype == np.uint8:
            differ = got[key].astype(int) - value.astype(int)
            assert np.abs(differ).max(initial=0) <= 1, (what, key)
            assert (differ != 0).mean() <= 1e-3, (what, key, (differ != 0).sum())
        else:
            scale = float(np.abs(value).max(initial=0.0))
            np.testing.assert_allclose(
                got[key], value, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{what} {key}"
            )


def part_fused():
    """fused_step(loss_fn, opt, shard_state_over="data"): forward, backward and the
    sharded low-bit update in one executable, against eager backward + step."""
    x = jnp.asarray(X)
    for name in FUSED:
        ref_params, ref_opt = make(name, "single")
        for _ in range(STEPS):
            ref_opt.zero_grad()
            lucid.backward(loss_fn, ref_params, jax.device_put(x, jax.devices()[0]))
            ref_opt.step()
        params, opt = make(name, "zero")
        step = lucid.optim.fused_step(loss_fn, opt, shard_state_over="data")
        xs = jax.device_put(x, NamedSharding(MESH, P()))
        for _ in range(STEPS):
            step(params, xs)
        close(
            name,
            {**leaves(opt), **values(params)},
            {**leaves(ref_opt), **values(ref_params)},
            f"{name} fused",
        )
        total, held = check_placement(name, "zero", params, opt, step.compiled)
        print(f"{name} fused: state {total} bytes, {held} per device")


def saved_dtypes(path):
    """The dtypes orbax wrote, read from its own metadata (not through lucid)."""
    import orbax.checkpoint as ocp

    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    meta = checkpointer.metadata(os.path.join(path, "arrays"))
    # a dict in orbax 0.10; later, step metadata whose item_metadata maps like one
    tree = getattr(meta, "item_metadata", meta)
    return {key: str(np.dtype(value.dtype)) for key, value in tree.items()}


def part_checkpoint(directory):
    """orbax checkpoints of sharded low-bit state: saved piecewise and still quantized,
    restored into a fresh sharded optimizer and into a single-device one, each then
    stepping as the uninterrupted run; a failed save keeps the previous checkpoint and
    a checkpoint that does not fit changes nothing."""
    import orbax.checkpoint as ocp
    from test_checkpoint_faults import _leftovers

    from lucid.optim import checkpoint

    paths = {}
    for name in CHECKPOINTED:
        params, opt = make(name, "zero")
        lucid.compile_optimizer(opt, shard_state_over="data")
        train(params, opt, "zero", GRADS[:2])
        at_save = {k: np.asarray(p.data) for k, p in params.items()}
        path = paths[name] = os.path.join(directory, name)
        checkpoint.save(path, opt)
        # the quantized state is written as it is held: uint8 codes, float32 scales
        dtypes = saved_dtypes(path)
        held = [
            str(v.dtype)
            for v in jax.tree_util.tree_leaves(opt.state_dict()["state"])
            if isinstance(v, jax.Array) and v.size
        ]
        assert sorted(dtypes.values()) == sorted(held), (dtypes, held)
        assert held.count("uint8") >= 2, held
        same_state_dicts(checkpoint.load(path), opt.state_dict())
        train(params, opt, "zero", GRADS[2:4])  # the uninterrupted run
        expected = {**leaves(opt), **values(params)}
        for style in ("zero", "single"):
            fresh = {k: lucid.Parameter(put(v, style, k)) for k, v in sorted(at_save.items())}
            again = OPTIMIZERS[name](list(fresh.values()))
            if style == "zero":
                compiled = lucid.compile_optimizer(again, shard_state_over="data")
            checkpoint.restore(path, again)
            train(fresh, again, style, GRADS[2:4])
            compare(name, {**leaves(again), **values(fresh)}, expected, f"{name} {style}")
            if style == "zero":
                check_placement(name, style, fresh, again, compiled)
        # a failed save (orbax failing while writing) leaves the previous checkpoint
        before = checkpoint.load(path)
        real_save = ocp.Checkpointer.save

        def failing_save(self, target, *args, **kwargs):
            os.makedirs(target)
            raise ValueError("simulated orbax failure")

        ocp.Checkpointer.save = failing_save
        try:
            checkpoint.save(path, opt, overwrite=True)
        except RuntimeError as error:
            assert "orbax-checkpoint could not write the arrays" in str(error), error
        else:
            raise AssertionError("a failing save did not raise")
        finally:
            ocp.Checkpointer.save = real_save
        assert _leftovers(Path(directory)) == [], os.listdir(directory)
        same_state_dicts(checkpoint.load(path), before)
    # a checkpoint that does not fit (another optimizer's state): refused, nothing changed
    first, second = CHECKPOINTED
    params, opt = make(second, "zero")
    lucid.compile_optimizer(opt, shard_state_over="data")
    train(params, opt, "zero", GRADS[:1])
    state_before = opt.state_dict()
    try:
        checkpoint.restore(paths[first], opt)
    except ValueError as error:
        print("refused:", str(error)[:120])
    else:
        raise AssertionError("a checkpoint of another optimizer was accepted")
    same_state_dicts(opt.state_dict(), state_before)


# the parameter whose blocks straddle two devices' rows, for these only
STRADDLE = ("bnb.AdamW8bit", "torchao.AdamW4bit")
FSDP = ("bnb.AdamW8bit", "bnb.LAMB32bit", "torchao.AdamW4bit")
FUSED = ("bnb.AdamW8bit", "torchao.AdamW4bit")
CHECKPOINTED = ("bnb.AdamW8bit", "torchao.AdamW4bit")


def check_programs(directory, kind):
    """The float32 step programs as lowered (x64 on): no float64 value and no host
    callback in any, and the sharded ones carry their sharding constraints."""
    texts = [
        (Path(directory) / name).read_text()
        for name in sorted(os.listdir(directory))
        if f"jit_{kind}" in name
    ]
    assert texts, sorted(os.listdir(directory))[:20]
    for text in texts:  # types (tensor<f64>, tensor<8xf64>), not source locations
        assert not re.search(r"[<x]f64\b", text), "a float64 value in a float32 program"
        assert not re.search(r"custom_call @\w*callback", text), "a host callback"
    # cut over the mesh axis: Shardy's annotation (newer jax), or GSPMD's in 8 pieces
    assert any('{"data"}' in text or "devices=[8" in text for text in texts)
    print(len(texts), f"lowered {kind} programs checked")


def main():
    part, directory = sys.argv[1], sys.argv[2]
    if part == "checkpoint":
        part_checkpoint(directory)
    else:
        {"compiled": part_compiled, "fused": part_fused}[part]()
        check_programs(directory, {"compiled": "step", "fused": "fused"}[part])
    print("OK")


if __name__ == "__main__":
    main()
