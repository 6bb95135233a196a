"""``Adafactor``: torch.optim.Adafactor over :data:`lucid.functional.adafactor.ADAFACTOR`."""

from __future__ import annotations

from typing import Any

from ..functional.adafactor import ADAFACTOR
from .optimizer import Optimizer, ParamsT, options_of


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

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-2,
        beta2_decay: Any = -0.8,
        eps: tuple[Any, Any] = (None, 1e-3),
        d: Any = 1.0,
        weight_decay: Any = 0.0,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, options_of(locals()))
