"""torch.optim's hooks: registries, removable handles and the step wrapper.

torch calls, around every `step`: the global step pre-hooks, then the
optimizer's own (each may return `(new_args, new_kwargs)`), the step, then the
optimizer's own post-hooks and the global ones. `state_dict` and
`load_state_dict` have pre- and post-hooks with `prepend`. Every
registration returns a handle whose `remove()` unregisters it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

_ids = itertools.count()


class RemovableHandle:
    """The handle of a registered hook: `remove()` unregisters it (torch's `RemovableHandle`).

    Returned by every hook registration
    ([Optimizer.register_step_pre_hook][lucid.optim.Optimizer.register_step_pre_hook]
    and the others). Used as a context manager, it removes the hook on
    leaving the `with` block.

    Args:
      registry: the ordered dict of hooks the handle's hook is registered in.

    Attributes:
      registry: the ordered dict of hooks, by id.
      id: the key of the handle's hook in `registry` (unique in the process).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
      >>> handle = opt.register_step_post_hook(lambda opt, args, kwargs: None)
      >>> handle.remove()
    """

    registry: OrderedDict[int, Callable]
    id: int

    def __init__(self, registry: OrderedDict) -> None:
        self.registry = registry
        self.id = next(_ids)

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        self.registry.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register(registry: OrderedDict, hook: Callable, prepend: bool = False) -> RemovableHandle:
    """Add `hook` to `registry` (first with `prepend`) and return its handle."""
    handle = RemovableHandle(registry)
    registry[handle.id] = hook
    if prepend:
        registry.move_to_end(handle.id, last=False)
    return handle


# torch's names for the step hooks' types: hook(optimizer, args, kwargs)
OptimizerPreHook = Callable[[Any, tuple, dict], tuple[tuple, dict] | None]
OptimizerPostHook = Callable[[Any, tuple, dict], None]

GLOBAL_STEP_PRE_HOOKS: OrderedDict[int, Callable] = OrderedDict()
GLOBAL_STEP_POST_HOOKS: OrderedDict[int, Callable] = OrderedDict()


def register_optimizer_step_pre_hook(hook: Callable) -> RemovableHandle:
    """Register a hook called before the step of every optimizer (a global hook).

    torch's `torch.optim.optimizer.register_optimizer_step_pre_hook`: the
    global pre-hooks run before each optimizer's own
    ([Optimizer.register_step_pre_hook][lucid.optim.Optimizer.register_step_pre_hook]).

    Args:
      hook: `hook(optimizer, args, kwargs) -> None | (new_args, new_kwargs)`;
        a returned pair replaces the step's arguments.

    Returns:
      A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.optimizer import register_optimizer_step_pre_hook
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
      >>> with register_optimizer_step_pre_hook(lambda o, a, k: print(type(o).__name__)):
      ...     opt.step()
      SGD
    """
    return register(GLOBAL_STEP_PRE_HOOKS, hook)


def register_optimizer_step_post_hook(hook: Callable) -> RemovableHandle:
    """Register a hook called after the step of every optimizer (a global hook).

    torch's `torch.optim.optimizer.register_optimizer_step_post_hook`: the
    global post-hooks run after each optimizer's own
    ([Optimizer.register_step_post_hook][lucid.optim.Optimizer.register_step_post_hook]).

    Args:
      hook: `hook(optimizer, args, kwargs) -> None`.

    Returns:
      A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> from lucid.optim.optimizer import register_optimizer_step_post_hook
      >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
      >>> handle = register_optimizer_step_post_hook(lambda o, a, k: print("stepped"))
      >>> opt.step()
      stepped
      >>> handle.remove()
    """
    return register(GLOBAL_STEP_POST_HOOKS, hook)


def run_with_step_hooks(
    step: Callable,
    optimizer: Any,
    args: tuple,
    kwargs: dict,
    pre_hooks: OrderedDict,
    post_hooks: OrderedDict,
    stepped: Callable[[], None],
) -> Any:
    """``step(*args, **kwargs)`` with torch's hook calls around it (see the module
    docstring): ``args[0]`` is the optimizer, as the hooks see it; ``pre_hooks`` and
    ``post_hooks`` are the optimizer's own registries; ``stepped()`` records the step
    (for the LR schedulers' order check) before the post-hooks run."""
    for pre_hook in itertools.chain(list(GLOBAL_STEP_PRE_HOOKS.values()), list(pre_hooks.values())):
        result = pre_hook(optimizer, args, kwargs)
        if result is not None:
            if isinstance(result, tuple) and len(result) == 2:
                args, kwargs = result
            else:
                raise RuntimeError(
                    f"{step} must return None or a tuple of (new_args, new_kwargs), "
                    f"but got {result}."
                )
    out = step(*args, **kwargs)
    stepped()
    for post_hook in itertools.chain(
        list(post_hooks.values()), list(GLOBAL_STEP_POST_HOOKS.values())
    ):
        post_hook(optimizer, args, kwargs)
    return out
