"""Run by tests/test_distributed.py: ``worker ID PORT DIR`` is one of two processes
joined with ``jax.distributed.initialize`` (each with the host CPU devices its
XLA_FLAGS give it, 2 or 1; one mesh across them); ``reference DIR`` is the same
training on one device, checking the workers' results and their orbax checkpoint
(read back as torch's format and loaded into torch.optim.AdamW).

The run: 3 steps (backward + step, fused with a data-parallel loss, backward + step)
with the state of replicated parameters sharded over the mesh (ZeRO-1) and one
parameter sharded along its first axis (FSDP style); a checkpoint written by
both processes; a new optimizer restored from it; 2 more fused steps.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
# one program at a time on the host devices: with asynchronous dispatch, two programs'
# collectives can hold the CPU client's threads waiting for each other (see
# tests/test_distributed.py)
jax.config.update("jax_cpu_enable_async_dispatch", False)

import lucid  # noqa: E402
from lucid.optim import checkpoint  # noqa: E402

rng = np.random.default_rng(0)
INIT = {"w": rng.normal(size=(16, 6)), "b": rng.normal(size=(6,)), "u": rng.normal(size=(8, 3))}
X = rng.normal(size=(8, 16))
SPECS = {"w": (), "b": (), "u": ("data",)}  # u: sharded along its first axis (FSDP)


def loss_fn(m, x):
    return jnp.mean(jnp.tanh(x @ m["w"] + m["b"]) ** 2) + jnp.sum(jnp.cos(m["u"]) * x[:, :3])


def train(params, opt, x, steps):
    fused = lucid.optim.fused_step(loss_fn, opt)
    for i in steps:
        opt.param_groups[0]["lr"] = 0.05 / (1 + i)
        if i in (0, 2):  # backward + step; else fused (after the restore: one new program)
            opt.zero_grad()
            lucid.backward(loss_fn, params, x)
            opt.step()
        else:
            fused(params, x)


def make_optimizer(params, **compile_options):
    opt = lucid.optim.AdamW(list(params.values()), lr=0.05, amsgrad=True, weight_decay=0.1)
    lucid.compile_optimizer(opt, **compile_options)
    return opt


def worker(process_id, port, directory):
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    local = jax.local_device_count()
    assert jax.process_count() == 2 and len(jax.devices()) == 2 * local, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))

    def global_array(value, spec):  # each process supplies its own devices' pieces
        sharding = NamedSharding(mesh, P(*spec))
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    params = {k: lucid.Parameter(global_array(v, SPECS[k])) for k, v in sorted(INIT.items())}
    x = global_array(X, ("data",))  # the batch, split over the devices of both processes
    opt = make_optimizer(params, shard_state_over="data")
    train(params, opt, x, range(3))
    # the state lives in one piece per device, `local` on each process: nothing is replicated
    for array in opt.backend.state_arrays():
        if array.ndim:
            assert len(array.addressable_shards) == local
            assert all(s.data.nbytes * 2 * local == array.nbytes for s in array.addressable_shards)
    checkpoint.save(os.path.join(directory, "checkpoint"), opt)

    # a new job: fresh Parameters and optimizer, the state restored shard by shard
    params = {k: lucid.Parameter(p.data) for k, p in params.items()}
    opt = make_optimizer(params, shard_state_over="data")
    checkpoint.restore(os.path.join(directory, "checkpoint"), opt)
    train(params, opt, x, range(3, 5))
    final = {k: multihost_utils.process_allgather(p.data, tiled=True) for k, p in params.items()}
    if process_id == 0:
        np.savez(os.path.join(directory, "multiprocess.npz"), **final)
    multihost_utils.sync_global_devices("done")
    print("OK", flush=True)


def reference(directory):
    import torch

    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in sorted(INIT.items())}
    opt = make_optimizer(params)
    x = jnp.asarray(X)
    train(params, opt, x, range(3))
    # [1] the checkpoint both processes wrote, read as one single-device state_dict
    saved = checkpoint.load(os.path.join(directory, "checkpoint"), as_torch=True)
    expected = opt.state_dict()
    assert saved["param_groups"] == expected["param_groups"], saved["param_groups"]
    for index, entry in expected["state"].items():
        assert set(saved["state"][index]) == set(entry)
        for name, value in entry.items():
            got = saved["state"][index][name]
            assert isinstance(got, torch.Tensor)
            np.testing.assert_allclose(got.numpy(), np.asarray(value), rtol=1e-10, atol=1e-14)
    # [2] torch takes it as it is, and its next step is lucid's
    torch_params = [torch.tensor(np.asarray(p.data)) for p in params.values()]
    torch_opt = torch.optim.AdamW(torch_params, lr=0.05, amsgrad=True, weight_decay=0.1)
    torch_opt.load_state_dict(saved)
    lucid.backward(loss_fn, params, x)  # the gradient of step 3, as train() would
    for t, p in zip(torch_params, params.values()):
        t.grad = torch.tensor(np.asarray(p.grad))
    opt.param_groups[0]["lr"] = torch_opt.param_groups[0]["lr"] = 0.05 / 4
    opt.step()
    torch_opt.step()
    for t, p in zip(torch_params, params.values()):
        np.testing.assert_allclose(t.detach().numpy(), np.asarray(p.data), rtol=1e-10)
    # [3] the rest of the run: as the two processes trained it
    params = {k: lucid.Parameter(jnp.asarray(v)) for k, v in sorted(INIT.items())}
    opt = make_optimizer(params)
    train(params, opt, x, range(5))
    got = np.load(os.path.join(directory, "multiprocess.npz"))
    for k, p in params.items():  # a data-parallel gradient is summed in another order
        np.testing.assert_allclose(got[k], np.asarray(p.data), rtol=1e-10, atol=1e-13)
    print("OK", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        reference(sys.argv[2])
