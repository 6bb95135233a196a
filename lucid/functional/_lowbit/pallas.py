"""What the fused low-bit GPU kernels share: which Pallas backend compiles them, the
compiler parameters, and the correctly rounded float32 arithmetic inside them.

The kernels (bitsandbytes' 8-bit step, `lucid.functional.bnb._pallas`; torchao's
8-bit, 4-bit and fp8 steps, `lucid.functional.torchao._pallas`) look codes up in tables
(a gather per element), which Pallas lowers through its Triton backend. Mosaic GPU, the
backend jax keeps, lowers no gather (jax 0.11), so the kernels run where the installed
jax still has the Triton backend and its use is not deprecated
(`lucid._platform.triton_backend`), and
elsewhere the step runs as XLA's graph of the same operations.

Triton may lower a float32 division or square root to an approximate instruction, and
its ``max`` of floats drops a NaN; XLA rounds both correctly and keeps the NaN. So the
float32 arithmetic of a kernel is traced once and evaluated again with those primitives
replaced (`exact`): ``div`` and ``sqrt`` by the correctly rounded PTX instructions
(``div.rn.f32``, ``sqrt.rn.f32``), ``max``/``min`` by NaN-propagating selects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array

try:  # jax >= 0.5 keeps the jaxpr types in jax.extend.core
    from jax.extend.core import Literal as _LITERAL
except ImportError:  # pragma: no cover - jax 0.4
    from jax.core import Literal as _LITERAL


def compiler_params(warps: int) -> dict[str, Any]:
    """``pallas_call``'s keyword for Triton's compiler parameters (jax 0.4 names the
    class ``TritonCompilerParams``)."""
    from jax.experimental.pallas import triton as plt

    make = getattr(plt, "CompilerParams", None) or plt.TritonCompilerParams
    return {"compiler_params": make(num_warps=warps, num_stages=1)}


def _exact_ops_gpu() -> dict[Any, Callable[..., Array]]:
    """float32 primitives and their correctly rounded (NaN-keeping) GPU replacements."""
    from jax.experimental.pallas import triton as plt

    def asm(instruction: str, arity: int) -> Callable[..., Array]:
        operands = ", ".join(f"${i}" for i in range(arity + 1))

        def op(*xs: Array) -> Array:
            if all(jnp.ndim(x) == 0 for x in xs):
                # Triton's inline assembly takes tensors: a scalar goes through a pair
                return jnp.max(op(*(jnp.full((2,), x, jnp.float32) for x in xs)))
            xs = jnp.broadcast_arrays(*xs)
            return plt.elementwise_inline_asm(
                f"{instruction} {operands};",
                args=list(xs),
                constraints="=r," + ",".join(["r"] * arity),
                pack=1,
                result_shape_dtypes=[jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype)],
            )[0]

        return op

    return {
        lax.div_p: asm("div.rn.f32", 2),
        lax.sqrt_p: asm("sqrt.rn.f32", 1),
        lax.max_p: _keeping_nan(lax.max),
        lax.min_p: _keeping_nan(lax.min),
    }


def _keeping_nan(op: Callable[[Array, Array], Array]) -> Callable[[Array, Array], Array]:
    """``op`` (max or min) giving NaN when either operand is NaN, as XLA's does."""

    def keeping(a: Array, b: Array) -> Array:
        a, b = jnp.broadcast_arrays(a, b)
        return jnp.where(a != a, a, jnp.where(b != b, b, op(a, b)))

    return keeping


def eval_with(jaxpr: Any, consts: list, args: list, ops: Mapping[Any, Callable]) -> list:
    """Evaluate ``jaxpr`` with the float32 primitives in ``ops`` replaced (a jaxpr
    interpreter, as jax's documentation writes one; nested ``jit`` calls are entered,
    and an optimization barrier, which a kernel has no use for, passes its operands)."""
    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if isinstance(var, _LITERAL) else env[var]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if eqn.primitive in ops and all(jnp.result_type(v) == jnp.float32 for v in values):
            outs = [ops[eqn.primitive](*values)]
        elif eqn.primitive is lax.optimization_barrier_p and lax.div_p in ops:
            outs = values
        elif inner is not None and hasattr(inner, "jaxpr"):
            outs = eval_with(inner.jaxpr, list(inner.consts), values, ops)
        elif any(isinstance(v, jax.core.Tracer) for v in values):
            outs = eqn.primitive.bind(*values, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        else:  # constants only (a literal's negation): folded here, as tracing folds them
            with jax.ensure_compile_time_eval():
                outs = eqn.primitive.bind(*values, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def exact(fn: Callable[..., Any], gpu: bool) -> Callable[..., Any]:
    """``fn`` (arrays in, a pytree of arrays out) with its float32 division, square root,
    max and min correctly rounded on the GPU (`_exact_ops_gpu`); ``fn`` itself when not
    ``gpu`` (Pallas' interpreter runs XLA's own)."""
    if not gpu:
        return fn

    def exact_fn(*args: Any) -> Any:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat = jax.tree_util.tree_leaves(args)
        outs = eval_with(closed.jaxpr, list(closed.consts), flat, _exact_ops_gpu())
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outs)

    return exact_fn


def scalar_vector(h: Mapping[str, Array]) -> tuple[list[str], Array]:
    """The float32 scalars ``h`` as one vector of a power-of-two length (Triton's blocks
    are powers of two) and their names, in its order."""
    names = sorted(h)
    width = max(2, 1 << (len(names) - 1).bit_length())
    values = jnp.stack([jnp.asarray(h[k], jnp.float32) for k in names])
    return names, jnp.zeros((width,), jnp.float32).at[: len(names)].set(values)


__all__ = ["compiler_params", "eval_with", "exact", "scalar_vector"]
