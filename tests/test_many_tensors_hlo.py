"""What lucid adds to the compiled programs of a loss over many separate parameters
held in one flat buffer: one view per parameter and one join of the gradients, never
more (issue #23; `benchmarks/analyze_whole_iteration.py` counts them on any backend).

Each check compiles the optimized HLO of the program lucid runs (``lucid.backward``'s
loss program, the fused step's one executable) for two counts of parameters and
compares it with ``jax.value_and_grad`` of the same loss over separate arrays: the
ops the count adds are the loss's own plus at most one per parameter (its view), and
the gradients reach the flat buffer through one concatenation, not through pads of
the whole buffer (a gradient taken with respect to the flat buffer: each slice's
transpose is a pad, and their sum costs a pass over the buffer per parameter).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lucid
from lucid._backward import loss_program, partition
from lucid._platform import CUT_AT_RUN_TIME
from lucid._storage import run_time_offsets
from lucid.nn import utils as clip_utils
from lucid.optim._engine import programs

NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
SIZE = 64


def loss_fn(params, consts):
    return sum(jnp.sum(jnp.tanh(p) * c) for p, c in zip(params, consts))


def ops(text: str) -> tuple[list[str], str]:
    """The opcodes of the entry computation's ops that run as kernels, and the text."""
    entry = text[text.index("\nENTRY") :].split("\n}\n")[0]
    found = re.findall(r"\n\s*(?:ROOT )?%[\w.\-]+ = .*? ([a-z\-]+)\(", entry)
    return [op for op in found if op not in NOT_KERNELS], text


def model(n: int):
    params = [lucid.Parameter(jnp.linspace(-1.0, 1.0, SIZE) * (i + 1)) for i in range(n)]
    consts = [jnp.full((SIZE,), 0.5 + i, jnp.float32) for i in range(n)]
    return params, consts


def separate_ops(n: int) -> tuple[list[str], str]:
    """The loss by itself, over separate arrays, without lucid."""
    _, consts = model(n)
    values = [jnp.linspace(-1.0, 1.0, SIZE) * (i + 1) for i in range(n)]
    program = jax.jit(jax.value_and_grad(loss_fn))
    return ops(program.lower(values, consts).compile().as_text())


def compiled_model(n: int):
    """``model(n)`` with a compiled optimizer that has stepped: the parameters in one
    flat store, their gradients in its flat buffer."""
    params, consts = model(n)
    opt = lucid.optim.Adam(params, lr=1e-3)
    lucid.compile_optimizer(opt)
    opt.zero_grad()
    lucid.backward(loss_fn, params, consts)
    opt.step()  # the parameters now live in one flat store
    lucid.backward(loss_fn, params, consts)
    return params, consts


def backward_text(n: int) -> str:
    """The optimized HLO of ``lucid.backward``'s program over ``n`` flat parameters."""
    params, consts = compiled_model(n)
    traced = partition(params, (consts,), {})
    assert len(traced.storages) == 1 and len(traced.buffers[0].shape) == 1
    program = loss_program(loss_fn, traced.static, False)
    offsets = tuple(map(run_time_offsets, traced.static[3], traced.buffers))
    return program.lower(traced.buffers, offsets, traced.arrays).compile().as_text()


def backward_ops(n: int) -> tuple[list[str], str]:
    return ops(backward_text(n))


def clip_text(n: int) -> str:
    """The optimized HLO of ``clip_grad_norm_``'s program over ``n`` flat gradients."""
    params, _ = compiled_model(n)
    grads = clip_utils._Gradients(params, "clip_grad_norm_")
    assert len(grads.arrays) == 1  # the store's whole gradient buffer
    offsets = clip_utils._offsets(grads.arrays, grads.layouts)
    max_norm = jnp.asarray(1.0)
    lowered = clip_utils._clipped_by_norm.lower(
        grads.arrays, max_norm, grads.layouts, grads.order, offsets, grads.times, 2.0
    )
    return lowered.compile().as_text()


def fused_kernels(text: str) -> set[str]:
    """The distinct bodies of the fused computations of an optimized HLO text (names and
    metadata left out): what the backend compiles, once per distinct body."""
    bodies = re.findall(r"^%?fused_computation\S* \(.*?\) -> .*? \{\n(.*?)\n\}", text, re.M | re.S)
    return {re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", body)) for body in bodies}


def fused_texts(n: int, monkeypatch) -> tuple[str, str]:
    """The fused step's program as the backend builds it: lowered, and optimized."""
    texts, lowered_texts = [], []
    real_jit = jax.jit

    def recording_jit(fun, *args, **kwargs):
        jitted = real_jit(fun, *args, **kwargs)
        if getattr(fun, "__name__", "") != "fused":
            return jitted

        def call(*call_args, **call_kwargs):
            lowered = jitted.lower(*call_args, **call_kwargs)
            lowered_texts.append(lowered.as_text())
            texts.append(lowered.compile().as_text())
            return jitted(*call_args, **call_kwargs)

        return call

    params, consts = model(n)
    opt = lucid.optim.Adam(params, lr=1e-3)
    step = lucid.optim.fused_step(loss_fn, opt)
    programs.fused_program.cache_clear()
    with monkeypatch.context() as patch:
        patch.setattr(programs.jax, "jit", recording_jit)
        step(params, consts)
    programs.fused_program.cache_clear()  # the recording program is not kept
    assert len(texts) == 1
    return lowered_texts[0], texts[0]


def fused_ops(n: int, monkeypatch) -> tuple[list[str], str]:
    return ops(fused_texts(n, monkeypatch)[1])


COUNTS = (3, 9)


def assert_lucid_adds_one_view_per_parameter(lucid_ops: dict, plain_ops: dict) -> None:
    """Between the two counts, the program grows by the loss's own ops and at most one
    op per parameter; its gradients are joined by at most one concatenation, with no
    pad or in-place update of the buffer anywhere (inside fusions too)."""
    small, large = COUNTS
    for found, text in lucid_ops.values():
        assert " pad(" not in text and " dynamic-update-slice(" not in text
        assert found.count("concatenate") <= 1 and text.count(" concatenate(") <= 1
    grown = len(lucid_ops[large][0]) - len(lucid_ops[small][0])
    plain_grown = len(plain_ops[large][0]) - len(plain_ops[small][0])
    assert grown <= plain_grown + (large - small), (grown, plain_grown)


@pytest.fixture(scope="module")
def plain():
    return {n: separate_ops(n) for n in COUNTS}


def test_backward_program_adds_at_most_a_view_per_parameter_and_one_join(plain):
    assert_lucid_adds_one_view_per_parameter({n: backward_ops(n) for n in COUNTS}, plain)


def test_fused_program_adds_at_most_a_view_per_parameter_and_one_join(plain, monkeypatch):
    found = {n: fused_ops(n, monkeypatch) for n in COUNTS}
    assert_lucid_adds_one_view_per_parameter(found, plain)


def test_fused_update_reads_the_donated_values_after_the_loss(monkeypatch):
    """The update overwrites the donated value buffer in place, and reads it through a
    barrier with the loss: every read of the loss comes first, so XLA need not copy the
    whole buffer to keep it (XLA:CPU drops barriers before it orders the program and
    copies anyway; the GPU's compiler removes them after scheduling)."""
    lowered, _ = fused_texts(3, monkeypatch)
    assert "optimization_barrier" in lowered


def test_gradient_through_the_flat_buffer_fails_the_check(plain):
    """The check can fail: the gradient taken with respect to the flat buffer itself
    (the slices inside the differentiated function) is a sum of one pad of the whole
    buffer per parameter (on the CPU, 150x slower than the join at 300 parameters)."""

    def through_buffer(n: int) -> tuple[list[str], str]:
        _, consts = model(n)

        def loss_of_buffer(buffer, consts):
            return loss_fn([buffer[i * SIZE : (i + 1) * SIZE] for i in range(n)], consts)

        program = jax.jit(jax.value_and_grad(loss_of_buffer))
        return ops(program.lower(jnp.zeros(n * SIZE), consts).compile().as_text())

    with pytest.raises(AssertionError):
        assert_lucid_adds_one_view_per_parameter({n: through_buffer(n) for n in COUNTS}, plain)


def test_views_and_join_give_the_same_gradients_as_separate_arrays():
    params, consts = model(5)
    opt = lucid.optim.Adam(params, lr=1e-3)
    lucid.compile_optimizer(opt)
    opt.zero_grad()
    lucid.backward(loss_fn, params, consts)
    opt.step()
    opt.zero_grad()
    lucid.backward(loss_fn, params, consts)
    values = [p.data for p in params]
    grads = jax.jit(jax.grad(loss_fn))(values, consts)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(np.asarray(p.grad), np.asarray(g))


# XLA compiles a cut of a flat buffer at a constant offset as a kernel of its own (on
# XLA:CPU about 30 ms each); lucid cuts at offsets given at run time, so that parameters of
# one shape share one compiled cut (`lucid._platform.CUT_AT_RUN_TIME`).
cuts_at_run_time = pytest.mark.skipif(
    not CUT_AT_RUN_TIME, reason="this jax's XLA compiles constant cuts as fast: lucid keeps them"
)


@cuts_at_run_time
@pytest.mark.parametrize("program", ["backward", "clip_grad_norm_", "fused step"])
def test_parameters_of_one_shape_share_their_compiled_cut_of_the_flat_buffer(program, monkeypatch):
    text_of = {
        "backward": backward_text,
        "clip_grad_norm_": clip_text,
        "fused step": lambda n: fused_texts(n, monkeypatch)[1],
    }[program]
    small, large = 3, 12
    texts = {n: text_of(n) for n in (small, large)}
    # nine parameters of that shape more: at most the two kernels of a longer list of
    # norms (a cut per parameter would be nine more)
    grown = len(fused_kernels(texts[large])) - len(fused_kernels(texts[small]))
    assert grown <= 2, grown


def test_run_time_offsets_are_those_of_the_layout_where_the_gate_holds():
    params, _ = compiled_model(4)
    store = params[0].location[0]
    offsets = run_time_offsets(store.layout, store.buffer)
    if not CUT_AT_RUN_TIME:
        assert offsets is None
        return
    assert [int(o) for o in offsets] == [0, SIZE, 2 * SIZE, 3 * SIZE]
    assert run_time_offsets(store.layout, store.buffer) is offsets  # made once per layout
