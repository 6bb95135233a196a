"""`Optimizer`: torch.optim's stateful API over a functional `lucid.functional.Rule`.

The optimizer owns `param_groups`, the hooks and the API; running a step
and keeping the per-parameter state is its *backend*'s job (the engine,
`lucid.optim._engine`): eager by default, compiled after
`lucid.optim.compile_optimizer`. The optimizer is the one door into a step:
every step, compiled and fused ones included, goes through `run_as_step`
(hooks around it) and hands the backend the groups as they are then
(`lucid.optim._engine.Group`), so every edit of `param_groups` reaches it.
An optimizer that writes its own `step` (your subclass, LBFGS) keeps its
state in `state`, a `defaultdict(dict)`, as torch's does.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import to_array
from .._parameter import Parameter
from .._storage import by_storage
from .._trees import boxed_tree_params
from ..functional._apply import hyper_values
from ..functional._signature import Signature
from ..functional._validate import caller_outside_lucid
from ..functional.rule import Rule
from ._engine import Backend, EagerBackend, Group, Hyper, export, load_entry
from ._hooks import (
    OptimizerPostHook,
    OptimizerPreHook,
    RemovableHandle,
    register,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
    run_with_step_hooks,
)
from ._live_state import StateMapping
from ._provenance import check_saved_by, state_saved_by
from ._torch_format import copy_arrays

ParamsT = Iterable[Parameter] | Iterable[dict[str, Any]]

__all__ = [
    "Optimizer",
    "ParamsT",
    "RemovableHandle",
    "register_optimizer_step_post_hook",
    "register_optimizer_step_pre_hook",
    "to_array",
]


class Optimizer:
    """Base class of lucid's optimizers, with `torch.optim.Optimizer`'s API.

    lucid's optimizers ([SGD][lucid.optim.SGD], [Adam][lucid.optim.Adam], ...)
    declare `rule` (the functional rule they run) and a constructor with
    torch's signature that passes its options as `defaults`; this class does
    the rest as torch's does: parameter groups, `step`, `zero_grad`,
    `state_dict`/`load_state_dict` in torch's format, and the hooks.

    Your own optimizer is written as in torch: pass `params` and `defaults`
    to this constructor and write `step`, keeping per-parameter state in
    `self.state[p]` (a `defaultdict(dict)`, as torch's); schedulers, hooks,
    `zero_grad` and `state_dict` then work on it.

    Args:
      params: what to optimize: an iterable of [Parameter][lucid.Parameter]s,
        of `(name, Parameter)` pairs (the names are kept in each group's
        `param_names`), or of dicts, each a parameter group
        (`{"params": [...], "lr": ...}`) whose options override `defaults`;
        or a boxed pytree (from [lucid.parameters][lucid.parameters]: an
        `nnx.State`, an equinox model, a dict), whose Parameters are taken in
        order with their dotted names as `param_names`, as torch's
        `model.named_parameters()`.
      defaults: the options (`lr`, ...) a group takes when it does not set
        them.

    Attributes:
      param_groups: the parameter groups, a list of dicts: `params` (the
        group's Parameters), every option of `defaults` (the group's own value
        or the default), `param_names` when the parameters came with names,
        and what schedulers add (`initial_lr`). Editing a value (`lr`,
        `betas`, ...) changes the next step; a compiled step reads it as a
        runtime input.
      defaults: the constructor's options, a dict (for lucid's optimizers,
        every keyword argument of the constructor but `params`).
      rule: a class attribute: the `lucid.functional.Rule` a built-in
        optimizer runs; `None` for an optimizer that writes its own `step`.
      torch_signature: a class attribute: the torch signature a built-in
        optimizer's constructor, Args and example come from (the same one as
        its `lucid.functional` form's); `None` for your own optimizer.
      runs_rule: a class attribute: `False` for an optimizer that has a `rule`
        but writes its own `step` and keeps its state in `state` (LBFGS).
      OptimizerPreHook: the type of a step pre-hook, torch's alias:
        `hook(optimizer, args, kwargs) -> None | (args, kwargs)`.
      OptimizerPostHook: the type of a step post-hook, torch's alias:
        `hook(optimizer, args, kwargs) -> None`.

    Raises:
      TypeError: `params` is a single Parameter or array, or holds something
        that is not a Parameter.
      ValueError: an empty parameter list, a parameter listed twice or in two
        groups, a non-float parameter, or an invalid option (torch's message).

    Warns:
      FutureWarning: `params` is a `set` (torch 2.15's warning: a set's order changes
        between runs, so the parameters' order in the groups and the state_dict does
        too; pass a list). torch 2.13 took a set without a word; a set as a group's
        `params` is a `TypeError` in both.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> class SignSGD(lucid.optim.Optimizer):
      ...     def __init__(self, params, lr=0.01):
      ...         super().__init__(params, dict(lr=lr))
      ...     def step(self, closure=None):
      ...         for group in self.param_groups:
      ...             for p in group["params"]:
      ...                 if p.grad is not None:
      ...                     p.data = p.data - group["lr"] * jnp.sign(p.grad)
      ...                     self.state[p]["steps"] = self.state[p].get("steps", 0) + 1
      >>> w = lucid.Parameter(jnp.array([1.0, -1.0]))
      >>> opt = SignSGD([w], lr=0.5)
      >>> w.grad = jnp.array([2.0, -3.0])
      >>> opt.step()
      >>> w.data.tolist(), opt.state_dict()["state"]
      ([0.5, -0.5], {0: {'steps': 1}})
      >>> opt.defaults, opt.param_groups[0]["lr"]
      ({'lr': 0.5}, 0.5)
    """

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    OptimizerPreHook: ClassVar[Any] = OptimizerPreHook
    OptimizerPostHook: ClassVar[Any] = OptimizerPostHook
    rule: ClassVar[Rule | None] = None  # None: an optimizer with its own step
    # False for a class that has a rule (its options, its compiled form) but writes its
    # own step and keeps its own state (LBFGS)
    runs_rule: ClassVar[bool] = True
    torch_signature: ClassVar[Signature | None] = None  # set by @torch_optimizer

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        if isinstance(params, Parameter | jax.Array | np.ndarray):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts (lucid.Parameter objects or dicts), but got {type(params).__name__}"
            )
        self._validate(defaults)
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self._step_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._step_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._state_dict_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._state_dict_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._load_state_dict_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._load_state_dict_post_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._has_stepped = False
        cls = type(self)
        cls.step = _hooked(cls.step)  # type: ignore[method-assign]  # torch patches too
        self._own_state: defaultdict[Parameter, dict[str, Any]] = defaultdict(dict)
        self._backend: Backend | None = (
            EagerBackend(self.rule) if self.rule is not None and self.runs_rule else None
        )
        self._live = StateMapping(self._engine_entries, self._all_engine_entries)
        if isinstance(params, dict) and (
            isinstance(params.get("params"), list | tuple | Parameter)
            or ("params" in params and not set(params).isdisjoint(defaults))
        ):
            raise TypeError(
                "params given to the optimizer is one parameter group (a dict with a 'params' "
                "list): pass a list of groups, [group]"
            )
        if isinstance(params, set):  # torch 2.15 (2.13 took a set without a word)
            warnings.warn(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list "
                "instead. This will be an error in a future release.",
                FutureWarning,
                stacklevel=caller_outside_lucid(),
            )
        named = boxed_tree_params(params)  # a boxed pytree: its parameters, named by path
        groups = [{"params": named}] if named is not None else list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # --------------------------------------------------------------- backend
    @property
    def backend(self) -> Backend | None:
        """What runs the steps and keeps the per-parameter state: the eager backend
        (jitted calls per group and device), the compiled one after
        [compile_optimizer][lucid.compile_optimizer], or `None` for an optimizer
        that writes its own step (its state is `state`)."""
        return self._backend

    def use_backend(self, make: Callable[[dict[Parameter, Any]], Backend]) -> None:
        """Hand the steps and the state to a new backend.

        [compile_optimizer][lucid.compile_optimizer] calls this; a training
        loop does not.

        Args:
          make: `make(states) -> backend`, called with the current backend's
            states (`{Parameter: state}`), which the new backend adopts. The
            current backend has released the parameters first: each holds its
            value and gradient in arrays of its own.

        Raises:
          TypeError: this optimizer writes its own step (it has no backend).
        """
        if self._backend is None:
            raise TypeError(f"{type(self).__name__} writes its own step: it has no backend")
        states = self._backend.states()
        self._backend.release()  # every value back in its parameter's own arrays
        self._backend = make(states)

    def engine_groups(self, hypers: list[Hyper] | None = None) -> list[Group]:
        """The groups as the engine reads them for one step: each group's parameters,
        options, hyper-parameters (read once) and the options a new state starts from.

        Args:
          hypers: the groups' hyper-parameters, in order, where the caller has read
            them already (`step` reads them with its checks); `None` reads them here.

        Returns:
          One engine group (the engine's own record of a parameter group: its
          parameters, options and hyper-parameters) per parameter group, in order.
        """
        rule = self.rule
        assert rule is not None
        groups = self.param_groups
        if hypers is None:
            hypers = [Hyper(*hyper_values(rule, group)) for group in groups]
        return [
            Group(group["params"], group, hyper, self.state_options(group))
            for group, hyper in zip(groups, hypers)
        ]

    def begin_step(self) -> list[Group]:
        """What every step does before the engine runs it: each group's options checked
        as torch checks them at a step (nothing moves on an error), the writes made into
        `state` since the last step handed to the engine (checked first), and the groups
        read for the engine.

        `step` and [FusedStep][lucid.optim.FusedStep] both begin this way (and end
        with `end_step`).

        Returns:
          One engine group (the engine's own record of a parameter group: its
          parameters, options and hyper-parameters) per parameter group, in order.

        Raises:
          ValueError: an option edited into `param_groups`, or a write into `state`,
            does not fit (nothing has moved).
        """
        hypers = [self._checked_hyper(group) for group in self.param_groups]
        self._apply_state_writes()
        return self.engine_groups(hypers)

    def end_step(self) -> None:
        """What every step does after the engine ran it: nothing here; a class whose
        step also keeps host-side bookkeeping in its groups (the Schedule-Free classes'
        `k`, `lr_max`, `weight_sum`) advances it here.

        `step` and [FusedStep][lucid.optim.FusedStep] both end this way, so a fused
        step keeps the same groups as `backward` + `step`.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> class Counted(lucid.optim.SGD):
          ...     def end_step(self):
          ...         for group in self.param_groups:
          ...             group["steps"] = group.get("steps", 0) + 1
          >>> w = lucid.Parameter(jnp.ones(2))
          >>> opt = Counted([w], lr=0.1)
          >>> w.grad = jnp.ones(2)
          >>> opt.step()
          >>> opt.param_groups[0]["steps"]
          1
        """

    def _checked_hyper(self, group: dict[str, Any]) -> Hyper:
        """``group``'s options checked as torch checks them at a step, and its
        hyper-parameters read; both are functions of the group's values alone, so
        they are remembered by those values while they are plain Python numbers,
        strings, ``None`` or tuples of them (any other value: every step)."""
        rule = self.rule
        assert rule is not None
        key = _options_key(group)
        cache = self.__dict__.setdefault("_checked_options", {})
        hyper = None if key is None else cache.get(key)
        if hyper is None:
            rule.check_step(group)
            hyper = Hyper(*hyper_values(rule, group))
            if key is not None:
                if len(cache) >= 64:
                    cache.clear()
                cache[key] = hyper
        return hyper

    @staticmethod
    def profile_hook_step(func: Callable) -> Callable:
        """`func` (a `step`) with the step hooks around it (torch's decorator of the same
        name, which also labels the step for its profiler; lucid has no profiler to tell).

        Every `Optimizer` subclass's `step` is wrapped so already, as torch wraps it.

        Args:
          func: a step method, `func(optimizer, *args, **kwargs)`.

        Returns:
          The wrapped method.
        """
        return _hooked(func)

    @property
    def has_stepped(self) -> bool:
        """Whether a step (eager, compiled or fused) has run; the LR schedulers read it
        for torch's step-order warning (torch's wrapped step sets a flag of its own)."""
        return self._has_stepped

    def run_as_step(
        self, body: Callable[[], Any], args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Run `body` as one step of this optimizer: the global and the optimizer's step
        pre-hooks before it, the post-hooks after, as around `step()`.

        [FusedStep][lucid.optim.FusedStep] runs its fused executable this way, so
        a fused step runs the hooks a `backward` + `step` would.

        Args:
          body: the step, `body() -> result`.
          args: the step's positional arguments as the hooks see them (after the
            optimizer, which comes first).
          kwargs: the step's keyword arguments as the hooks see them.

        Returns:
          What `body()` returned.

        Raises:
          RuntimeError: a pre-hook returned something other than `None` or a pair.
        """

        def call(optimizer: Optimizer, *_: Any, **__: Any) -> Any:
            return body()

        return run_with_step_hooks(
            call,
            self,
            (self, *args),
            dict(kwargs or {}),
            self._step_pre_hooks,
            self._step_post_hooks,
            self._mark_stepped,
        )

    def _mark_stepped(self) -> None:
        self._has_stepped = True

    def state_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The options a parameter's new state is made from.

        torch makes a state from the group's values at the parameter's first
        step; an optimizer that differs (LBFGS) overrides this.

        Args:
          group: the parameter's group.

        Returns:
          The options, a mapping like `group` (here, `group` itself).
        """
        return group

    # ----------------------------------------------------------------- groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group (torch: `opt.add_param_group`).

        Useful for fine-tuning: unfreeze layers and add them with their own
        options. Schedulers made before see the group only if they are made
        again.

        Args:
          param_group: `{"params": ..., **options}`: the Parameters (a
            Parameter, an ordered iterable of Parameters or of
            `(name, Parameter)` pairs, or a boxed pytree, whose Parameters come
            with their dotted names; named exactly when the other groups' are)
            and the group's options; missing options take `defaults`.

        Raises:
          TypeError: `param_group` is not a dict, its `params` is a set or
            holds something that is not a Parameter.
          ValueError: no `params` entry, a parameter already in a group or
            listed twice, a non-float parameter, names given in some groups
            only, or an invalid option.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.zeros(2))], lr=0.1)
          >>> opt.add_param_group({"params": [lucid.Parameter(jnp.zeros(3))], "lr": 0.01})
          >>> [group["lr"] for group in opt.param_groups]
          [0.1, 0.01]
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError("param_group must have a 'params' entry")
        params = param_group["params"]
        named = boxed_tree_params(params)  # a boxed pytree: its parameters, named by path
        if named is not None:
            params = named
        elif isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        if names:
            if len(names) != len(params):
                raise ValueError(
                    "all optimizer params should be with/without names. Some param names are "
                    "missing"
                )
            params = [p[1] for p in params]
        for group in self.param_groups:
            if bool(names) != ("param_names" in group):
                raise ValueError(
                    "all optimizer param groups should be with/without names. cannot add param "
                    f"group {'with' if names else 'without'} names to the optimizer"
                )
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(
                    "optimizer can only optimize lucid.Parameter objects, "
                    f"but one of the params is {type(p).__name__}"
                    + (
                        " (box arrays with lucid.Parameter(array), or a pytree with "
                        "lucid.parameters(tree))"
                        if isinstance(p, jax.Array | np.ndarray)
                        else ""
                    )
                )
            if not jnp.issubdtype(p.dtype, jnp.inexact):
                raise ValueError(
                    f"{type(self).__name__} can only optimize floating-point (or complex) "
                    f"parameters, but one has dtype {p.dtype}"
                )
        if len(set(params)) != len(params):
            raise ValueError("a parameter group lists the same parameter twice")
        taken = {p for group in self.param_groups for p in group["params"]}
        if not taken.isdisjoint(params):
            raise ValueError("some parameters appear in more than one parameter group")
        group = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        if names:
            group["param_names"] = names
        self._validate(group)
        # torch keeps the caller's dict (later edits of it reach the steps), with the
        # parameters as a list and the defaults it lacks
        param_group["params"] = params
        if names:
            param_group["param_names"] = names
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        self.param_groups.append(param_group)

    @property
    def state(self) -> MutableMapping[Any, Any]:
        """Per-parameter state with torch's names, live as torch's `optimizer.state`.

        `state[p]` is the parameter's `{name: array}` (empty before its first
        step). Reads see the current state; writes (`state[p]["exp_avg"] =
        jnp.zeros_like(p.data)`, a new name, `del state[p]`, a key that is not a
        parameter, `state["note"] = 1`) take effect at the next step, which
        checks them as a checkpoint's entries are checked: a write of the wrong
        shape or dtype is a `ValueError` at that step, and nothing changes.
        Names the optimizer does not keep and non-parameter keys are kept as
        written and travel in `state_dict()`. For an optimizer that writes its
        own step, the `defaultdict(dict)` its `step` writes, as in torch."""
        if self._backend is None:
            return self._own_state
        return self._live

    def _engine_entries(self, p: Parameter) -> dict[str, Any]:
        assert self._backend is not None
        state = self._backend.state_of(p)
        return {} if state is None else self.export_state(state)

    def _all_engine_entries(self) -> dict[Parameter, dict[str, Any]]:
        assert self._backend is not None
        shown = {p: self.export_state(s) for p, s in self._backend.states().items()}
        return {p: entries for p, entries in shown.items() if entries}

    def state_names(self) -> set[str]:
        """The entry names the engine keeps for a parameter (torch's names); other names
        written into `state` are kept beside it.

        Returns:
          The names (for a built-in optimizer, its rule's state fields that torch shows).
        """
        if self.rule is None:
            return set()
        return set(self.rule.state._fields) - set(self.rule.fields.hidden)

    def _apply_state_writes(self) -> None:
        """Hand the writes made into `state` since the last step to the engine, checked
        first: on an error nothing changes."""
        live, backend = self._live, self._backend
        if backend is None or not (live.pending or live.dropped):
            return
        names = self.state_names()
        changed = live.take_writes(lambda p: names)
        group_of = {p: g for g in self.param_groups for p in g["params"]}
        states = backend.states()
        for p, entries in changed.items():
            where = f"written into opt.state (a parameter of shape {tuple(p.shape)})"
            for name, value in live.pending.get(p, {}).items():
                # a write keeps the parameter's dtype (torch's in-place update fails on
                # any other); a checkpoint's entries, by contrast, are converted on load
                dtype = getattr(value, "dtype", None)
                scalar = self.rule is not None and name in self.rule.fields.scalar
                if name in names and dtype is not None and not scalar and dtype != p.dtype:
                    raise ValueError(
                        f"state {name!r} {where} has dtype {dtype}; the parameter's is {p.dtype}"
                    )
            state = self.import_state(group_of.get(p, self.defaults), p, entries, where)
            if state is None:
                states.pop(p, None)
            else:
                states[p] = state
        backend.load(states)
        live.writes_applied(lambda p: names)

    def _validate(self, options: Mapping[str, Any]) -> None:
        if self.rule is not None:
            self.rule.check(options)

    def parameters(self) -> list[Parameter]:
        """Every parameter of every group, in the groups' order.

        Returns:
          A new list of the [Parameter][lucid.Parameter]s.
        """
        return [p for group in self.param_groups for p in group["params"]]

    # ------------------------------------------------------------------- step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradient of every parameter in every group (torch: `opt.zero_grad()`).

        Args:
          set_to_none: set each `.grad` to `None` (torch's default, and the
            cheaper: a step skips parameters without a gradient); `False` fills
            each existing gradient with zeros.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.zeros(2))
          >>> opt = lucid.optim.SGD([w], lr=0.1)
          >>> w.grad = jnp.ones(2)
          >>> opt.zero_grad(set_to_none=False)
          >>> w.grad.tolist()
          [0.0, 0.0]
          >>> opt.zero_grad()
          >>> w.grad is None
          True
        """
        for storage, indices in by_storage(p.location for p in self.parameters()):
            storage.clear_grads(indices, set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient (torch: `opt.step()`).

        Parameters whose `.grad` is `None` are skipped (their state does not
        move). A parameter's state is made at its first step with a gradient,
        from its group's options at that moment, as torch makes it. Every
        group's options and every gradient are checked before anything moves.
        The step's hooks run around it.

        Args:
          closure: an optional function that recomputes the loss; it is called
            once, before the update, and its result returned (LBFGS calls it
            several times).

        Returns:
          What `closure()` returned, or `None` without a closure.

        Raises:
          NotImplementedError: an optimizer without a `rule` must write its own step.
          ValueError: an option edited into `param_groups` is invalid, or a
            gradient's shape or dtype does not match its parameter's (nothing
            has moved).
          KeyError: torch's error when an option that owns a state entry was turned
            on after the state was made (nothing has moved).

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.array([1.0, 2.0]))
          >>> opt = lucid.optim.SGD([w], lr=0.5)
          >>> w.grad = jnp.array([1.0, 1.0])
          >>> opt.step()
          >>> w.data.tolist()
          [0.5, 1.5]
        """
        if self.rule is None or self._backend is None:
            raise NotImplementedError(f"{type(self).__name__} must implement step()")
        loss = closure() if closure is not None else None
        self._backend.step(self.begin_step())  # values edited by hand: checked first
        self.end_step()
        return loss

    # ----------------------------------------------------------------- hooks
    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """Register a hook called before each `step` (torch: `register_step_pre_hook`).

        The hooks run in registration order, after the global ones
        ([register_optimizer_step_pre_hook][lucid.optim.optimizer.register_optimizer_step_pre_hook]).

        Args:
          hook: `hook(optimizer, args, kwargs) -> None | (new_args, new_kwargs)`,
            where `args` and `kwargs` are those `step` was called with
            (`args[0]` is the optimizer); a returned pair replaces them.

        Returns:
          A [RemovableHandle][lucid.optim.optimizer.RemovableHandle] whose
          `remove()` unregisters the hook.

        Raises:
          RuntimeError: at the step, the hook returned something other than
            `None` or a pair.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> handle = opt.register_step_pre_hook(lambda opt, args, kwargs: print("before"))
          >>> opt.step()
          before
          >>> handle.remove()
          >>> opt.step()
        """
        return register(self._step_pre_hooks, hook)

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """Register a hook called after each `step` (torch: `register_step_post_hook`).

        The hooks run in registration order, before the global ones
        ([register_optimizer_step_post_hook][lucid.optim.optimizer.register_optimizer_step_post_hook]).

        Args:
          hook: `hook(optimizer, args, kwargs) -> None`, with the arguments the
            step was called with.

        Returns:
          A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> with opt.register_step_post_hook(lambda opt, args, kwargs: print("after")):
          ...     opt.step()
          after
        """
        return register(self._step_post_hooks, hook)

    def register_state_dict_pre_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Register a hook called before `state_dict` builds its result.

        Args:
          hook: `hook(optimizer) -> None`.
          prepend: run it before the hooks already registered (else after).

        Returns:
          A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].
        """
        return register(self._state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Register a hook called on the result of `state_dict`.

        Args:
          hook: `hook(optimizer, state_dict) -> state_dict | None`; a returned
            dict replaces the result (the next hook receives it).
          prepend: run it before the hooks already registered (else after).

        Returns:
          A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> opt = lucid.optim.SGD([lucid.Parameter(jnp.ones(2))], lr=0.1)
          >>> def tag(opt, state_dict):
          ...     state_dict["note"] = "saved by lucid"
          >>> handle = opt.register_state_dict_post_hook(tag)
          >>> opt.state_dict()["note"]
          'saved by lucid'
        """
        return register(self._state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Register a hook called on what `load_state_dict` was given, before it loads.

        Args:
          hook: `hook(optimizer, state_dict) -> state_dict | None`, given a
            shallow copy of the argument; a returned dict is loaded instead
            (the next hook receives it).
          prepend: run it before the hooks already registered (else after).

        Returns:
          A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].
        """
        return register(self._load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(
        self, hook: Callable, prepend: bool = False
    ) -> RemovableHandle:
        """Register a hook called after `load_state_dict` has loaded.

        Args:
          hook: `hook(optimizer) -> None`.
          prepend: run it before the hooks already registered (else after).

        Returns:
          A [RemovableHandle][lucid.optim.optimizer.RemovableHandle].
        """
        return register(self._load_state_dict_post_hooks, hook, prepend)

    # ------------------------------------------------------------- checkpoints
    def export_state(self, state: Any) -> dict[str, Any]:
        """How one parameter's state appears in `state` and `state_dict`.

        An extension point: the built-in optimizers show torch's state names
        and hide the fields torch does not keep.

        Args:
          state: the parameter's state as the backend keeps it (the rule's
            state NamedTuple; for your own optimizer, the dict `step` wrote).

        Returns:
          `{name: value}` with torch's names.
        """
        if self.rule is None:
            return dict(state)
        return export(self.rule, state)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state and options, in torch's format (torch: `opt.state_dict()`).

        A snapshot: fresh dicts and fresh array copies, so nothing done to the
        result (even torch updating a tensor made from it in place, which
        shares its memory on the CPU) reaches the optimizer. The state-dict
        hooks run around it.

        Returns:
          `{"state": {index: {name: array}}, "param_groups": [group, ...]}`:
          each parameter by its index in the order of the groups, with the
          state entries torch keeps (jax arrays; `step` as a 0-d float32
          array, as torch's); each group's options with `params` as those
          indices. [load_state_dict][lucid.optim.Optimizer.load_state_dict]
          takes it, and so does torch's optimizer of the same class after
          [to_torch][lucid.optim.to_torch].

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.zeros(2))
          >>> opt = lucid.optim.Adam([w], lr=0.1)
          >>> w.grad = jnp.ones(2)
          >>> opt.step()
          >>> sd = opt.state_dict()
          >>> sorted(sd["state"][0]), float(sd["state"][0]["step"])
          (['exp_avg', 'exp_avg_sq', 'step'], 1.0)
          >>> sd["param_groups"][0]["params"], sd["param_groups"][0]["lr"]
          ([0], 0.1)
        """
        for pre_hook in list(self._state_dict_pre_hooks.values()):
            pre_hook(self)
        index: dict[Parameter, int] = {}
        groups = []
        unsaved = {} if self.torch_signature is None else self.torch_signature.unsaved_defaults()
        for group in self.param_groups:
            packed = {
                k: copy.deepcopy(v)
                for k, v in group.items()
                if k != "params" and not (k in unsaved and _same_option(v, unsaved[k]))
            }
            packed["params"] = [index.setdefault(p, len(index)) for p in group["params"]]
            groups.append(packed)
        state: dict[Any, Any] = {}
        others: dict[Any, Any] = {}
        every = self._live.snapshot() if self._backend is not None else dict(self._own_state)
        for key, entries in every.items():
            if not isinstance(key, Parameter):
                others[key] = copy.deepcopy(entries)  # torch: a non-parameter key as it is
                continue
            shown = self.export_state(entries) if self._backend is None else dict(entries)
            own = self._backend is None  # torch's defaultdict: even an entry made by reading
            if not shown and not (own and key not in index):
                continue
            if key not in index:  # torch: the parameter's id is not in its param mappings
                raise KeyError(
                    f"state_dict: a parameter of shape {key.shape} has state but is in no "
                    "parameter group (torch raises this KeyError too)"
                )
            state[index[key]] = copy_arrays(shown)
        state_dict = {"state": {**dict(sorted(state.items())), **others}, "param_groups": groups}
        for post_hook in list(self._state_dict_post_hooks.values()):
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state_dict, lucid's or torch's (torch: `opt.load_state_dict`).

        Everything is validated before anything changes: the number and sizes
        of the groups, that this optimizer saved them (a group lacking an option
        every state_dict of it holds, or holding an option only another optimizer
        has, is another optimizer's: torch loads it and fails at the step), every
        option (torch's checks), and each state entry's names, shapes and dtypes.
        Options are taken from the saved groups, those torch fills in when a group
        lacks them from `defaults`; parameters are matched by position. torch
        tensors (any float dtype, bfloat16 included) are read as arrays. The load
        hooks run around it.

        Args:
          state_dict: what [state_dict][lucid.optim.Optimizer.state_dict]
            returned (of this class, eager or compiled), or a torch optimizer's
            `state_dict()` of the same class and parameters.

        Raises:
          ValueError: the state_dict does not fit this optimizer, or another optimizer
            saved it (the message names both); nothing changed.

        Examples:
          >>> import jax.numpy as jnp, lucid
          >>> w = lucid.Parameter(jnp.zeros(2))
          >>> opt = lucid.optim.SGD([w], lr=0.1, momentum=0.9)
          >>> w.grad = jnp.ones(2)
          >>> opt.step()
          >>> saved = opt.state_dict()
          >>> fresh = lucid.optim.SGD([w], lr=0.5, momentum=0.9)
          >>> fresh.load_state_dict(saved)
          >>> fresh.param_groups[0]["lr"], fresh.state[w]["momentum_buffer"].tolist()
          (0.1, [1.0, 1.0])
        """
        if isinstance(state_dict, Mapping):
            state_dict = dict(state_dict)  # shallow copy, as torch's (hooks may edit it)
        for pre_hook in list(self._load_state_dict_pre_hooks.values()):
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups, states, extra, others = self._validated(state_dict)
        for group, new in zip(self.param_groups, groups):
            group.clear()
            group.update(new)
        self.groups_loaded()
        if self._backend is None:
            self._own_state.clear()
            self._own_state.update(states)
            self._own_state.update(others)
        else:
            self._backend.load(states)
            self._live.reset(extra, others)
        for post_hook in list(self._load_state_dict_post_hooks.values()):
            post_hook(self)

    def _validated(self, state_dict: Mapping[str, Any]) -> tuple[list[dict], dict, dict, dict]:
        """The groups, states, extra entries (names the engine does not keep) and
        non-parameter keys a state_dict would produce; raises ValueError on any mismatch."""
        if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError("a state_dict must be a dict with 'state' and 'param_groups' entries")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for group, saved in zip(self.param_groups, saved_groups):
            if "params" not in saved or len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
        names = self.state_names()
        if self.rule is not None:  # your own optimizer loads any state_dict, as torch's
            check_saved_by(self, saved_groups, dict(state_dict["state"]), names)
        try:
            new_groups, id_map = self._loaded_groups(saved_groups)
            new_states, extra, others = self._loaded_states(new_groups, id_map, state_dict, names)
        except ValueError as error:  # options or a state that do not fit: another optimizer's?
            why = None if self.rule is None else state_saved_by(self, state_dict["state"], names)
            if why is None:
                raise
            raise ValueError(f"{error}; {why}") from None
        return new_groups, new_states, extra, others

    def _loaded_groups(self, saved_groups: list) -> tuple[list[dict], dict[Any, Parameter]]:
        """The groups a state_dict's groups give (its options over the defaults, each
        group's options checked) and its parameter ids mapped to the parameters."""
        id_map: dict[Any, Parameter] = {}
        new_groups = []
        for group, saved in zip(self.param_groups, saved_groups):
            id_map.update(zip(saved["params"], group["params"]))
            options = {k: _to_python(to_array(v)) for k, v in saved.items() if k != "params"}
            merged = {**self.defaults, **options}
            if "param_names" in group and "param_names" not in merged:
                merged["param_names"] = group["param_names"]  # torch keeps the current names
            self._validate(merged)
            merged["params"] = group["params"]
            new_groups.append(merged)
        return new_groups, id_map

    def _loaded_states(
        self,
        new_groups: list[dict],
        id_map: dict[Any, Parameter],
        state_dict: Mapping[str, Any],
        names: set[str],
    ) -> tuple[dict, dict, dict]:
        """The states, extra entries and non-parameter keys of a state_dict's state,
        each entry checked; raises ValueError on any mismatch."""
        group_of = {p: g for g in new_groups for p in g["params"]}
        new_states: dict[Parameter, Any] = {}
        extra: dict[Parameter, dict[str, Any]] = {}
        others: dict[Any, Any] = {}
        for key, saved_state in dict(state_dict["state"]).items():
            if key not in id_map:
                if isinstance(key, int | np.integer):
                    raise ValueError(
                        f"the state_dict holds state for parameter {key!r}, which no group lists"
                    )
                others[key] = saved_state  # torch keeps a key that is not a parameter's
                continue
            p = id_map[key]
            if self._backend is not None and isinstance(saved_state, Mapping):
                # names the engine does not keep travel beside it, as torch keeps them
                kept = {k: v for k, v in saved_state.items() if k not in names}
                if kept:
                    extra[p] = kept
                saved_state = {k: v for k, v in saved_state.items() if k in names}
            state = self.import_state(group_of[p], p, saved_state, key)
            if state is not None:
                new_states[p] = state
        return new_states, extra, others

    def constructed(self) -> None:
        """Per-class checks and state at the end of a lucid optimizer's construction
        (Muon's 2-D check, Adagrad's accumulators), as torch makes them in ``__init__``."""

    def groups_loaded(self) -> None:
        """Per-class fix-ups of the groups right after a load (torch's `__setstate__`);
        an extension point, a no-op here."""

    def import_state(self, group: Mapping[str, Any], p: Parameter, saved: Any, key: Any) -> Any:
        """One parameter's saved state_dict entry as the state its backend keeps.

        An extension point of `load_state_dict` (the inverse of `export_state`).

        Args:
          group: the parameter's group, with the loaded options.
          p: the parameter.
          saved: its entry in the state_dict's `state`, `{name: array}`.
          key: the entry's key in the state_dict (for error messages).

        Returns:
          The state (the rule's NamedTuple; for your own optimizer, a dict of
          arrays), or `None` for an empty entry.

        Raises:
          ValueError: the entry does not fit this optimizer or this parameter.
        """
        if self.rule is None:  # your own optimizer: entries as they were saved, arrays read
            if not isinstance(saved, Mapping):
                raise ValueError(f"state of parameter {key!r} must be a dict")
            return {k: _to_jax(to_array(v)) for k, v in saved.items()} or None
        return load_entry(self.rule, group, p.shape, p.dtype, saved, key)

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k != "params"]
        return "\n".join(lines) + "\n)"


def _to_jax(value: Any) -> Any:
    return jnp.asarray(value) if isinstance(value, np.ndarray) else value


def _same_option(value: Any, default: Any) -> bool:
    """Whether a group's option is an `extension` keyword's default (of its type too:
    ``0`` is not ``False``), so that its state_dict group may leave it out."""
    return type(value) is type(default) and value == default


def _to_python(value: Any) -> Any:
    """0-d arrays from a checkpoint's groups (a torch lr tensor) back to Python numbers."""
    if isinstance(value, np.ndarray) and value.shape == ():
        return value.item()
    return value


def _hooked(step: Callable) -> Callable:
    """``step`` with torch's hook calls around it (torch patches ``step`` so too)."""
    if getattr(step, "hooked", False):
        return step

    @functools.wraps(step)
    def wrapper(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
        return run_with_step_hooks(
            step,
            self,
            (self, *args),
            kwargs,
            self._step_pre_hooks,
            self._step_post_hooks,
            self._mark_stepped,
        )

    wrapper.hooked = True  # type: ignore[attr-defined]
    return wrapper


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _options_key(group: Mapping[str, Any]) -> tuple | None:
    """A group's options other than ``params`` as a key (their types in it: ``True``
    is not ``1`` to the checks), or ``None`` when a value is not plain."""
    key = []
    for name, value in group.items():
        if name == "params":
            continue
        kind = type(value)
        if kind is tuple:
            kinds = tuple(type(v) for v in value)
            if not all(k in _PLAIN for k in kinds):
                return None
            key.append((name, value, kinds))
        elif kind in _PLAIN:
            key.append((name, value, kind))
        else:
            return None
    return tuple(key)
