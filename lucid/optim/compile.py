"""`compile_optimizer` and `fused_step`: the whole step as one XLA executable.

`compile_optimizer(opt)` hands `opt`'s steps and state to the compiled backend
(`lucid.optim._engine.CompiledBackend`) and returns a `CompiledOptimizer`, a
thin handle with torch's whole optimizer API, every call forwarded to the
optimizer. The optimizer stays the one door: a compiled step is `opt.step()`
(its hooks, its groups as they are then), and a `FusedStep` runs its executable
through `Optimizer.run_as_step`. The optimizer keeps its `param_groups`, API
and numbers: compiling changes speed, never results. LBFGS is the one exception
the contract names: its compiled step is a different algorithm (the closure-
less Barzilai-Borwein step of `lucid.functional.lbfgs`), so it runs on a
separate optimizer with its own state, sharing the L-BFGS's `param_groups`, and
the L-BFGS stays eager."""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from .._parameter import Parameter
from ..functional.lbfgs import LBFGS as LBFGS_RULE
from ._engine import CompiledBackend
from ._registry import entry_of, registered
from .optimizer import Optimizer

__all__ = [
    "CompiledOptimizer",
    "CompiledScheduleFree",
    "FusedStep",
    "compile_optimizer",
    "fused_step",
]


def _forwarded(name: str) -> Callable:
    """`Optimizer.<name>` as a method of `CompiledOptimizer` that forwards to the optimizer
    it runs (same signature and docstring: the hooks are the optimizer's own)."""
    method = getattr(Optimizer, name)

    @functools.wraps(method)
    def forward(self: CompiledOptimizer, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.optimizer, name)(*args, **kwargs)

    forward.__qualname__ = f"CompiledOptimizer.{name}"
    forward.__module__ = __name__
    return forward


class CompiledOptimizer:
    """An optimizer whose step runs as one compiled, in-place XLA executable.

    Returned by [compile_optimizer][lucid.compile_optimizer] (build it that
    way: constructing one directly skips its checks). It has torch's optimizer
    API and forwards every call to `optimizer`, whose steps and state the
    compiled backend now runs and holds: `opt.step()` and `compiled.step()`
    are the same step, `state_dict()` is in the eager (torch) format and moves
    both ways. Hyper-parameters are read from `param_groups` at every step and
    fed as runtime values, so schedulers and hand edits never recompile; a
    change of structure (a new group, shape, dtype, flag or state field)
    builds a new executable once.

    Parameters are grouped into buckets (same group, dtype and devices) whose
    values, gradients and state live in flat buffers; the buffers are donated
    to the executable, so the update happens in place and the cost per step
    does not grow with the number of tensors.

    Args:
      optimizer: the optimizer to run compiled.
      shard_state_over: a mesh axis name (or tuple of names) to shard the state
        of replicated parameters over (ZeRO-1), or `None`.

    Attributes:
      optimizer: the optimizer that runs compiled (for LBFGS, the separate
        Barzilai-Borwein optimizer that shares the L-BFGS's `param_groups`).
      shard_state_over: the mesh axis (or axes) the state of replicated
        parameters is sharded over (ZeRO-1), or `None`.
      OptimizerPreHook: torch's type alias of a step pre-hook (as `Optimizer`'s).
      OptimizerPostHook: torch's type alias of a step post-hook (as `Optimizer`'s).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.ones(3))
      >>> opt = lucid.optim.SGD([w], lr=0.1, momentum=0.9)
      >>> compiled = lucid.compile_optimizer(opt)
      >>> w.grad = jnp.ones(3)
      >>> opt.step()  # runs the compiled step
      >>> [round(x, 4) for x in w.data.tolist()]
      [0.9, 0.9, 0.9]
      >>> compiled.step()  # the same step
      >>> [round(x, 4) for x in w.data.tolist()]
      [0.71, 0.71, 0.71]
      >>> list(compiled.state_dict()["state"][0])
      ['momentum_buffer']
    """

    optimizer: Optimizer
    shard_state_over: str | tuple[str, ...] | None
    OptimizerPreHook = Optimizer.OptimizerPreHook
    OptimizerPostHook = Optimizer.OptimizerPostHook
    profile_hook_step = Optimizer.profile_hook_step

    def __init__(
        self, optimizer: Optimizer, shard_state_over: str | tuple[str, ...] | None = None
    ) -> None:
        self.optimizer = optimizer
        self.shard_state_over = shard_state_over
        if not isinstance(optimizer.backend, CompiledBackend):
            rule = optimizer.rule
            groups = [group["params"] for group in optimizer.param_groups]
            optimizer.use_backend(
                lambda states: CompiledBackend(rule, states, groups, shard_state_over)
            )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's `param_groups` (the same list: an edit of `lr` reaches the
        next compiled step as a runtime value)."""
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The optimizer's `defaults`: its constructor options."""
        return self.optimizer.defaults

    @property
    def state(self) -> dict[Parameter, dict[str, Any]]:
        """Per-parameter state with torch's names: a snapshot cut from the buffers
        (assigning into it changes nothing; `load_state_dict` does)."""
        return self.optimizer.state

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One compiled update of every parameter that has a gradient (torch: `opt.step()`).

        Args:
          closure: an optional function that recomputes the loss (it runs first,
            once, and its result is returned; for LBFGS, see the class summary).

        Returns:
          What `closure()` returned, or `None` without a closure.

        Raises:
          ValueError: a hyper-parameter edited into `param_groups` is invalid
            (nothing has moved).
          KeyError: torch's error for an option that owns a state entry turned on
            after the state was made (nothing has moved).
        """
        # the hooks see the arguments as given: torch's `opt.step()` passes no closure
        return self.optimizer.step() if closure is None else self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient (torch: `opt.zero_grad()`).

        Args:
          set_to_none: set each `.grad` to `None` (torch's default); `False`
            fills it with zeros instead.
        """
        self.optimizer.zero_grad(set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group (a change of structure: the next step builds a new executable).

        As [Optimizer.add_param_group][lucid.optim.Optimizer.add_param_group].

        Args:
          param_group: `{"params": [...], **options}`; missing options take
            the optimizer's `defaults`.
        """
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state in torch's format, cut from the buffers (a snapshot).

        Returns:
          `{"state": {index: {name: array}}, "param_groups": [...]}`, as
          [Optimizer.state_dict][lucid.optim.Optimizer.state_dict]: loadable by
          the eager optimizer, by this one and (through
          [to_torch][lucid.optim.to_torch]) by torch's.
        """
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load lucid's or torch's state_dict into the buffers; validates everything
        before changing anything.

        Args:
          state_dict: what `state_dict()` (of this optimizer, its eager form or
            the torch optimizer of the same class) returned.

        Raises:
          ValueError: the state_dict does not fit this optimizer (nothing changed).
        """
        self.optimizer.load_state_dict(state_dict)

    @property
    def has_stepped(self) -> bool:
        """Whether the optimizer has stepped (read by the LR schedulers)."""
        return self.optimizer.has_stepped

    register_step_pre_hook = _forwarded("register_step_pre_hook")
    register_step_post_hook = _forwarded("register_step_post_hook")
    register_state_dict_pre_hook = _forwarded("register_state_dict_pre_hook")
    register_state_dict_post_hook = _forwarded("register_state_dict_post_hook")
    register_load_state_dict_pre_hook = _forwarded("register_load_state_dict_pre_hook")
    register_load_state_dict_post_hook = _forwarded("register_load_state_dict_post_hook")

    def state_bytes_per_device(self) -> dict[Any, int]:
        """Bytes of optimizer state each of this process's devices holds.

        With `shard_state_over`, about the total divided by the number of shards.

        Returns:
          `{device: bytes}` over the devices holding state (empty before the
          first step made any).

        Examples:
          >>> import jax, jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.zeros(4))
          >>> compiled = lucid.compile_optimizer(lucid.optim.Adam([w]))
          >>> w.grad = jnp.ones(4)
          >>> compiled.step()
          >>> sum(compiled.state_bytes_per_device().values()) >= 2 * 4 * 4  # exp_avg, exp_avg_sq
          True
        """
        backend = self.optimizer.backend
        assert isinstance(backend, CompiledBackend)
        held: dict[Any, int] = {}
        for array in backend.state_arrays():
            for shard in array.addressable_shards:
                held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
        return held

    def fused_step(
        self,
        loss_fn: Callable[..., Any],
        *,
        has_aux: bool = False,
        accumulate: int | None = None,
    ) -> FusedStep:
        """A fused training step for `loss_fn` on this optimizer.

        Args:
          loss_fn: `loss_fn(tree, *args, **kwargs) -> loss` (one element), as for
            [backward][lucid.backward].
          has_aux: as for [fused_step][lucid.fused_step].
          accumulate: as for [fused_step][lucid.fused_step].

        Returns:
          A [FusedStep][lucid.optim.FusedStep] (without a `grad_transform`).
        """
        return FusedStep(loss_fn, self, has_aux=has_aux, accumulate=accumulate)

    def __repr__(self) -> str:
        return f"CompiledOptimizer({self.optimizer!r})"


class CompiledScheduleFree(CompiledOptimizer):
    """A [CompiledOptimizer][lucid.optim.CompiledOptimizer] of a Schedule-Free optimizer
    in its train/eval form (`AdamWScheduleFree`, `SGDScheduleFree`, ...), with the
    package's `train()` and `eval()`.

    [compile_optimizer][lucid.compile_optimizer] returns one for those classes. Its
    `train()` and `eval()` are the optimizer's own: one mode, kept in the groups'
    `train_mode`, whichever of the optimizer and this handle switches it; switching
    compiles nothing. The closure forms have no mode (as in the package) and compile
    to a plain `CompiledOptimizer`.

    Args:
      optimizer: the Schedule-Free optimizer to run compiled.
      shard_state_over: as for [CompiledOptimizer][lucid.optim.CompiledOptimizer].

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.schedulefree.SGDScheduleFree([w], lr=0.1)
      >>> compiled = lucid.compile_optimizer(opt)
      >>> compiled.train()
      >>> for _ in range(2):
      ...     w.grad = jnp.array([0.5, -1.0])
      ...     compiled.step()
      >>> compiled.eval()  # the parameters hold x
      >>> [round(v, 4) for v in w.data.tolist()], opt.param_groups[0]["train_mode"]
      ([0.925, -1.85], False)
    """

    def train(self) -> None:
        """Switch to train mode, as the optimizer's `train()`: every group in eval mode
        moves its parameters to y and sets `train_mode`."""
        self.optimizer.train()  # type: ignore[attr-defined]

    def eval(self) -> None:
        """Switch to eval mode, as the optimizer's `eval()`: every group in train mode
        moves its parameters to x (the weights to evaluate and save) and clears
        `train_mode`."""
        self.optimizer.eval()  # type: ignore[attr-defined]


class BarzilaiBorwein(Optimizer):
    """The compiled form of LBFGS: `lucid.functional.lbfgs`'s closure-less step,
    with its own state (`step`, `prev_param`, `prev_grad`), over the L-BFGS's
    own `param_groups` (so schedulers and edits of `lr` reach it)."""

    rule = LBFGS_RULE

    def __init__(self, lbfgs: Optimizer) -> None:
        super().__init__(lbfgs.param_groups[0]["params"], dict(lbfgs.defaults))
        self.param_groups = lbfgs.param_groups

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One BB step; ``closure`` (if given) is evaluated once, for the loss it returns."""
        return super().step(closure)


def _supported() -> tuple[type, ...]:
    """lucid's own optimizer classes (the registry's), not a subclass of one, which may
    change ``step``."""
    return tuple(entry.cls for entry in registered())


# where each reference package's classes live in lucid
_NAMESPACES = {
    "torch.optim": "lucid.optim",
    "bitsandbytes": "lucid.optim.bnb",
    "torchao": "lucid.optim.torchao",
    "schedulefree": "lucid.optim.schedulefree",
    "kron-torch": "lucid.optim",
    "pytorch_optimizer": "lucid.optim",
}


def _unsupported(optimizer: Any) -> str:
    """The refusal of an optimizer `compile_optimizer` cannot compile: what it got, why,
    and the classes it compiles, each once, by the package whose numbers they give."""
    cls = type(optimizer)
    got = f"{cls.__module__}.{cls.__qualname__}"
    families = []
    for reference, namespace in _NAMESPACES.items():
        names = sorted({entry.name for entry in registered(reference)}, key=str.lower)
        if names:
            families.append(f"  {reference} ({namespace}): {', '.join(names)}")
    bases = [entry_of(base) for base in cls.__mro__[1:] if entry_of(base) is not None]
    if bases:
        base = f"{_NAMESPACES[bases[0].reference]}.{bases[0].name}"
        why = (
            f"{got} is a subclass of {base}, and a subclass may change step(), which the "
            f"compiled step would skip: compile a {base} itself, or step "
            f"{cls.__qualname__} eagerly"
        )
    elif cls.__module__.startswith("torch."):
        why = (
            f"got {got}, a torch optimizer: build lucid's counterpart (the same name and "
            "arguments, in the namespace below) over lucid.Parameters"
        )
    else:
        why = f"got {got}, which is not one of lucid's optimizer classes"
    return (
        f"compile_optimizer compiles lucid's own optimizer classes; {why}. "
        "The classes it compiles:\n" + "\n".join(families)
    )


# optimizer -> its CompiledOptimizer, neither kept alive by the other's entry: the
# wrapper refers to the optimizer, so the value is a weak reference too
_COMPILED: weakref.WeakKeyDictionary[Optimizer, weakref.ref[CompiledOptimizer]] = (
    weakref.WeakKeyDictionary()
)
# an L-BFGS -> the Barzilai-Borwein optimizer that runs its compiled steps (and keeps
# their state): as long as the L-BFGS lives, as an optimizer keeps its compiled backend
_RUNNERS: weakref.WeakKeyDictionary[Optimizer, Optimizer] = weakref.WeakKeyDictionary()


def _compiled_form(optimizer: Optimizer) -> CompiledOptimizer | None:
    """The optimizer's compiled form: its live CompiledOptimizer, or, when that wrapper was
    dropped, a new one over the compiled backend the optimizer (or its L-BFGS runner)
    still has, with its ``shard_state_over``; ``None`` if it was never compiled."""
    found = _COMPILED.get(optimizer)
    compiled = None if found is None else found()
    if compiled is None:
        runner = _RUNNERS.get(optimizer, optimizer)
        backend = runner.backend
        if isinstance(backend, CompiledBackend):
            compiled = CompiledOptimizer(runner, backend.shard_state_over)
            _COMPILED[optimizer] = weakref.ref(compiled)
    return compiled


def compile_optimizer(
    optimizer: Optimizer, *, shard_state_over: str | tuple[str, ...] | None = None
) -> CompiledOptimizer:
    """Run `optimizer`'s whole step as one compiled, in-place XLA executable.

    From now on the compiled backend runs `optimizer.step()` and holds its
    state (adopting what eager steps built, so compiling halfway through a run
    continues it exactly); the optimizer's API and numbers are unchanged, and
    compiling the same optimizer again returns the same
    [CompiledOptimizer][lucid.optim.CompiledOptimizer] (once that handle is
    dropped, a new one over the same compiled step and state: the compiled
    form lives as long as the optimizer). Hyper-parameters are
    runtime inputs read from `param_groups` at every step: schedulers and
    hand edits never recompile. For LBFGS the compiled step is the
    closure-less Barzilai-Borwein step of `lucid.functional.lbfgs` on its own
    state, and the L-BFGS itself stays eager.

    Parameters sharded over a mesh keep their sharding and their state follows
    it (FSDP style). With `shard_state_over`, the state of parameters
    replicated over a mesh is sharded over that mesh axis (ZeRO-1): each device
    keeps and updates its piece, and the parameters stay replicated.

    Args:
      optimizer: one of lucid.optim's own optimizer classes (not a subclass of
        one, nor your own [Optimizer][lucid.optim.Optimizer]), with parameters.
      shard_state_over: a mesh axis name (or a tuple of names) of the mesh the
        parameters are replicated over; `None` keeps state laid out as the
        parameters are.

    Returns:
      The [CompiledOptimizer][lucid.optim.CompiledOptimizer] that now runs
      `optimizer`'s steps; for a Schedule-Free optimizer with `train()` and
      `eval()`, a [CompiledScheduleFree][lucid.optim.CompiledScheduleFree], which
      has them too.

    Raises:
      TypeError: any other class (the message lists the supported ones).
      ValueError: the optimizer has no parameters; it was compiled already with
        another `shard_state_over`; the parameters' mesh has no such axis.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, 2.0]))
      >>> opt = lucid.optim.Adam([w], lr=0.1)
      >>> compiled = lucid.compile_optimizer(opt)
      >>> compiled is lucid.compile_optimizer(opt)
      True
      >>> w.grad = jnp.array([1.0, -1.0])
      >>> opt.step()
      >>> [round(x, 4) for x in w.data.tolist()]
      [0.9, 2.1]
      >>> opt.param_groups[0]["lr"] = 0.01  # a runtime input: no recompilation
    """
    if type(optimizer) not in _supported():
        raise TypeError(_unsupported(optimizer))
    compiled = _compiled_form(optimizer)
    if compiled is not None:
        if shard_state_over != compiled.shard_state_over:
            raise ValueError(
                f"this optimizer was compiled with shard_state_over="
                f"{compiled.shard_state_over!r}; it cannot be compiled again with "
                f"{shard_state_over!r}"
            )
        return compiled
    if not optimizer.parameters():
        raise ValueError("compile_optimizer: the optimizer has no parameters")
    backend = optimizer.backend
    if isinstance(backend, CompiledBackend) and shard_state_over != backend.shard_state_over:
        raise ValueError(
            f"this optimizer was compiled with shard_state_over={backend.shard_state_over!r}; "
            f"it cannot be compiled again with {shard_state_over!r}"
        )
    runner = optimizer
    if optimizer.rule is LBFGS_RULE:
        runner = _RUNNERS[optimizer] = BarzilaiBorwein(optimizer)
    modes = callable(getattr(runner, "train", None)) and callable(getattr(runner, "eval", None))
    handle = CompiledScheduleFree if modes else CompiledOptimizer
    compiled = handle(runner, shard_state_over)
    _COMPILED[optimizer] = weakref.ref(compiled)
    return compiled


class FusedStep:
    """Forward, backward and update of one training step, as one executable.

    Made by [fused_step][lucid.fused_step] (or
    [CompiledOptimizer.fused_step][lucid.optim.CompiledOptimizer.fused_step]).
    `loss = fused(tree, *args, **kwargs)` evaluates
    `loss_fn(tree, *args, **kwargs)` with the call convention of
    [backward][lucid.backward], differentiates it with respect to every
    parameter of the optimizer, applies `grad_transform` to the gradients
    and updates the parameters, all in one compiled executable (two with a
    `grad_transform`: the gradients, then the transform and the update, so
    that the transform reads them as it would read them from `.grad`: inside
    one program XLA may hold a gradient in another memory order, and a norm
    summed over it would round differently), and returns the loss. It equals

    ```python
    opt.zero_grad()
    loss = lucid.backward(loss_fn, tree, *args, **kwargs)
    # grad_transform on the list of gradients, in the optimizer's parameter order
    opt.step()
    ```

    and gives its numbers: the step's hooks run as around `opt.step()` (the
    pre-hooks before the executable, the post-hooks after), the groups are read
    as they are at the call (parameters appended, removed or replaced, groups
    added or deleted: the next call follows, building a new executable once),
    and a parameter of the optimizer that the loss does not take is skipped as
    `backward` + `step` skip it (that call then runs as those three steps). One
    difference: `.grad` is left untouched (the gradients live only inside the
    executable), so a pre-hook reading `.grad` sees what was there before.
    The Parameters' `.data` are current after the call. Parameters in `tree`
    that the optimizer does not hold are constants. Fused steps of one
    structure (rule, options, shapes, dtypes, placement, `loss_fn`,
    `grad_transform`) share one compiled program, kept in a bounded cache
    (64 structures) that holds `loss_fn` and `grad_transform` until evicted;
    nothing else outlives the step and its optimizer.

    Args:
      loss_fn: `loss_fn(tree, *args, **kwargs) -> loss`, a pure JAX function
        whose loss has exactly one element (0-d, or `(1,)`, `(1, 1)`... as
        torch's `backward()` takes it).
      optimizer: one of lucid.optim's optimizers (compiled here, as by
        [compile_optimizer][lucid.compile_optimizer], unless it was compiled
        already) or a [CompiledOptimizer][lucid.optim.CompiledOptimizer].
      grad_transform: applied to the list of gradients (in the optimizer's
        parameter order) before the update: an optax `GradientTransformation`
        (e.g. [clip_grad_norm][lucid.functional.clip_grad_norm], torch's
        clipping; its state is made for the current parameters and made again
        when the optimizer's parameters change), a plain function
        `grads -> grads` on that list, or `None`. It must return one gradient
        per parameter, of its shape and dtype.
      shard_state_over: as for [compile_optimizer][lucid.compile_optimizer],
        when this call compiles the optimizer.
      has_aux: as for [fused_step][lucid.fused_step].
      accumulate: as for [fused_step][lucid.fused_step].

    Attributes:
      loss_fn: the loss function.
      compiled: the [CompiledOptimizer][lucid.optim.CompiledOptimizer] whose
        steps this runs.
      grad_transform: the optax transform applied to the gradients (a plain
        function is held as a stateless optax transform of it), or `None`.
      transform_state: the `grad_transform`'s state, carried from call to call
        (`None` without a transform).
      has_aux: whether `loss_fn` returns `(loss, aux)`.
      accumulate: the number of micro-batches per step, or `None`.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([1.0, -2.0]))
      >>> opt = lucid.optim.SGD([w], lr=0.1)
      >>> fused = lucid.fused_step(lambda w, x: ((w * x) ** 2).sum(), opt)
      >>> float(fused(w, jnp.array([1.0, 1.0])))  # the loss before the update
      5.0
      >>> [round(x, 4) for x in w.data.tolist()], w.grad  # p - lr * 2p; .grad untouched
      ([0.8, -1.6], None)
    """

    loss_fn: Callable[..., Any]
    compiled: CompiledOptimizer
    grad_transform: Any
    transform_state: Any

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        optimizer: Optimizer | CompiledOptimizer,
        grad_transform: Any = None,
        shard_state_over: str | tuple[str, ...] | None = None,
        has_aux: bool = False,
        accumulate: int | None = None,
    ) -> None:
        if accumulate is not None and (
            isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1
        ):
            raise ValueError(f"accumulate must be a positive int or None, got {accumulate!r}")
        self.loss_fn = loss_fn
        self.has_aux = bool(has_aux)
        self.accumulate = accumulate
        if isinstance(optimizer, CompiledOptimizer):
            self.compiled = optimizer
        else:
            backend = optimizer.backend
            if shard_state_over is None and isinstance(backend, CompiledBackend):
                shard_state_over = backend.shard_state_over  # compiled already, however it was
            self.compiled = compile_optimizer(optimizer, shard_state_over=shard_state_over)
        self.grad_transform = _as_transform(grad_transform)
        self.transform_state: Any = None
        self._transform_params: tuple[Parameter, ...] = ()

    def __call__(self, tree: Any, *args: Any, **kwargs: Any) -> Any:
        """One training step: the loss, its gradients, `grad_transform` and the update.

        Args:
          tree: the first argument of `loss_fn`, a pytree holding Parameters (a
            boxed tree from [lucid.parameters][lucid.parameters]).
          *args: further positional arguments of `loss_fn` (data, targets); with
            `accumulate=N`, each array among `args` and `kwargs` has a leading
            micro-batch axis of size N.
          **kwargs: further keyword arguments of `loss_fn`.

        Returns:
          The loss before the update, as `loss_fn` returned it (one element: 0-d,
          or the shape it had); with `accumulate=N`, the sum of the N micro-batch
          losses divided by N (their mean, as torch's loop sums `loss / N`); with
          `has_aux`, the pair `(loss, aux)` (with `accumulate`, each leaf of `aux`
          stacked over the micro-batches).

        Raises:
          ValueError: a hyper-parameter edited into `param_groups` is invalid,
            `grad_transform` returned gradients of another structure, or (with
            `accumulate=N`) an array of the data has no leading axis of size N
            (nothing has moved).
          TypeError: called under `jax.jit` (this step is already one compiled
            executable), or `has_aux` and `loss_fn` did not return a pair.
          RuntimeError: the loss has more (or fewer) than one element (torch's
            error, naming its shape; nothing has moved).
        """
        if self.accumulate is not None:
            data = jax.tree_util.tree_leaves(
                (args, kwargs), is_leaf=lambda x: isinstance(x, Parameter)
            )
            for x in data:
                if isinstance(x, jax.Array | np.ndarray) and (
                    x.ndim == 0 or x.shape[0] != self.accumulate
                ):
                    raise ValueError(
                        f"fused step with accumulate={self.accumulate}: every array of the "
                        f"data needs a leading micro-batch axis of size {self.accumulate}, "
                        f"but one has shape {tuple(x.shape)}"
                    )
        optimizer = self.compiled.optimizer

        # run_as_step: [Step 1] the pre-hooks, [Step 2] body: the groups as they are
        # now, checked, then the one executable, then the optimizer's end of a step,
        # [Step 3] the post-hooks
        def body() -> jax.Array:
            groups = optimizer.begin_step()  # checks, and the writes into opt.state
            self._follow_parameters(optimizer.parameters())
            backend = optimizer.backend
            assert isinstance(backend, CompiledBackend)
            loss, self.transform_state = backend.fused(
                groups,
                self.loss_fn,
                (tree, args, kwargs),
                self.grad_transform,
                self.transform_state,
                self.has_aux,
                self.accumulate,
            )
            optimizer.end_step()
            return loss

        return optimizer.run_as_step(body)

    def _follow_parameters(self, params: list[Parameter]) -> None:
        """(Re)make the transform's state for the optimizer's current parameters."""
        if self.grad_transform is None or tuple(params) == self._transform_params:
            return
        self.transform_state = _initial_state(self.grad_transform, params)
        self._transform_params = tuple(params)


def _initial_state(transform: Any, params: Sequence[Parameter]) -> Any:
    """``transform.init`` of the parameters' values. A transform whose state holds no
    array (clipping, scaling: ``optax.EmptyState``) gets it from the shapes alone
    (``jax.eval_shape``), without reading the values: in a compiled optimizer's flat
    buffers each read is a cut of its own, one small compilation per distinct shape
    on the first call. Any other transform (or one whose ``init`` cannot be traced)
    gets ``init`` of the values, as before."""
    shapes = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in params]
    try:
        abstract = jax.eval_shape(transform.init, shapes)
    except Exception:  # init then runs on the values and raises its own error
        abstract = None
    if abstract is not None and not jax.tree_util.tree_leaves(abstract):
        return abstract
    return transform.init([p.data for p in params])


@dataclasses.dataclass(frozen=True)
class _PlainInit:
    """The ``init`` of a plain function's stateless transform (equal for equal functions)."""

    fn: Callable

    def __call__(self, params: Any) -> optax.EmptyState:
        return optax.EmptyState()


@dataclasses.dataclass(frozen=True)
class _PlainUpdate:
    """The ``update`` of a plain function's stateless transform: ``fn`` on the gradients."""

    fn: Callable

    def __call__(self, updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        return self.fn(updates), state


def _as_transform(grad_transform: Any) -> Any:
    """An optax transform as it is, a plain function as a stateless transform of it
    (equal to any other made of the same function, so the fused steps of one loss and
    one function share one compiled program)."""
    if grad_transform is None:
        return None
    if hasattr(grad_transform, "init") and hasattr(grad_transform, "update"):
        return grad_transform
    if callable(grad_transform):
        return optax.GradientTransformation(
            _PlainInit(grad_transform), _PlainUpdate(grad_transform)
        )
    raise TypeError(
        "grad_transform must be an optax GradientTransformation, a function grads -> grads, "
        f"or None; got {type(grad_transform).__name__}"
    )


def fused_step(
    loss_fn: Callable[..., Any],
    optimizer: Optimizer,
    grad_transform: Any = None,
    *,
    shard_state_over: str | tuple[str, ...] | None = None,
    has_aux: bool = False,
    accumulate: int | None = None,
) -> FusedStep:
    """A fused training step: forward, backward and update of `optimizer` in one executable.

    Compiles `optimizer` as [compile_optimizer][lucid.compile_optimizer] does
    (an optimizer compiled already keeps its compiled form) and returns a
    [FusedStep][lucid.optim.FusedStep]: `loss = fused(tree, *args, **kwargs)`
    is `lucid.backward(loss_fn, tree, *args, **kwargs)` followed by the
    optimizer's step, with `grad_transform` applied to the gradients in
    between, in one executable.

    Args:
      loss_fn: `loss_fn(tree, *args, **kwargs) -> loss` (one element), a pure JAX
        function, as for [backward][lucid.backward].
      optimizer: one of lucid.optim's optimizer classes, compiled or not.
      grad_transform: an optax `GradientTransformation` applied to the list of
        gradients (in the optimizer's parameter order) before the update, e.g.
        [clip_grad_norm][lucid.functional.clip_grad_norm]; `None` for none.
      shard_state_over: as for [compile_optimizer][lucid.compile_optimizer]
        (used when this call compiles the optimizer).
      has_aux: `loss_fn` returns `(loss, aux)` and the step returns that pair,
        as with `jax.value_and_grad(..., has_aux=True)` (e.g. a model that
        returns `(logits, loss)` reordered to `(loss, logits)`).
      accumulate: `N` for gradient accumulation: every array among the call's
        data (`args`, `kwargs`) has a leading axis of `N` micro-batches; the
        step runs them in one executable (a `jax.lax.scan`, one gradient
        buffer), sums the gradients of `loss / N` as torch's loop
        `(loss / N).backward()` over the N micro-batches followed by one
        `step()` does, and updates once. `None` for one batch.

    Returns:
      The [FusedStep][lucid.optim.FusedStep].

    Raises:
      TypeError: `optimizer` is not one of lucid.optim's optimizer classes.
      ValueError: as [compile_optimizer][lucid.compile_optimizer]; `accumulate`
        is not a positive int.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> w = lucid.Parameter(jnp.array([3.0, 4.0]))
      >>> opt = lucid.optim.SGD([w], lr=1.0)
      >>> clip = lucid.functional.clip_grad_norm(max_norm=1.0)
      >>> fused = lucid.fused_step(lambda w: (w ** 2).sum() / 2, opt, grad_transform=clip)
      >>> float(fused(w))  # the gradient w (norm 5) is clipped to norm 1 first
      12.5
      >>> [round(x, 4) for x in w.data.tolist()]
      [2.4, 3.2]
      >>> v = lucid.Parameter(jnp.array([1.0]))
      >>> opt = lucid.optim.SGD([v], lr=0.1)
      >>> step = lucid.fused_step(lambda v, x: (v * x).sum(), opt, accumulate=2)
      >>> float(step(v, jnp.array([[1.0], [3.0]])))  # two micro-batches: mean loss
      2.0
      >>> [round(x, 4) for x in v.data.tolist()]  # the averaged gradient, 2
      [0.8]
    """
    return FusedStep(
        loss_fn, optimizer, grad_transform, shard_state_over, has_aux=has_aux, accumulate=accumulate
    )
