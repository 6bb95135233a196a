"""One matrix optimizer (SOAP, Shampoo) in each of its forms, stepped on given gradients,
and the reference's step on the same gradients: what `tests/test_soap.py` and
`tests/test_shampoo.py` compare."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

import lucid


def reference_step(params: list, opt: Any, grads: list) -> list[np.ndarray]:
    """One step of the reference optimizer ``opt`` on ``grads``; its parameters after it."""
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g)
    opt.step()
    return [p.detach().numpy().copy() for p in params]


class LucidForms:
    """lucid's optimizer in one form (``transform``, ``eager``, ``compiled``, ``fused``),
    stepped on given gradients.

    Args:
      transform: the `lucid.functional` factory (``lucid.functional.soap``).
      cls: the `lucid.optim` class (``lucid.optim.SOAP``).
      form: the form.
      init: the parameters' initial values.
      options: the optimizer's keywords.
      groups: builds param groups from the Parameters (``None``: one group).
    """

    def __init__(
        self,
        transform: Callable[..., optax.GradientTransformation],
        cls: type,
        form: str,
        init: list,
        options: dict,
        groups: Callable[[list], Any] | None = None,
    ) -> None:
        self.form = form
        # copies: jax 0.4 may alias a NumPy array's memory (a torch tensor's, here)
        self.params = [lucid.Parameter(jnp.array(x, copy=True)) for x in init]
        if form == "transform":
            self.tx = transform(**options)
            self.update = jax.jit(self.tx.update)
            self.values = [jnp.array(x, copy=True) for x in init]
            self.state = self.tx.init(self.values)
            return
        self.opt = cls(self.params if groups is None else groups(self.params), **options)
        if form == "compiled":
            lucid.compile_optimizer(self.opt)
        elif form == "fused":

            def loss(params, grads):
                return sum(jnp.sum(p * g) for p, g in zip(params, grads))

            self.fused = lucid.optim.fused_step(loss, self.opt)

    def step(self, grads: list) -> list[np.ndarray]:
        """One step on ``grads``; the parameters after it."""
        grads = [jnp.asarray(g) for g in grads]
        if self.form == "transform":
            updates, self.state = self.update(grads, self.state, self.values)
            self.values = optax.apply_updates(self.values, updates)
            return [np.asarray(v) for v in self.values]
        if self.form == "fused":
            self.fused(self.params, grads)
        else:
            for p, g in zip(self.params, grads):
                p.grad = g
            self.opt.step()
        return [np.asarray(p.data) for p in self.params]
