"""``python _sharded_numbers_script.py PART``, run by tests/test_distributed.py in a
subprocess with 8 host CPU devices (``XLA_FLAGS`` set by the test): a step past one
device in float64, against the same optimizer's steps on one device, for the families
of PART (one of `PARTS`), as docs/distributed.md states it:

* parameters replicated over a mesh (1-D or 2-D), no ``shard_state_over``: the
  single-device compiled step's parameters and state, bit for bit;
* ``shard_state_over`` over a 1-D mesh with two parameters on one device beside it
  (off the mesh), over one axis of a 2-D mesh, over both; an eager step on a mesh:
  within `bound` of the single-device numbers.

Each run steps parameters of 0 to 16 elements, most in a group of their own (the
smallest flat buffers: on 8 devices empty pieces, pieces of one element, padded ones),
beside groups of larger ones, ``STEPS`` times with the same gradients and the lr
changed at every step. bitsandbytes' and torchao's rules compute in float32 whatever
the parameter's dtype: tests/test_lowbit_sharded.py holds their statement."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from _distributed import sharded_bound
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

jax.config.update("jax_enable_x64", True)
# one program at a time on the host devices (see tests/_distributed.py)
jax.config.update("jax_cpu_enable_async_dispatch", False)

import lucid  # noqa: E402
from lucid.optim import schedulefree  # noqa: E402

assert len(jax.devices()) == 8, jax.devices()
DEVICES = np.array(jax.devices())
MESH = Mesh(DEVICES, ("data",))
MESH_2D = Mesh(DEVICES.reshape(4, 2), ("data", "model"))
O = lucid.optim
# one option set per family, most of its branches on
FAMILIES = {
    "SGD": lambda g: O.SGD(g, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
    "Adam": lambda g: O.Adam(g, lr=0.01, amsgrad=True, weight_decay=0.1),
    "AdamW": lambda g: O.AdamW(g, lr=0.01, weight_decay=0.3, maximize=True),
    "RMSprop": lambda g: O.RMSprop(g, lr=0.01, momentum=0.9, centered=True, weight_decay=0.1),
    "Adagrad": lambda g: O.Adagrad(g, lr=0.1, lr_decay=0.01, weight_decay=0.1),
    "Adadelta": lambda g: O.Adadelta(g, lr=0.5, rho=0.8, weight_decay=0.1),
    "Adamax": lambda g: O.Adamax(g, lr=0.01, weight_decay=0.1),
    "RAdam": lambda g: O.RAdam(g, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "NAdam": lambda g: O.NAdam(g, lr=0.01, momentum_decay=0.01, weight_decay=0.1),
    "ASGD": lambda g: O.ASGD(g, lr=0.05, t0=0, weight_decay=0.1),
    "Rprop": lambda g: O.Rprop(g, lr=0.01),
    "AdamWScheduleFree": lambda g: schedulefree.AdamWScheduleFree(g, lr=0.01, warmup_steps=2),
    "Adafactor": lambda g: O.Adafactor(g, lr=0.05, weight_decay=0.1),
    "Muon": lambda g: O.Muon(g, lr=0.02, weight_decay=0.1),
}
PARTS = {
    "torch-1": ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta"),
    "torch-2": ("Adamax", "RAdam", "NAdam", "ASGD", "Rprop", "AdamWScheduleFree"),
    "whole": ("Adafactor", "Muon"),
}
# parameters of 0 to 16 elements: these alone in a group each (a flat buffer each: on 8
# devices an empty piece, pieces of one element, padded pieces), the others in one
ALONE = {0, 1, 2, 5, 8, 9, 16}
SMALL = {f"s{n}": (n,) for n in sorted(ALONE | {3, 4, 7, 11})}
LARGE = {"w": (16, 6), "m": (5, 3), "b": (203,)}
OFF = ("s5", "w")  # parameters on one device beside the mesh
STEPS = 3
# where a run's parameters live: (placement, shard_state_over, compiled, off the mesh);
# each family takes the one-device run, a replicated run and a run with sharded state,
# each in turn of its kind; a few families also an eager run (and its one-device run)
REPLICATED = {"1-D": NamedSharding(MESH, P()), "2-D": NamedSharding(MESH_2D, P())}
RUNS = {
    "replicated 1-D": (REPLICATED["1-D"], None, True, ()),
    "replicated 2-D": (REPLICATED["2-D"], None, True, ()),
    "shard_state_over, two parameters off the mesh": (REPLICATED["1-D"], "data", True, OFF),
    "shard_state_over, 2-D mesh, one axis": (REPLICATED["2-D"], "data", True, ()),
    "shard_state_over, 2-D mesh, both axes": (REPLICATED["2-D"], ("data", "model"), True, ()),
    "eager, 1-D mesh": (REPLICATED["1-D"], None, False, ()),
}
EAGER = {"AdamW", "Adafactor"}  # the families also stepped eagerly on a mesh


def runs_of(index, family):
    """The runs of the ``index``-th family."""
    names = list(RUNS)
    chosen = [names[index % 2], names[2 + index % 3]]
    return chosen + ([names[5]] if family in EAGER else [])


EXACT = {"replicated 1-D", "replicated 2-D"}  # the runs promised bit for bit


def shapes(family):
    """The parameters' shapes (Muon updates matrices only)."""
    every = {**SMALL, **LARGE}
    if family == "Muon":
        return {k: s for k, s in every.items() if len(s) == 2}
    return every


def linear(params, grads):
    """A loss whose gradient is ``grads`` exactly (each one times 1): the gradients are
    given in one program, not one write per parameter."""
    return sum(jnp.sum(params[k] * grads[k]) for k in params)


def run(family, data, where, axes, compiled, off):
    """The parameters and state after ``STEPS`` steps (by name, a state field after a
    space), and, on one device (``where`` None), the largest magnitude each took over
    the steps, its start included."""
    init, grads = data
    keys = list(init)

    def put(k, v):
        if where is None or k in off:
            return jax.device_put(jnp.asarray(v), DEVICES[0])
        return jax.device_put(jnp.asarray(v), where)

    params = {k: lucid.Parameter(put(k, init[k])) for k in keys}
    groups = [{"params": [params[k]]} for k in keys if k in SMALL and int(k[1:]) in ALONE]
    groups.append({"params": [params[k] for k in keys if k in SMALL and int(k[1:]) not in ALONE]})
    groups.append({"params": [params[k] for k in keys if k in LARGE]})
    opt = FAMILIES[family]([g for g in groups if g["params"]])
    if hasattr(opt, "train"):
        opt.train()
    if compiled:
        lucid.compile_optimizer(opt, shard_state_over=axes)
    largest = {k: float(np.abs(init[k]).max(initial=0.0)) for k in keys}
    for i, grad in enumerate(grads):
        for group in opt.param_groups:
            group["lr"] *= 0.8 if i else 1.0  # a runtime value
        opt.zero_grad()
        lucid.backward(linear, params, {k: grad[k] for k in keys})  # the gradients: grad
        opt.step()
        if where is not None and i < STEPS - 1:
            continue  # the largest magnitudes are the one-device run's
        out = {k: np.asarray(p.data) for k, p in params.items()}
        for index, entry in opt.state_dict()["state"].items():
            for name, value in entry.items():
                out[f"{keys[index]} {name}"] = np.asarray(value)
        for key, value in out.items():
            largest[key] = max(largest.get(key, 0.0), float(np.abs(value).max(initial=0.0)))
    return out, largest


def bound(family, key, value, scale):
    """docs/distributed.md's bound for ``value`` (a parameter's or, after a space, a state
    field's) after ``STEPS`` steps, ``scale`` its largest magnitude over them."""
    if family == "Adafactor":  # its sums over a parameter of n elements: 4n more
        n = max(int(np.prod(s)) for s in shapes(family).values())
        return sharded_bound(scale, value.dtype, STEPS, n)
    # Muon with sharded state deals whole matrices out to the devices (no product is
    # split over devices): its momentum is the one-device momentum bit for bit
    if family == "Muon" and " " in key:
        return 0.0
    return sharded_bound(scale, value.dtype, STEPS)


def check(family, name, got, expected):
    """Bit for bit where the docs promise it, else within their bound; returns the
    largest difference as a fraction of its bound (0 where bit for bit)."""
    (got, _), (expected, largest) = got, expected
    assert got.keys() == expected.keys(), (family, name, sorted(got), sorted(expected))
    worst = 0.0
    for key, value in expected.items():
        message = f"{family}, {name}: {key}"
        if name in EXACT:
            np.testing.assert_array_equal(got[key], value, err_msg=message)
            continue
        limit = bound(family, key, value, largest[key])
        difference = float(np.abs(got[key] - value).max(initial=0.0))
        assert difference <= limit, f"{message}: {difference:.3g} > {limit:.3g}"
        worst = max(worst, difference / limit if limit else 0.0)
    return worst


def main(part):
    for index, family in enumerate(FAMILIES):
        if family not in PARTS[part]:
            continue
        rng = np.random.default_rng(index)
        every = shapes(family)
        signs = {k: rng.choice([-1.0, 1.0], size=s) for k, s in every.items()}
        init = {k: rng.uniform(0.25, 0.5, size=s) * signs[k] for k, s in every.items()}
        grads = [{k: rng.normal(size=s) for k, s in every.items()} for _ in range(STEPS)]
        one_device = {}
        line = []
        for name in runs_of(index, family):
            where, axes, compiled, off = RUNS[name]
            if compiled not in one_device:
                one_device[compiled] = run(family, (init, grads), None, None, compiled, ())
            got = run(family, (init, grads), where, axes, compiled, off)
            line.append(f"{name}: {check(family, name, got, one_device[compiled]):.2g}")
        print(f"{family} (largest difference, of the bound):", "; ".join(line), flush=True)


main(sys.argv[1])
print("OK")
