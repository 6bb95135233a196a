"""Every device program lucid builds, lowered for an Apple GPU and checked.

On the oldest CI lane (jax 0.4.35, inside jax-metal's range) the programs are
lowered for the ``METAL`` platform; on the newest for the default platform;
both with x64 off and on. ``metal_programs`` says how the programs are found
and what is checked, and lists the known jax-metal gaps with their sources.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cases import CASES, case_id, functional
from jax.experimental import sparse
from metal_programs import (
    FORBIDDEN_OPS,
    KNOWN_GAPS,
    METAL_LANE,
    TARGET,
    Recorder,
    element_types,
    lower,
    operations,
    problems,
    x64,
)

import lucid
import lucid.functional as LF
import lucid.functional.schedules as S
from lucid.functional.schedules._ops import computing_in

ALL = [*CASES, ("SparseAdam", {"lr": 0.01}), ("LBFGS", {"lr": 0.1})]
ONE_PER_OPTIMIZER = list({name: (name, options) for name, options in reversed(ALL)}.values())
X64 = pytest.mark.parametrize("x64_on", [False, True], ids=["x64-off", "x64-on"])

#: schedules whose program is allowed what the checks otherwise forbid, and why
DECLARED = {
    # torch's MultiplicativeLR with an arbitrary lambda has no closed form: the
    # product of count factors is a fori_loop (a while loop on the device)
    "multiplicative_lr(traced lambda)": frozenset({"stablehlo.while"}),
}


def _arrays(dtype):
    rng = np.random.default_rng(0)
    return {
        "b": jnp.asarray(rng.normal(size=(3,)).astype(dtype)),
        "w": jnp.asarray(rng.normal(size=(5, 3)).astype(dtype)),
    }


def _loss(params, x):
    return jnp.mean(jnp.tanh(x @ params["w"] + params["b"]) ** 2) + 0.1 * jnp.sum(params["w"] ** 2)


def _assert_clean(programs, *, bf16=False, allow=frozenset()):
    assert programs, "no program was lowered"
    bad = {}
    for program in programs:
        found = problems(program.text, bf16=bf16, allow=allow)
        if found:
            bad[program.label] = found
    assert not bad, f"not Metal-safe when lowered for {TARGET}: {bad}"


def _jit_program(fn, *args, label="program", **kwargs):
    return lower(jax.jit(fn), args, kwargs, label)


# ------------------------------------------------------------------ the checker itself


def test_the_checker_sees_what_it_must_refuse():
    """The checks fail on the kinds of program they exist to catch."""
    with x64(True):
        f64 = _jit_program(lambda x: x * 2.0, jnp.ones((5, 3), jnp.float64)).text
        loop = _jit_program(
            lambda x: jax.lax.fori_loop(0, x.astype(jnp.int32), lambda i, v: v * 2, x),
            jnp.float32(3),
        ).text
        cumsum = _jit_program(jnp.cumsum, jnp.ones(8, jnp.float32)).text

        def callback(x):
            return jax.pure_callback(np.sin, jax.ShapeDtypeStruct((3,), jnp.float32), x)

        if METAL_LANE:  # jax itself refuses a host callback for METAL
            with pytest.raises(Exception, match="not supported on METAL"):
                _jit_program(callback, jnp.ones(3, jnp.float32))
        else:
            text = _jit_program(callback, jnp.ones(3, jnp.float32)).text
            assert any("stablehlo.custom_call" in p for p in problems(text))
    assert "tensor<5x3xf64>" in f64 and "f64 in the program" in problems(f64)
    assert "f64" in element_types(f64)
    assert any("stablehlo.while" in p for p in problems(loop))
    assert any(op in FORBIDDEN_OPS for op in operations(cumsum)), operations(cumsum)
    bf16 = _jit_program(lambda x: x + 1, jnp.ones(3, jnp.bfloat16)).text
    assert problems(bf16) == ["element type bf16"] and not problems(bf16, bf16=True)
    assert len(KNOWN_GAPS) >= 6 and all(g.source for g in KNOWN_GAPS)


# ------------------------------------------------------------------ lucid.functional


@X64
@pytest.mark.parametrize("case", ALL, ids=case_id)
def test_functional_init_and_update_lower_clean(case, x64_on):
    name, options = case
    tx = functional(name)(**options)
    params = _arrays(np.float32)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    with x64(x64_on):
        state = jax.jit(tx.init)(params)
        programs = [
            _jit_program(tx.init, params, label="init"),
            _jit_program(tx.update, grads, state, params, label="update"),
        ]
    _assert_clean(programs)


@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
def test_bfloat16_update_lowers_clean_with_declared_bf16(case):
    name, options = case
    tx = functional(name)(**options)
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), _arrays(np.float32))
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    state = jax.jit(tx.init)(params)
    programs = [
        _jit_program(tx.init, params, label="init"),
        _jit_program(tx.update, grads, state, params, label="update"),
    ]
    _assert_clean(programs, bf16=True)
    assert any("bf16" in element_types(p.text) for p in programs)  # the exception is real


def _bcoo_grad():
    # duplicates (summed, as torch's coalesce) and one padding entry out of bounds,
    # holding zero as jax's own padding does (a nonzero one is torch's IndexError)
    indices = jnp.asarray([[0], [3], [0], [5]], jnp.int32)
    data = jnp.ones((4, 3), jnp.float32).at[3].set(0.0)
    return sparse.BCOO((data, indices), shape=(5, 3))


@X64
def test_sparse_adam_with_a_bcoo_gradient_lowers_clean(x64_on):
    tx = LF.sparse_adam(lr=0.01)
    params = _arrays(np.float32)
    grads = {"b": params["b"], "w": _bcoo_grad()}
    with x64(x64_on):
        state = jax.jit(tx.init)(params)
        program = _jit_program(tx.update, grads, state, params, label="bcoo update")
    _assert_clean([program])


def _schedules():
    return {
        "step_lr": S.step_lr(0.1, step_size=3, gamma=0.5),
        "multi_step_lr": S.multi_step_lr(0.1, [2, 5, 5], gamma=0.3),
        "exponential_lr": S.exponential_lr(0.1, gamma=0.97),
        "cosine_annealing_lr": S.cosine_annealing_lr(0.1, T_max=7, eta_min=0.001),
        # a callable runs as written: float32 arithmetic keeps a float32 step clean
        "lambda_lr": S.lambda_lr(0.1, lambda t: 1.0 / (1.0 + t.astype(jnp.float32))),
        "cyclic_lr": S.cyclic_lr(0.01, 0.1, step_size_up=3, mode="exp_range", gamma=0.99),
        "cyclic_lr(triangular2)": S.cyclic_lr(0.01, 0.1, step_size_up=2.5, mode="triangular2"),
        "cyclic_momentum": S.cyclic_momentum(0.8, 0.9, step_size_up=3),
        "noam": S.noam(16, 4),
        "multiplicative_lr": S.multiplicative_lr(0.1, lambda t: 0.95),
        "multiplicative_lr(traced lambda)": S.multiplicative_lr(
            0.1, lambda t: 1.0 - 0.5 / (2.0 + t.astype(jnp.float32))
        ),
        "linear_lr": S.linear_lr(0.1, 0.25, 1.0, total_iters=4),
        "constant_lr": S.constant_lr(0.1, 0.5, total_iters=3),
        "polynomial_lr": S.polynomial_lr(0.1, total_iters=6, power=2.0),
        "cosine_annealing_warm_restarts": S.cosine_annealing_warm_restarts(0.1, 3, T_mult=2),
        "one_cycle_lr": S.one_cycle_lr(0.1, total_steps=20, three_phase=True),
        "one_cycle_momentum": S.one_cycle_momentum(total_steps=20, anneal_strategy="linear"),
        "sequential": S.sequential(
            [S.linear_lr(0.1, 0.5, total_iters=2), S.exponential_lr(0.1, 0.9)], [2]
        ),
        "chained": S.chained(0.1, [S.step_lr(0.1, 2), S.exponential_lr(0.1, 0.9)]),
    }


SCHEDULES = sorted(_schedules())


@X64
@pytest.mark.parametrize("name", SCHEDULES)
def test_each_schedule_alone_and_as_lr_in_a_float32_step_lowers_clean(name, x64_on):
    schedule = _schedules()[name]
    tx = LF.adam(lr=schedule, betas=(0.9, 0.999))
    params = _arrays(np.float32)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    with x64(x64_on):
        state = jax.jit(tx.init)(params)
        # alone: as a float32 step evaluates it (called directly under x64, a schedule
        # computes in float64 by design: the default float dtype)
        with computing_in(np.float32):
            alone = _jit_program(schedule, jnp.asarray(4, jnp.int32), label=name)
        in_step = _jit_program(tx.update, grads, state, params, label=f"adam(lr={name})")
    allow = DECLARED.get(name, frozenset())
    _assert_clean([alone, in_step], allow=allow)
    if allow:  # a declared exception must be needed, or it is stale
        assert problems(alone.text), f"{name}: declared exception no longer needed"


@X64
def test_plateau_lowers_clean(x64_on):
    plateau = S.reduce_lr_on_plateau(0.1, patience=1)
    with x64(x64_on):
        state = plateau.init()
        programs = [
            _jit_program(plateau.update, state, jnp.float32(1.0), label="plateau.update"),
            _jit_program(plateau.scale, state, label="plateau.scale"),
        ]
    if x64_on:  # the state machine's own dtype is the default float dtype (documented)
        assert all("f64" in element_types(p.text) for p in programs)
    else:
        _assert_clean(programs)


# ------------------------------------------------------------------ lucid.optim


def _shell_run(name, options, recorder):
    """Every entry point of the stateful shell once, on float32 parameters."""
    arrays = _arrays(np.float32)
    params = {k: lucid.Parameter(v) for k, v in arrays.items()}
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32))
    opt = getattr(lucid.optim, name)(list(params.values()), **options)
    grads = {k: jnp.full(v.shape, 0.5, jnp.float32) for k, v in arrays.items()}
    if name == "SparseAdam":
        grads["w"] = _bcoo_grad()
    labels = {}

    def mark(entry):
        labels[entry] = set(recorder.programs)

    with recorder.watch():
        if name == "LBFGS":

            def closure():
                opt.zero_grad()
                return lucid.backward(_loss, params, x)

            opt.step(closure)
        else:
            for p, g in zip(params.values(), grads.values()):
                p.grad = g
            opt.step()
            opt.step()
        mark("eager step")
        compiled = lucid.compile_optimizer(opt)
        for p, g in zip(params.values(), grads.values()):
            p.grad = g
        compiled.step()
        compiled.step()
        mark("compiled step")
        _ = [p.data for p in params.values()], [p.grad for p in params.values()]
        params["w"].data = params["w"].data * 0.5
        params["b"].grad = jnp.ones(3, jnp.float32)
        compiled.zero_grad()
        mark("store reads and writes")
        lucid.backward(_loss, params, x)
        mark("backward")
        fused = lucid.optim.fused_step(_loss, opt)
        fused(params, x)
        fused(params, x)
        mark("fused step")
    return labels


@X64
@pytest.mark.parametrize("case", ONE_PER_OPTIMIZER, ids=case_id)
def test_eager_compiled_fused_backward_and_store_lower_clean(case, x64_on):
    """One option set per optimizer: the rule's program for every option set is the
    functional update's, checked above; this covers what the shell adds around it."""
    name, options = case
    recorder = Recorder()
    with recorder.installed(), x64(x64_on):
        _shell_run(name, options, recorder)
    programs = list(recorder.programs.values())
    labels = {p.label for p in programs}
    assert any(label.startswith("jit(") for label in labels), labels
    if getattr(lucid.optim, name).rule.execution.elementwise:  # flat stores exist only for these
        assert any("_store._write" in label for label in labels), labels
    _assert_clean(programs)
    steps = [p for p in programs if p.donates]
    assert steps, "the compiled step asks for donation"
    for program in steps:
        # jax-metal cannot alias buffers: there the compiled step copies (documented)
        assert program.donation_refused == METAL_LANE, program.label


def test_the_mac_check_script_runs_and_agrees_with_the_cpu(capsys):
    """examples/check_apple_gpu.py: here the default device is the CPU itself."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "check_apple_gpu.py"
    spec = importlib.util.spec_from_file_location("check_apple_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 0
    out = capsys.readouterr().out
    assert "platform 'cpu'" in out and out.count("ok ") == len(module.OPTIMIZERS)
