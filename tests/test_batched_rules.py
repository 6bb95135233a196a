"""Same-shaped parameters of a ``batched`` rule are updated in one batched call
(`lucid.functional._apply.apply_leaves`), with the numbers of the per-parameter
update, in every form: the functional transform, the eager and the compiled step.

The oracle is the same rule with ``Execution.batched`` off (`with_batched`):
each parameter through `apply_leaf` alone, as before batching existed. On XLA:CPU
Muon's batched step is the per-matrix step bit for bit (the Newton-Schulz
products become batched ``dot_general``s that XLA:CPU runs as one matrix product
per batch element, in the same order), so these tests compare exactly. Counting
the batched ``dot_general``s in the lowered programs proves that batching happens
(and the tests fail if it silently stops).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _distributed import HOST_DEVICES, run_script

import lucid
from lucid.functional._apply import apply_leaf, apply_leaves, pack, transform
from lucid.functional.muon import MUON, MUON_SIGNATURE, _with_ns_dtype, orthogonalize
from lucid.functional.rule import Rule
from lucid.functional.sgd import SGD
from lucid.optim._engine import compiled as compiled_module
from lucid.optim._engine import eager as eager_module


def with_batched(rule: Rule, batched: bool) -> Rule:
    """``rule`` with its `Execution.batched` hint set to ``batched`` (nothing else moves)."""
    return dataclasses.replace(rule, execution=dataclasses.replace(rule.execution, batched=batched))


PER_MATRIX = with_batched(MUON, False)
COEFFICIENTS = (3.4445, -4.775, 2.0315)
NS_STEPS = 5
DOTS_PER_UPDATE = 3 * NS_STEPS  # X X^T, G G and (bG + cG^2) X per iteration
OPTIONS = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9}
DEFAULTS = {arg.name: arg.default for arg in MUON_SIGNATURE.keywords()}

# two shape classes (wide, tall), a shape alone, two dtypes alone
SHAPES = {
    "a1": ((4, 6), jnp.float32),
    "a2": ((4, 6), jnp.float32),
    "a3": ((4, 6), jnp.float32),
    "b1": ((6, 4), jnp.float32),
    "b2": ((6, 4), jnp.float32),
    "c": ((5, 5), jnp.float32),
    "h": ((4, 6), jnp.bfloat16),
    "d": ((4, 6), jnp.float64),
}


def _arrays(seed: int, names=SHAPES) -> dict[str, jax.Array]:
    key = jax.random.PRNGKey(seed)
    return {
        k: jax.random.normal(jax.random.fold_in(key, i), SHAPES[k][0], jnp.float32).astype(
            SHAPES[k][1]
        )
        for i, k in enumerate(names)
    }


def _assert_bitwise(actual, expected) -> None:
    chex.assert_trees_all_equal_shapes_and_dtypes(actual, expected)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        wide = np.complex128 if jnp.iscomplexobj(a) else np.float64
        np.testing.assert_array_equal(np.asarray(a).astype(wide), np.asarray(e).astype(wide))


def _dot_batches(text: str) -> collections.Counter:
    """The lowered program's ``dot_general``s by batch size (1: not batched)."""
    sizes: collections.Counter = collections.Counter()
    for line in text.splitlines():
        if "stablehlo.dot_general" not in line:
            continue
        operand = re.search(r": \(tensor<([0-9x]+)x[a-z]", line).group(1)
        sizes[int(operand.split("x")[0]) if "batching_dims" in line else 1] += 1
    return sizes


# ------------------------------------------------------------- the iteration


@pytest.mark.parametrize(
    "shape", [(6, 4), (3, 5), (8, 8), (32, 96), (128, 64)], ids=str
)  # tall, wide, square, 96 columns, 128 rows (transposed)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64], ids=str)
def test_newton_schulz_under_vmap_is_the_per_matrix_iteration_bit_for_bit(shape, dtype):
    key = jax.random.PRNGKey(0)
    updates = jax.random.normal(key, (3, *shape), jnp.float32).astype(dtype)

    def one(u):
        return orthogonalize(u, COEFFICIENTS, NS_STEPS, 1e-7)

    batched = jax.jit(jax.vmap(one))(updates)
    single = jax.jit(one)
    for i in range(3):
        _assert_bitwise(batched[i], single(updates[i]))


# -------------------------------------------------------- the transform


def _run_transform(rule, params, steps=3, **options):
    tx = transform(rule, {**DEFAULTS, **OPTIONS, **options})
    state = tx.init(params)
    update = jax.jit(tx.update)
    for step in range(steps):
        grads = _arrays(100 + step, params)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("ns_dtype", [None, jnp.float64], ids=["bfloat16 NS", "float64 NS"])
def test_functional_batched_equals_per_matrix_bit_for_bit(ns_dtype):
    batched = MUON if ns_dtype is None else _with_ns_dtype(ns_dtype)
    oracle = with_batched(batched, False)
    params = _arrays(0)
    _assert_bitwise(_run_transform(batched, params), _run_transform(oracle, params))


def test_functional_batched_with_a_schedule_equals_per_matrix():
    # a schedule is evaluated per parameter: its values are stacked and batched
    lr = optax.exponential_decay(0.05, 1, 0.5)
    params = _arrays(0)
    _assert_bitwise(_run_transform(MUON, params, lr=lr), _run_transform(PER_MATRIX, params, lr=lr))


def test_the_transform_batches_each_shape_class():
    params = _arrays(0)
    for rule, expected in [
        # classes of 3 and 2 batched; the (5, 5), bfloat16 and float64 matrices alone
        (MUON, {3: DOTS_PER_UPDATE, 2: DOTS_PER_UPDATE, 1: 3 * DOTS_PER_UPDATE}),
        (PER_MATRIX, {1: 8 * DOTS_PER_UPDATE}),
    ]:
        tx = transform(rule, {**DEFAULTS, **OPTIONS})
        text = jax.jit(tx.update).lower(params, tx.init(params), params).as_text()
        assert _dot_batches(text) == expected


def test_where_xla_fuses_the_epilogue_otherwise_within_one_rounding_per_step():
    """On some small float32 shapes (measured: 8x8 and 8x4) XLA:CPU fuses the last
    Newton-Schulz product with the update ``p (1 - lr wd) - lr' O`` into one loop that
    LLVM compiles with a fused multiply-add in one program and with two roundings in
    the other. The iteration and the momentum buffer stay bit for bit; the parameter
    may differ by one float32 rounding of each of the two products and of their sum
    per step: ``|d| <= 2u (|p| + lr' |O|)`` with ``u = 2**-24`` and ``|O| <= 1.5`` (a
    Newton-Schulz output's entries), summed over the steps (``1 - lr wd <= 1`` keeps
    an earlier difference from growing)."""
    shapes = {"s1": (8, 8), "s2": (8, 8), "t1": (8, 4), "t2": (8, 4)}
    key = jax.random.PRNGKey(3)
    params = {
        k: jax.random.normal(jax.random.fold_in(key, i), s, jnp.float32)
        for i, (k, s) in enumerate(shapes.items())
    }
    steps = 3
    tx_options = {**DEFAULTS, **OPTIONS}
    results = []
    for rule in (MUON, PER_MATRIX):
        tx = transform(rule, tx_options)
        state, values = tx.init(params), params
        update = jax.jit(tx.update)
        for step in range(steps):
            grads = {
                k: jax.random.normal(jax.random.fold_in(key, 10 * step + i), s, jnp.float32)
                for i, (k, s) in enumerate(shapes.items())
            }
            updates, state = update(grads, state, values)
            values = optax.apply_updates(values, updates)
        results.append((values, state))
    (batched, batched_state), (single, single_state) = results
    _assert_bitwise(batched_state, single_state)
    u = 2.0**-24
    for k, s in shapes.items():
        adjusted = OPTIONS["lr"] * max(1.0, s[0] / s[1]) ** 0.5
        largest = max(float(jnp.max(jnp.abs(v[k]))) for v in (params, single))
        bound = steps * 2 * u * (largest + adjusted * 1.5)
        assert float(jnp.max(jnp.abs(batched[k] - single[k]))) <= bound, k


# ------------------------------------------------------- the stateful shells

# group 0 and group 1 differ in lr and weight decay (same flags: their matrices batch
# together); group 2 differs in a flag (its matrices batch apart)
GROUPS = [
    (["a1", "b1", "a2", "c"], {}),
    (["a3", "b2", "d"], {"lr": 0.05, "weight_decay": 0.0}),
    (["h"], {"nesterov": False}),
]


def _shell(values: dict[str, jax.Array]):
    params = {k: lucid.Parameter(v) for k, v in values.items()}
    groups = [{"params": [params[k] for k in names], **o} for names, o in GROUPS]
    return params, lucid.optim.Muon(groups, **OPTIONS)


def _steps(params, opt, steps: int, first: int = 0) -> None:
    for step in range(first, first + steps):
        grads = _arrays(100 + step)
        for k, p in params.items():
            # a2 (in the middle of its class, in the order of its group) has no gradient
            # at the second step
            p.grad = None if (k == "a2" and step == 1) else grads[k]
        opt.step()


def _run_shell(rule, compiled: bool, monkeypatch, steps: int = 3):
    with monkeypatch.context() as patch:
        patch.setattr(lucid.optim.Muon, "rule", rule)
        params, opt = _shell(_arrays(0))
        if compiled:
            lucid.compile_optimizer(opt)
        _steps(params, opt, steps)
        return params, opt


def _values(params) -> dict[str, np.ndarray]:
    return {k: np.asarray(p.data) for k, p in params.items()}


def _state_dict_arrays(opt) -> dict:
    sd = opt.state_dict()
    return {i: {k: np.asarray(v) for k, v in s.items()} for i, s in sd["state"].items()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_shell_batched_equals_per_matrix_bit_for_bit(compiled, monkeypatch):
    params, opt = _run_shell(MUON, compiled, monkeypatch)
    oracle_params, oracle = _run_shell(PER_MATRIX, compiled, monkeypatch)
    assert opt.backend.rule is MUON and oracle.backend.rule is PER_MATRIX
    _assert_bitwise(_values(params), _values(oracle_params))
    _assert_bitwise(_state_dict_arrays(opt), _state_dict_arrays(oracle))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_state_dict_round_trip_after_a_batched_step(compiled, monkeypatch):
    params, opt = _run_shell(MUON, compiled, monkeypatch, steps=2)
    sd = opt.state_dict()
    # one entry per parameter, in torch's format: a momentum buffer of its shape
    order = [k for names, _ in GROUPS for k in names]
    assert sorted(sd["state"]) == list(range(len(order)))
    for index, k in enumerate(order):
        entry = sd["state"][index]
        assert set(entry) == {"momentum_buffer"}
        assert entry["momentum_buffer"].shape == SHAPES[k][0]
    # a new optimizer loaded from it steps as the one it came from
    copy_params, copy = _shell({k: p.data for k, p in params.items()})
    if compiled:
        lucid.compile_optimizer(copy)
    copy.load_state_dict(sd)
    _steps(params, opt, 2, first=2)
    _steps(copy_params, copy, 2, first=2)
    _assert_bitwise(_values(copy_params), _values(params))
    _assert_bitwise(_state_dict_arrays(copy), _state_dict_arrays(opt))


def test_the_compiled_step_batches_each_shape_class(monkeypatch):
    lowered: list[str] = []
    real = compiled_module.step_program

    def spy(rule, plans):
        run = real(rule, plans)

        def traced(*args):
            lowered.append(run.lower(*args).as_text())
            return run(*args)

        return traced

    monkeypatch.setattr(compiled_module, "step_program", spy)
    for rule, expected in [
        # a1, a2, a3 over groups 0 and 1 (lr stacked); b1, b2; c, h and d alone
        (MUON, {3: DOTS_PER_UPDATE, 2: DOTS_PER_UPDATE, 1: 3 * DOTS_PER_UPDATE}),
        (PER_MATRIX, {1: 8 * DOTS_PER_UPDATE}),
    ]:
        lowered.clear()
        _run_shell(rule, True, monkeypatch, steps=1)
        assert len(lowered) == 1  # one program for the whole step
        assert _dot_batches(lowered[0]) == expected


def test_the_eager_step_batches_each_group_s_shape_classes():
    params, _ = _shell(_arrays(0))
    grads = _arrays(100)
    names = ["a1", "b1", "a2", "c"]  # group 0: a1 and a2 batch, b1 and c alone
    values = [params[k].data for k in names]
    hyper, flags = MUON.split({**DEFAULTS, **OPTIONS})
    keys = tuple(sorted(pack(MUON, hyper)))
    vector = np.asarray([pack(MUON, hyper)[k] for k in keys], np.float32)
    states = [MUON.init(v, {}) for v in values]
    for rule, expected in [
        (MUON, {2: DOTS_PER_UPDATE, 1: 2 * DOTS_PER_UPDATE}),
        (PER_MATRIX, {1: 4 * DOTS_PER_UPDATE}),
    ]:
        program = eager_module.group_program(rule, tuple(sorted(flags.items())), keys)
        text = program.lower(vector, values, [grads[k] for k in names], states).as_text()
        assert _dot_batches(text) == expected


def test_muon_is_batched_by_default():
    assert (
        MUON.execution.batched
        and lucid.optim.Muon.rule.execution.batched
        and not PER_MATRIX.execution.batched
    )


# ---------------------------------------------- leaves that cannot batch


def test_leaves_that_cannot_batch_are_updated_alone_in_their_order():
    """A sparse gradient or a complex parameter among same-shaped dense ones goes
    through `apply_leaf` alone; every output is the per-leaf one, in input order."""
    from jax.experimental import sparse

    rule = with_batched(SGD, True)
    hyper, flags = rule.split(
        {
            "lr": 0.1,
            "momentum": 0.9,
            "dampening": 0.0,
            "weight_decay": 0.01,
            "nesterov": False,
            "maximize": False,
        }
    )
    hyper = pack(rule, hyper)
    rng = np.random.default_rng(0)
    real = [jnp.asarray(rng.normal(size=(3, 2)), jnp.float32) for _ in range(3)]
    params = [real[0], jnp.asarray(rng.normal(size=(3, 2)) + 1j, jnp.complex64), *real[1:]]
    grads = [jnp.asarray(rng.normal(size=(3, 2)), p.dtype) for p in params]
    grads[2] = sparse.BCOO.fromdense(grads[2])
    states = [
        rule.init(p, hyper, **flags)._replace(momentum_buffer=jnp.ones_like(p)) for p in params
    ]
    states = [s._replace(step=jnp.ones((), jnp.float32)) for s in states]
    n = len(params)
    new_params, new_states = apply_leaves(rule, [flags] * n, [hyper] * n, params, grads, states)
    for i in range(n):
        expected = apply_leaf(rule, flags, hyper, params[i], grads[i], states[i])
        _assert_bitwise((new_params[i], new_states[i]), expected)


# ------------------------------------------------------ sharded matrices

SHARDED = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=2"
    import dataclasses
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # see tests/_distributed.py
    import lucid
    from lucid.functional.muon import MUON

    mesh = Mesh(np.array(jax.devices()), ("model",))
    rng = np.random.default_rng(0)
    specs = [P("model"), P("model"), P(None, "model"), P()]  # a shape class of four
    init = [rng.normal(size=(4, 6)).astype(np.float32) for _ in specs]
    grads = [[rng.normal(size=(4, 6)).astype(np.float32) for _ in specs] for _ in range(2)]

    from _distributed import record_step_programs

    lowered = record_step_programs(lambda program: program.as_text())

    def run(rule, compiled):
        lucid.optim.Muon.rule = rule
        params = [lucid.Parameter(jax.device_put(v, NamedSharding(mesh, s)))
                  for v, s in zip(init, specs)]
        opt = lucid.optim.Muon(params, lr=0.02)
        if compiled:
            lucid.compile_optimizer(opt)
        for step in grads:
            for p, g, s in zip(params, step, specs):
                p.grad = jax.device_put(g, NamedSharding(mesh, s))
            opt.step()
        for p, s in zip(params, specs):
            assert p.data.sharding.is_equivalent_to(NamedSharding(mesh, s), 2), p.data.sharding
        return [np.asarray(p.data) for p in params]

    for compiled in (False, True):
        batched = run(MUON, compiled)
        per_matrix = dataclasses.replace(MUON.execution, batched=False)
        single = run(dataclasses.replace(MUON, execution=per_matrix), compiled)
        for b, s in zip(batched, single):
            np.testing.assert_array_equal(b, s)
    # the two matrices sharded alike are batched, the two others not: 15 batched
    # products (3 per Newton-Schulz step) and 30 single ones; per matrix, 60 single
    batched_dots = [t.count("batching_dims") for t in lowered]
    all_dots = [t.count("stablehlo.dot_general") for t in lowered]
    assert batched_dots == [15, 15, 0, 0] and all_dots == [45, 45, 60, 60], (batched_dots, all_dots)
    print("OK")
    """
)


@HOST_DEVICES
def test_sharded_matrices_batch_keep_their_sharding_and_their_numbers(tmp_path):
    run_script(tmp_path / "sharded_muon.py", SHARDED)


# --------------------------------------------------- the other batched rules

# every registered rule that declares `batched`, and a parameter set with classes of
# same-shaped matrices and vectors (large enough for the low-bit rules' 8-bit state)
OTHERS = [
    ("torch.optim", "Adafactor", jnp.float32),
    ("bitsandbytes", "Adam8bit", jnp.float32),
    ("bitsandbytes", "LAMB8bit", jnp.float32),
    ("bitsandbytes", "Lion8bit", jnp.float32),
    ("bitsandbytes", "RMSprop32bit", jnp.float32),
    ("torchao", "AdamW8bit", jnp.float32),
    ("torchao", "Adam4bit", jnp.bfloat16),  # bfloat16: the stochastic rounding's keys
]


def _entry(reference: str, name: str):
    from lucid.optim._registry import registered

    return next(e for e in registered(reference) if e.name == name)


@pytest.mark.parametrize("reference,name,dtype", OTHERS, ids=[n for _, n, _ in OTHERS])
def test_other_batched_rules_equal_their_per_parameter_update_bit_for_bit(reference, name, dtype):
    entry = _entry(reference, name)
    assert entry.rule.execution.batched
    options = entry.signature.bind(name, (), {"lr": 1e-3})
    rng = np.random.default_rng(0)
    shapes = [(64, 128)] * 3 + [(4096,)] * 2 + [(8, 16)]
    params = {f"p{i}": jnp.asarray(rng.normal(size=s), dtype) for i, s in enumerate(shapes)}
    results = []
    for rule in (entry.rule, with_batched(entry.rule, False)):
        tx = transform(rule, options)
        state, values = tx.init(params), params
        update = jax.jit(tx.update)
        for step in range(2):
            grads = {
                k: jnp.asarray(np.random.default_rng(10 + step).normal(size=v.shape), dtype)
                for k, v in values.items()
            }
            if step == 0:  # the three matrices are one batched call
                batched = "3,64,128]" in str(jax.make_jaxpr(tx.update)(grads, state, values))
                assert batched == rule.execution.batched
            updates, state = update(grads, state, values)
            values = optax.apply_updates(values, updates)
        results.append((values, state))
    _assert_bitwise(results[0], results[1])


def test_torchao_fp8_adam_is_not_batched():
    # under vmap XLA divides a batched scale by 448 otherwise than torch's quotient
    # (an ulp off in some scales): the fp8 rules update each parameter alone
    assert not _entry("torchao", "AdamFp8").rule.execution.batched
    assert _entry("torchao", "Adam8bit").rule.execution.batched
