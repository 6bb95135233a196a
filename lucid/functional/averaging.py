"""Weight averaging (torch.optim.swa_utils' math) as pure functions over pytrees.

Stochastic weight averaging keeps the running mean of the weights seen so far,
an exponential moving average keeps a decayed one:

$$
\\begin{aligned}
\\text{SWA:}\\quad \\bar w_{n+1} &= \\bar w_n + (w - \\bar w_n) / (n + 1) \\\\
\\text{EMA:}\\quad \\bar w_{n+1} &= \\mathrm{lerp}(\\bar w_n, w, 1 - \\text{decay})
\\end{aligned}
$$

with :math:`\\bar w_1 = w` (the first update copies): torch's ``AveragedModel``
default off CUDA (``get_swa_avg_fn``) and ``get_ema_multi_avg_fn`` (torch's
``lerp``). An averager is an ``(init, update)`` pair: ``state = init(params)``,
``state = update(params, state)``, and ``state.averaged`` holds the average;
both are jit-able.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ._math import lerp


class AveragerState(NamedTuple):
    """``averaged``: the average so far (a pytree like the params); ``n_averaged``:
    how many parameter sets it holds (int32; 0 before the first update)."""

    averaged: Any
    n_averaged: jax.Array


class Averager(NamedTuple):
    """``init(params) -> state`` and ``update(params, state) -> state``."""

    init: Callable[[Any], AveragerState]
    update: Callable[[Any, AveragerState], AveragerState]


def swa_weight(n_averaged: Any) -> Any:
    """The weight SWA gives the new parameters after ``n_averaged`` sets: ``1/(n+1)``."""
    return 1 / (n_averaged + 1)


def swa_fold(averaged: jax.Array, current: jax.Array, n_averaged: Any) -> jax.Array:
    """One SWA update: ``avg + (current - avg) / (n + 1)`` (torch's ``get_swa_avg_fn``)."""
    return averaged + (current - averaged) / (jnp.asarray(n_averaged, averaged.dtype) + 1)


def swa_lerp_fold(averaged: jax.Array, current: jax.Array, n_averaged: Any) -> jax.Array:
    """One SWA update as torch's ``get_swa_multi_avg_fn``: ``lerp(avg, current, 1/(n+1))``."""
    return lerp(averaged, current, swa_weight(jnp.asarray(n_averaged, averaged.dtype)))


def ema_fold(decay: float) -> Callable[[jax.Array, jax.Array, Any], jax.Array]:
    """One EMA update, ``lerp(ema, current, 1 - decay)`` (torch's ``get_ema_multi_avg_fn``)."""

    def fold(averaged: jax.Array, current: jax.Array, n_averaged: Any = None) -> jax.Array:
        return lerp(averaged, current, jnp.asarray(1.0 - decay, averaged.dtype))

    return fold


def check_decay(decay: float) -> None:
    """torch's check of an EMA decay.

    Raises:
      ValueError: ``decay`` is outside ``[0, 1]``.
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

        def one(avg: jax.Array, cur: jax.Array) -> jax.Array:
            cur = cur.astype(avg.dtype)
            return jnp.where(n == 0, cur, fold(avg, cur, n))

        averaged = jax.tree_util.tree_map(one, state.averaged, params)
        return AveragerState(averaged, n + 1)

    return Averager(init, update)


def swa() -> Averager:
    """Stochastic weight averaging: the equally weighted mean of every update's params.

    Returns:
      An :class:`Averager` (torch: ``AveragedModel`` with its default average).

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
    """Exponential moving average with ``decay`` (torch's ``get_ema_multi_avg_fn``).

    Args:
      decay: the weight kept by the average at each update, in ``[0, 1]``.

    Returns:
      An :class:`Averager`.

    Raises:
      ValueError: ``decay`` outside ``[0, 1]``.

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
