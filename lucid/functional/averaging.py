"""Weight averaging (torch.optim.swa_utils' math) as pure functions over pytrees.

Stochastic weight averaging keeps the running mean of the weights seen so far,
an exponential moving average keeps a decayed one:

$$
\\begin{aligned}
\\text{SWA:}\\quad \\bar w_{n+1} &= \\bar w_n + (w - \\bar w_n) / (n + 1) \\\\
\\text{EMA:}\\quad \\bar w_{n+1} &= \\mathrm{lerp}(\\bar w_n, w, 1 - \\text{decay})
\\end{aligned}
$$

with $\\bar w_1 = w$ (the first update copies): torch's `AveragedModel`
default off CUDA (`get_swa_avg_fn`) and `get_ema_multi_avg_fn` (torch's
`lerp`). An averager is an `(init, update)` pair: `state = init(params)`,
`state = update(params, state)`, and `state.averaged` holds the average;
both are jit-able. The stateful forms are in [lucid.optim.swa_utils][].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._math import lerp

__all__ = [
    "Averager",
    "AveragerState",
    "ema",
    "swa",
]


class AveragerState(NamedTuple):
    """The state of an [Averager][lucid.functional.averaging.Averager].

    Attributes:
      averaged: the average so far, a pytree shaped like the params (zeros
        before the first update).
      n_averaged: how many parameter sets the average holds, a 0-d int32
        array (0 before the first update).

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> state = LF.averaging.swa().init({"w": jnp.ones(2)})
      >>> state.averaged["w"].tolist(), int(state.n_averaged)
      ([0.0, 0.0], 0)
    """

    averaged: Any
    n_averaged: jax.Array


class Averager(NamedTuple):
    """A weight averager: a pair of pure, jit-able functions.

    Made by [swa][lucid.functional.averaging.swa] and
    [ema][lucid.functional.averaging.ema].

    Attributes:
      init: `init(params) -> state`, an
        [AveragerState][lucid.functional.averaging.AveragerState] holding no
        parameter set yet.
      update: `update(params, state) -> state`, with `params` folded into the
        average (the first update copies them). `params` must have the
        average's structure and shapes (else `ValueError`); the average keeps
        its dtypes.

    Examples:
      >>> import jax, jax.numpy as jnp, lucid.functional as LF
      >>> avg = LF.averaging.ema(0.9)
      >>> update = jax.jit(avg.update)
      >>> state = update(jnp.array([1.0]), avg.init(jnp.zeros(1)))
      >>> state.averaged.tolist()
      [1.0]
    """

    init: Callable[[Any], AveragerState]
    update: Callable[[Any, AveragerState], AveragerState]


def swa_weight(n_averaged: Any) -> Any:
    """The weight SWA gives the new parameters after `n_averaged` sets: `1/(n+1)`."""
    return 1 / (n_averaged + 1)


def swa_fold(averaged: jax.Array, current: jax.Array, n_averaged: Any) -> jax.Array:
    """One SWA update: `avg + (current - avg) / (n + 1)` (torch's `get_swa_avg_fn`)."""
    return averaged + (current - averaged) / (jnp.asarray(n_averaged, averaged.dtype) + 1)


def swa_lerp_fold(averaged: jax.Array, current: jax.Array, n_averaged: Any) -> jax.Array:
    """One SWA update as torch's `get_swa_multi_avg_fn`: `lerp(avg, current, 1/(n+1))`."""
    return lerp(averaged, current, swa_weight(jnp.asarray(n_averaged, averaged.dtype)))


def ema_fold(decay: float) -> Callable[[jax.Array, jax.Array, Any], jax.Array]:
    """One EMA update, `lerp(ema, current, 1 - decay)` (torch's `get_ema_multi_avg_fn`)."""

    def fold(averaged: jax.Array, current: jax.Array, n_averaged: Any = None) -> jax.Array:
        return lerp(averaged, current, jnp.asarray(1.0 - decay, averaged.dtype))

    return fold


def check_decay(decay: float) -> None:
    """torch's check of an EMA decay.

    Raises:
      ValueError: `decay` is outside `[0, 1]`.
    """
    if decay < 0.0 or decay > 1.0:
        raise ValueError(
            f"Invalid decay value {decay} provided. Please provide a value in [0,1] range."
        )


def _averager(fold: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]) -> Averager:
    def init(params: Any) -> AveragerState:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return AveragerState(zeros, jnp.zeros((), jnp.int32))

    def update(params: Any, state: AveragerState) -> AveragerState:
        n = state.n_averaged
        treedef = jax.tree_util.tree_structure(state.averaged)
        if jax.tree_util.tree_structure(params) != treedef:
            raise ValueError(
                f"averaging: the params' structure {jax.tree_util.tree_structure(params)} "
                f"differs from the average's {treedef}"
            )
        with_path = jax.tree_util.tree_flatten_with_path(state.averaged)[0]
        for (path, avg), cur in zip(with_path, jax.tree_util.tree_leaves(params)):
            if jnp.shape(cur) != jnp.shape(avg):
                raise ValueError(
                    f"averaging: params{jax.tree_util.keystr(path)} has shape "
                    f"{tuple(jnp.shape(cur))}, the average keeps {tuple(jnp.shape(avg))}"
                )

        def one(avg: jax.Array, cur: jax.Array) -> jax.Array:
            cur = jnp.asarray(cur).astype(avg.dtype)  # the average keeps its dtype, as torch's
            return jnp.where(n == 0, cur, fold(avg, cur, n).astype(avg.dtype))

        averaged = jax.tree_util.tree_map(one, state.averaged, params)
        return AveragerState(averaged, n + 1)

    return Averager(init, update)


def swa() -> Averager:
    """Stochastic weight averaging: the equally weighted mean of every update's params.

    $\\bar w_1 = w$, then $\\bar w_{n+1} = \\bar w_n + (w - \\bar w_n) / (n + 1)$:
    torch's `AveragedModel` with its default average (`get_swa_avg_fn`), as
    pure functions over any pytree.

    Returns:
      An [Averager][lucid.functional.averaging.Averager].

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> avg = LF.averaging.swa()
      >>> state = avg.init(jnp.zeros(2))
      >>> for w in (jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])):
      ...     state = avg.update(w, state)
      >>> state.averaged.tolist(), int(state.n_averaged)
      ([2.0, 3.0], 2)
    """
    return _averager(swa_fold)


def ema(decay: float = 0.999) -> Averager:
    """Exponential moving average of the params (torch's `get_ema_multi_avg_fn`).

    $\\bar w_1 = w$, then
    $\\bar w_{n+1} = \\mathrm{lerp}(\\bar w_n, w, 1 - \\text{decay})
    = \\text{decay} \\cdot \\bar w_n + (1 - \\text{decay}) \\, w$, computed as
    torch's `lerp`.

    Args:
      decay: the weight the average keeps at each update, in $[0, 1]$.

    Returns:
      An [Averager][lucid.functional.averaging.Averager].

    Raises:
      ValueError: `decay` outside $[0, 1]$.

    Examples:
      >>> import jax.numpy as jnp, lucid.functional as LF
      >>> avg = LF.averaging.ema(0.5)
      >>> state = avg.init(jnp.zeros(1))
      >>> for w in (jnp.array([1.0]), jnp.array([3.0])):
      ...     state = avg.update(w, state)
      >>> state.averaged.tolist()
      [2.0]
    """
    check_decay(decay)
    return _averager(ema_fold(decay))
