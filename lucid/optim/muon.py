"""``Muon``: torch.optim.Muon over :data:`lucid.functional.muon.MUON`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..functional.muon import MUON
from .optimizer import Optimizer, ParamsT, options_of


class Muon(Optimizer):
    """torch.optim.Muon: momentum orthogonalized by a bfloat16 Newton-Schulz iteration.

    For 2-D parameters only, as torch: the constructor raises torch's
    ``ValueError`` for any other parameter, and a step raises it for a
    non-2-D gradient (a parameter added later with ``add_param_group``) before
    anything changes. The state holds torch's ``momentum_buffer``.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones((4, 2)))
      >>> opt = lucid.optim.Muon([w], lr=0.02)
      >>> w.grad = jnp.eye(4, 2)
      >>> opt.step()
      >>> list(opt.state[w])
      ['momentum_buffer']
    """

    rule = MUON

    def __init__(
        self,
        params: ParamsT,
        lr: Any = 1e-3,
        weight_decay: Any = 0.1,
        momentum: Any = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[Any, Any, Any] = (3.4445, -4.775, 2.0315),
        eps: Any = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ) -> None:
        super().__init__(params, options_of(locals()))
        for p in self._params():
            if len(p.shape) != 2:
                raise ValueError(
                    "Muon only supports 2D parameters whereas we found a parameter with size: "
                    f"{tuple(p.shape)}"
                )

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter with a gradient; returns ``closure()``'s loss.

        Raises:
          ValueError: a parameter with a gradient is not 2-D (torch's error).
        """
        loss = closure() if closure is not None else None
        for p in self._params():
            if p.grad is not None and len(p.shape) != 2:
                raise ValueError("Param gradient must be a 2D matrix")
        super().step()
        return loss
