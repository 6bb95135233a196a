"""``Adafactor``: the rule of ``lucid.functional.adafactor`` behind torch's stateful API."""

from __future__ import annotations

from ..functional.adafactor import ADAFACTOR, ADAFACTOR_SIGNATURE
from ._declare import torch_optimizer
from .optimizer import Optimizer

__all__ = [
    "Adafactor",
]


@torch_optimizer(ADAFACTOR_SIGNATURE, saved=("lr", "beta2_decay", "eps", "d", "weight_decay"))
class Adafactor(Optimizer):
    """torch.optim.Adafactor: factored second moment, relative step size, update clipping.

    Parameters of two or more dimensions keep ``row_var`` and ``col_var`` (torch's
    keepdim shapes), vectors keep ``variance``; every state holds a float32 ``step``.
    ``foreach`` is accepted and ignored.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones((2, 3)))
      >>> opt = lucid.optim.Adafactor([w], lr=1e-2)
      >>> w.grad = jnp.full((2, 3), 0.5)
      >>> opt.step()
      >>> state = opt.state.get(w)
      >>> sorted(state), state["row_var"].shape
      (['col_var', 'row_var', 'step'], (2, 1))
    """

    rule = ADAFACTOR
