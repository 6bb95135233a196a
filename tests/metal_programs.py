"""Lowering every device program lucid builds for an Apple GPU, without a Mac.

Used by ``tests/test_metal_lowering.py``; ``python tests/metal_programs.py``
prints one verdict per entry point (see docs/backends.md).

*Which platform.* Apple's jax-metal plugin (platform ``METAL``) works only with
jax/jaxlib 0.4.34 to 0.5.0. On such a jax (CI's oldest lane, 0.4.35) every
program is lowered with ``lowering_platforms=("METAL",)``: jax's own
METAL-specific lowering rules apply (cumulative sums become an
``associative_scan``) and jax refuses buffer donation for METAL, as on a Mac.
On a newer jax the programs are lowered for the default platform (the newest
lane); jax-mps (platform ``mps``) has no jax-side lowering rules of its own.

*How programs are found.* :class:`Recorder` sees every jitted call lucid makes
from Python -- functions jitted at import time in ``lucid.*`` modules, those
made by ``jax.jit`` at run time (the eager group step, the compiled and fused
steps) and every primitive jax runs op by op outside a jit (state creation,
flat-buffer set-up) -- and lowers each one, with its real arguments, before it
runs (a donated argument is gone afterwards).

*What is checked* (:func:`problems`): element types on an allow-list (f32,
i32, i1, and bf16 where a case declares it; f64 in any spelling is an error),
operations on an allow-list, and the operations jax-metal is known to fail on
(:data:`KNOWN_GAPS`) forbidden unless a case declares the exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax._src import dispatch

JAX_VERSION = tuple(int(part) for part in jax.__version__.split(".")[:3])
#: jax-metal's working range ends at jax 0.5.0 (jax-ml/jax#27062)
METAL_LANE = JAX_VERSION < (0, 5, 1)
TARGET = "METAL" if METAL_LANE else jax.default_backend()


@dataclasses.dataclass(frozen=True)
class Gap:
    """A known jax-metal limitation that lucid's programs could run into."""

    what: str
    source: str
    check: str


#: What jax-metal 0.1.1 is known not to do, each with its public source, and
#: how this check keeps lucid's programs away from it.
KNOWN_GAPS = (
    Gap(
        "no buffer donation: jax lowers donated arguments as plain inputs for METAL",
        "jax/_src/interpreters/mlir.py (_platforms_with_donation has no METAL)",
        "the compiled and fused steps' donation is asserted refused on the METAL lane: "
        "they copy, not update in place, there",
    ),
    Gap(
        "no float64",
        "jax-ml/jax#16435, jax-ml/jax#20938",
        "f64 is an error in every program of a float32 step, with x64 on or off",
    ),
    Gap(
        "bfloat16 not enabled",
        "jax-ml/jax#16417",
        "bf16 only in cases that declare bf16 parameters; documented as unsupported",
    ),
    Gap(
        "while loops (crashed before 0.1.1) and cond/case (fails to compile)",
        "jax-ml/jax#21552, jax-ml/jax#21601",
        "stablehlo.while, .case and .if are forbidden; multiplicative_lr with a traced "
        "lambda is a declared exception (a fori_loop)",
    ),
    Gap(
        "pad and reduce_window fail to legalize (jax lowers cumulative sums for METAL "
        "through an associative scan, whose interleaving pads with interior padding)",
        "jax-ml/jax#16366; jax/_src/lax/control_flow/loops.py "
        "('For jax-metal, until reduce_window legalization is better supported')",
        "stablehlo.reduce_window and stablehlo.pad are forbidden (BCOO SparseAdam sums "
        "duplicates without a cumulative sum)",
    ),
    Gap(
        "out-of-bounds indices handled differently from the CPU (clipping)",
        "jax-ml/jax#21393",
        "not visible in a lowering: lucid's gathers, scatters and dynamic slices index in "
        "bounds by construction (BCOO padding is redirected to a real entry)",
    ),
    Gap(
        "no host callbacks or custom calls",
        "jax-metal runs StableHLO through MPSGraph (developer.apple.com/metal/jax)",
        "stablehlo.custom_call is forbidden",
    ),
)

ALLOWED_TYPES = {"f32", "i32", "i1", "ui32"}
# ui32: the bit patterns of f32 (bitcast_convert, frexp-style exponent tricks)

ALLOWED_OPS = {
    # structure
    "module",
    "func.func",
    "func.call",
    "call",
    "return",
    "func.return",
    "stablehlo.return",
    # values and shapes
    "stablehlo.constant",
    "stablehlo.iota",
    "stablehlo.broadcast_in_dim",
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.concatenate",
    "stablehlo.slice",
    "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice",
    "stablehlo.gather",
    "stablehlo.scatter",
    "stablehlo.sort",
    "stablehlo.convert",
    "stablehlo.bitcast_convert",
    "stablehlo.reduce",
    "stablehlo.dot_general",
    "stablehlo.select",
    "stablehlo.compare",
    "stablehlo.clamp",
    # elementwise arithmetic
    "stablehlo.add",
    "stablehlo.subtract",
    "stablehlo.multiply",
    "stablehlo.divide",
    "stablehlo.remainder",
    "stablehlo.negate",
    "stablehlo.abs",
    "stablehlo.sign",
    "stablehlo.maximum",
    "stablehlo.minimum",
    "stablehlo.sqrt",
    "stablehlo.rsqrt",
    "stablehlo.exponential",
    "stablehlo.exponential_minus_one",
    "stablehlo.log",
    "stablehlo.log_plus_one",
    "stablehlo.power",
    "stablehlo.sine",
    "stablehlo.cosine",
    "stablehlo.tanh",
    "stablehlo.floor",
    "stablehlo.ceil",
    "stablehlo.round_nearest_even",
    "stablehlo.round_nearest_afz",
    "stablehlo.is_finite",
    "stablehlo.and",
    "stablehlo.or",
    "stablehlo.xor",
    "stablehlo.not",
    "stablehlo.shift_left",
    "stablehlo.shift_right_logical",
    "stablehlo.shift_right_arithmetic",
    "stablehlo.optimization_barrier",
}

#: forbidden whatever the allow-list says, each for a gap above
FORBIDDEN_OPS = {
    "stablehlo.custom_call": "host callbacks and custom kernels do not run on jax-metal",
    "stablehlo.while": "jax-ml/jax#21552",
    "stablehlo.case": "jax-ml/jax#21601",
    "stablehlo.if": "jax-ml/jax#21601",
    "stablehlo.reduce_window": "jax-ml/jax#16366",
    "stablehlo.pad": "jax-ml/jax#16366",
}

_TENSOR = re.compile(r"tensor<([^<>]*(?:<[^<>]*>)?)>")
_F64 = re.compile(r"(?:^|[^A-Za-z_])(?:[0-9?]+x)*f64\b")
_OP = re.compile(r'^\s*(?:%[^=]*=\s*)?"?([a-z_]+(?:\.[a-z_]+)?)\b')
_REGION_LABELS = {"cond", "do", "reducer"}  # regions of while and reduce, printed as labels


def element_types(text: str) -> set[str]:
    """Every element type of every tensor in a lowered module."""
    types = set()
    for body in _TENSOR.findall(text):
        body = body.split(",")[0].strip()
        types.add(body.rsplit("x", 1)[-1] if re.match(r"^[0-9?]+x", body) else body)
    return types


def operations(text: str) -> set[str]:
    ops = set()
    for line in text.splitlines():
        match = _OP.match(line)
        skip = line.lstrip().startswith(("^", "}", "#", "loc"))
        if match and not skip and match.group(1) not in _REGION_LABELS:
            ops.add(match.group(1))
    return ops


def problems(text: str, *, bf16: bool = False, allow: frozenset = frozenset()) -> list[str]:
    """What in a lowered module would not run on jax-metal (empty: clean)."""
    found = []
    if _F64.search(text):
        found.append("f64 in the program")
    allowed_types = ALLOWED_TYPES | ({"bf16"} if bf16 else set())
    for t in sorted(element_types(text) - allowed_types - allow):
        found.append(f"element type {t}")
    for op in sorted(operations(text) - allow):
        if op in FORBIDDEN_OPS:
            found.append(f"{op} ({FORBIDDEN_OPS[op]})")
        elif op not in ALLOWED_OPS:
            found.append(f"{op} (not on the allow-list)")
    return found


@dataclasses.dataclass
class Program:
    label: str
    text: str
    donation_refused: bool  # jax warned that the donated buffers could not be used
    donates: bool  # the function asked for donation


def lower(fn: Any, args: tuple, kwargs: dict, label: str) -> Program:
    """``fn`` (a jitted function) lowered for :data:`TARGET` with these arguments."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = fn.trace(*args, **kwargs).lower(lowering_platforms=(TARGET,))
    text = lowered.as_text()
    refused = any("donated buffers were not usable" in str(w.message) for w in caught)
    donates = refused or "tf.aliasing_output" in text or "jax.buffer_donor" in text
    return Program(label, text, refused, donates)


def _describe(x: Any) -> Any:
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return (tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)))
    return repr(x)


def _name(fn: Any) -> str:
    inner = getattr(fn, "__wrapped__", fn)
    return getattr(inner, "__qualname__", getattr(inner, "__name__", repr(inner)))


class _Recording:
    """A jitted function that lowers each new top-level call before it runs it."""

    def __init__(self, recorder: Recorder, fn: Any, label: str) -> None:
        self._recorder, self._fn, self._label = recorder, fn, label

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._recorder.see(self._fn, self._label, args, kwargs)
        return self._fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


class Recorder:
    """Collects the programs lucid runs while :meth:`watch` is active."""

    def __init__(self) -> None:
        self.programs: dict[Any, Program] = {}
        self.active = False

    def see(self, fn: Any, label: str, args: tuple, kwargs: dict) -> None:
        if not self.active:
            return
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return  # part of a program being traced: lowered with it
        key = (id(fn), str(jax.tree_util.tree_map(_describe, (args, kwargs))))
        if key not in self.programs:
            self.programs[key] = lower(fn, args, kwargs, label)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Recorder]:
        """Route lucid's jitted functions, ``jax.jit`` and op-by-op dispatch through
        this recorder (outside :meth:`watch`, calls only pass through)."""
        patches: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, value: Any) -> None:
            patches.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

        for module_name, module in list(sys.modules.items()):
            if not module_name.startswith("lucid") or module is None:
                continue
            for name, value in list(vars(module).items()):
                if callable(value) and hasattr(value, "trace") and hasattr(value, "lower"):
                    patch(module, name, _Recording(self, value, f"{module_name}.{name}"))
        real_jit = jax.jit

        def jit(fun: Callable, *args: Any, **kwargs: Any) -> Any:
            return _Recording(self, real_jit(fun, *args, **kwargs), f"jit({_name(fun)})")

        patch(jax, "jit", jit)
        real_primitive = dispatch.xla_primitive_callable

        def primitive_callable(prim: Any, **params: Any) -> Any:
            return _Recording(self, real_primitive(prim, **params), f"op-by-op {prim.name}")

        patch(dispatch, "xla_primitive_callable", primitive_callable)
        from lucid.optim._engine import eager, programs

        caches = (
            eager.group_program,
            programs.step_program,
            programs.fused_program,
            programs.transformed_step_program,
        )
        for cache in caches:  # their jits were made before the patch
            cache.cache_clear()
        try:
            yield self
        finally:
            for owner, name, value in reversed(patches):
                setattr(owner, name, value)
            for cache in caches:
                cache.cache_clear()

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False


@contextlib.contextmanager
def x64(enabled: bool) -> Iterator[None]:
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)
