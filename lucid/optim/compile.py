"""``compile_optimizer`` and ``fused_step``: the whole step as one XLA executable.

``compile_optimizer(opt)`` hands ``opt``'s steps and state to the compiled
backend (:mod:`lucid.optim._compiled`) and returns a
:class:`CompiledOptimizer`, a thin handle with torch's optimizer API. The
optimizer keeps its ``param_groups``, API and numbers: compiling changes speed,
never results. LBFGS is the one exception the contract names: its compiled
step is a different algorithm (the closure-less Barzilai-Borwein step of
:func:`lucid.functional.lbfgs`), so it runs on a separate optimizer with its
own state, sharing the L-BFGS's ``param_groups``, and the L-BFGS stays eager.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax

from .._parameter import Parameter
from ..functional.lbfgs import LBFGS as LBFGS_RULE
from ._compiled import CompiledBackend
from .optimizer import Optimizer


class CompiledOptimizer:
    """An optimizer whose step runs as one compiled, in-place XLA executable.

    Returned by :func:`compile_optimizer`. It has torch's optimizer API and
    forwards it to :attr:`optimizer`, whose steps and state the compiled
    backend now runs and holds: ``opt.step()`` and ``compiled.step()`` are the
    same step, ``state_dict()`` is in the eager (torch) format and moves both
    ways. Hyper-parameters are read from ``param_groups`` at every step and fed
    as runtime values, so schedulers and hand edits never recompile; a change
    of structure (a new group, shape, dtype, flag or state field) builds a new
    executable once.

    Attributes:
      optimizer: the optimizer that runs compiled (for LBFGS, the separate
        Barzilai-Borwein optimizer that shares the L-BFGS's ``param_groups``).
      shard_state_over: the mesh axis (or axes) the state of replicated
        parameters is sharded over (ZeRO-1), or None.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones(3))
      >>> opt = lucid.optim.SGD([w], lr=0.1, momentum=0.9)
      >>> compiled = lucid.compile_optimizer(opt)
      >>> w.grad = jnp.ones(3)
      >>> opt.step()  # runs the compiled step
      >>> w.data.tolist()
      [0.8999999761581421, 0.8999999761581421, 0.8999999761581421]
    """

    def __init__(
        self, optimizer: Optimizer, shard_state_over: str | tuple[str, ...] | None = None
    ) -> None:
        self.optimizer = optimizer
        self.shard_state_over = shard_state_over
        optimizer.use_backend(functools.partial(CompiledBackend, shard_state_over=shard_state_over))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's ``param_groups`` (the same list)."""
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The optimizer's constructor options."""
        return self.optimizer.defaults

    @property
    def state(self) -> dict[Parameter, dict[str, Any]]:
        """Per-parameter state with torch's names (a snapshot of the buffers)."""
        return self.optimizer.state

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One compiled update of every parameter with a gradient; returns ``closure()``'s loss."""
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient (to ``None`` by default, as torch)."""
        self.optimizer.zero_grad(set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (a change of structure: the next step builds a new executable)."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """torch's format, cut from the buffers (a snapshot)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load lucid's or torch's state_dict; validates everything before changing anything."""
        self.optimizer.load_state_dict(state_dict)

    def state_bytes_per_device(self) -> dict[Any, int]:
        """Bytes of optimizer state each device holds (this process's devices): with
        sharded state, about the total over the number of shards."""
        backend = self.optimizer.backend
        assert isinstance(backend, CompiledBackend)
        held: dict[Any, int] = {}
        for array in backend.state_arrays():
            for shard in array.addressable_shards:
                held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
        return held

    def fused_step(self, loss_fn: Callable[..., Any]) -> FusedStep:
        """A fused training step for ``loss_fn`` on this optimizer (see :class:`FusedStep`)."""
        return FusedStep(loss_fn, self)

    def __repr__(self) -> str:
        return f"CompiledOptimizer({self.optimizer!r})"


class BarzilaiBorwein(Optimizer):
    """The compiled form of LBFGS: :func:`lucid.functional.lbfgs`'s closure-less step,
    with its own state (``step``, ``prev_param``, ``prev_grad``), over the L-BFGS's
    own ``param_groups`` (so schedulers and edits of ``lr`` reach it)."""

    rule = LBFGS_RULE

    def __init__(self, lbfgs: Optimizer) -> None:
        super().__init__(lbfgs.param_groups[0]["params"], dict(lbfgs.defaults))
        self.param_groups = lbfgs.param_groups

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One BB step; ``closure`` (if given) is evaluated once, for the loss it returns."""
        return super().step(closure)


def _supported() -> tuple[type, ...]:
    from . import (
        ASGD,
        LBFGS,
        SGD,
        Adadelta,
        Adafactor,
        Adagrad,
        Adam,
        Adamax,
        AdamW,
        Muon,
        NAdam,
        RAdam,
        RMSprop,
        Rprop,
        SparseAdam,
    )

    return (
        SGD,
        Adam,
        AdamW,
        RMSprop,
        Adagrad,
        Adadelta,
        Adamax,
        RAdam,
        NAdam,
        ASGD,
        Rprop,
        SparseAdam,
        LBFGS,
        Adafactor,
        Muon,
    )


_COMPILED: weakref.WeakKeyDictionary[Optimizer, CompiledOptimizer] = weakref.WeakKeyDictionary()


def compile_optimizer(
    optimizer: Optimizer, *, shard_state_over: str | tuple[str, ...] | None = None
) -> CompiledOptimizer:
    """Run ``optimizer``'s whole step as one compiled, in-place XLA executable.

    From now on the compiled backend runs ``optimizer.step()`` and holds its
    state (adopting what eager steps built); the optimizer's API and numbers
    are unchanged, and compiling the same optimizer again returns the same
    :class:`CompiledOptimizer`. For LBFGS the compiled step is the closure-less
    Barzilai-Borwein step on its own state, and the L-BFGS itself stays eager.

    Parameters sharded over a mesh keep their sharding and their state follows
    it (FSDP style). With ``shard_state_over``, the state of parameters
    replicated over a mesh is sharded over that mesh axis (ZeRO-1): each device
    keeps and updates its piece, and the parameters stay replicated.

    Args:
      optimizer: one of lucid.optim's own classes (not a subclass).
      shard_state_over: a mesh axis name (or a tuple of names) of the mesh the
        parameters are replicated over; None keeps state laid out as the
        parameters are.

    Returns:
      The :class:`CompiledOptimizer`.

    Raises:
      TypeError: any other class (the message lists the supported ones).
      ValueError: the optimizer has no parameters; it was compiled already with
        another ``shard_state_over``; the parameters' mesh has no such axis.
    """
    supported = _supported()
    if type(optimizer) not in supported:
        names = ", ".join(sorted(cls.__name__ for cls in supported))
        raise TypeError(
            f"compile_optimizer supports lucid.optim's own classes ({names}); "
            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
        )
    if optimizer in _COMPILED:
        compiled = _COMPILED[optimizer]
        if shard_state_over != compiled.shard_state_over:
            raise ValueError(
                f"this optimizer was compiled with shard_state_over="
                f"{compiled.shard_state_over!r}; it cannot be compiled again with "
                f"{shard_state_over!r}"
            )
        return compiled
    if not optimizer._params():
        raise ValueError("compile_optimizer: the optimizer has no parameters")
    runner = BarzilaiBorwein(optimizer) if optimizer.rule is LBFGS_RULE else optimizer
    compiled = CompiledOptimizer(runner, shard_state_over)
    _COMPILED[optimizer] = compiled
    return compiled


class FusedStep:
    """``loss = fused(model, *args, **kwargs)``: forward, backward and update, one executable.

    The call convention is :func:`lucid.backward`'s. Every parameter of the
    optimizer is updated with its gradient of this loss (a parameter the loss
    does not use gets a zero gradient, where an eager step would skip it), the
    Parameters' ``.data`` are current after the call, and ``.grad`` is left
    untouched. Parameters in the model that the optimizer does not hold are
    treated as constants. ``grad_transform``, any optax ``GradientTransformation``
    (e.g. :func:`lucid.functional.clip_grad_norm`, torch's clipping), is applied
    inside the same executable to the list of gradients in the optimizer's
    parameter order before the update; its state is kept here
    (``transform_state``).
    """

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        optimizer: Optimizer | CompiledOptimizer,
        grad_transform: Any = None,
        shard_state_over: str | tuple[str, ...] | None = None,
    ) -> None:
        self.loss_fn = loss_fn
        if isinstance(optimizer, CompiledOptimizer):
            self.compiled = optimizer
        elif shard_state_over is None and optimizer in _COMPILED:
            self.compiled = _COMPILED[optimizer]  # compiled already, however it was
        else:
            self.compiled = compile_optimizer(optimizer, shard_state_over=shard_state_over)
        self.grad_transform = grad_transform
        self.transform_state: Any = None
        if grad_transform is not None:
            params = self._backend().parameters()
            self.transform_state = grad_transform.init([p.data for p in params])

    def _backend(self) -> CompiledBackend:
        backend = self.compiled.optimizer.backend
        assert isinstance(backend, CompiledBackend)
        return backend

    def __call__(self, tree: Any, *args: Any, **kwargs: Any) -> jax.Array:
        optimizer = self.compiled.optimizer
        for group in optimizer.param_groups:
            optimizer.rule.check_step(group)
        loss, self.transform_state = self._backend().fused(
            self.loss_fn, tree, args, kwargs, self.grad_transform, self.transform_state
        )
        optimizer._opt_called = True  # a step, for the schedulers' order check
        return loss


def fused_step(
    loss_fn: Callable[..., Any],
    optimizer: Optimizer,
    grad_transform: Any = None,
    *,
    shard_state_over: str | tuple[str, ...] | None = None,
) -> FusedStep:
    """Compile ``optimizer`` (as :func:`compile_optimizer`, with ``shard_state_over``;
    an optimizer compiled already keeps its compiled form) and return a fused
    training step for ``loss_fn``, with an optional optax ``grad_transform`` applied
    to the gradients before the update; see :class:`FusedStep`."""
    return FusedStep(loss_fn, optimizer, grad_transform, shard_state_over)
