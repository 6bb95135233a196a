"""A rule of ``lucid.functional`` called as torch's in-place functional form.

torch's functional optimizers (``torch.optim.functional.adam`` and its 13 siblings,
torch 2.15) take lists of tensors, one entry per parameter, and update the
parameters and the state lists in place. JAX arrays are immutable, so
`lucid.optim.functional` takes the same arguments and returns the new lists. Each of
its functions is a `ListForm`: which rule it runs, which of torch's lists hold which
state field of the rule, and how torch's keywords become the options the rule's
``split`` reads. The update itself is the rule's, through `apply_leaves`, as in every
other form: no arithmetic lives here.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from .._arrays import is_sparse
from ..functional import _validate
from ..functional._apply import (
    apply_leaves,
    as_hyper,
    check_complex,
    check_sparse_grad,
    init_leaf,
    pack,
)
from ..functional._signature import Signature, docstring, entry
from ..functional.rule import Rule

Array = jax.Array
Arguments = Mapping[str, Any]

# what torch's knobs mean here, written once (torch's functional forms take them all)
KNOBS = {
    "foreach": "torch's choice of multi-tensor kernels: accepted and ignored (XLA fuses the "
    "update).",
    "fused": "torch's fused kernels: accepted and ignored.",
    "capturable": "torch's CUDA-graph capture support: accepted and ignored (every lucid "
    "function is jit-able).",
    "differentiable": "torch's autograd through the update: `True` raises `ValueError` "
    "(differentiate lucid's pure function with `jax.grad` instead).",
    "grad_scale": "torch's gradient scale for its fused kernels (mixed precision): only "
    "`None`; unscale the gradients before the call.",
    "found_inf": "torch's flag of non-finite scaled gradients for its fused kernels: only "
    "`None`; skip the call where the gradients are not finite.",
    "has_complex": "torch's hint that a parameter is complex: accepted and ignored (lucid "
    "reads it from each parameter's dtype and runs the rule on complex parameters' real "
    "view, as torch's classes make torch do).",
    "has_sparse_grad": "torch's hint that a gradient is sparse: accepted and ignored "
    "(lucid reads it from each gradient's type, a `jax.experimental.sparse.BCOO`).",
}

# torch's state lists, each an entry per parameter (a 0-d array for a step, eta, mu)
LISTS = {
    "params": "the parameters' values, arrays (torch: the tensors it updates in place).",
    "grads": "their gradients, one array per parameter.",
    "d_p_list": "the parameters' gradients, one array per parameter (torch's name).",
    "state_steps": "each parameter's `step`, updates done so far: a 0-d array (or number); "
    "the new lists count this update.",
    "exp_avgs": "each parameter's `exp_avg` (m, the average of the gradient).",
    "exp_avg_sqs": "each parameter's `exp_avg_sq` (v, the average of the squared gradient).",
    "max_exp_avg_sqs": "each parameter's `max_exp_avg_sq` (the running maximum of v) with "
    "`amsgrad`; may be empty without it (it is then returned as it came).",
    "exp_infs": "each parameter's `exp_inf` (the exponentially weighted infinity norm).",
    "mu_products": "each parameter's `mu_product` (the product of NAdam's momentum "
    "schedule), a 0-d array.",
    "square_avgs": "each parameter's `square_avg` (the average of the squared gradient).",
    "acc_deltas": "each parameter's `acc_delta` (the average of the squared update).",
    "grad_avgs": "each parameter's `grad_avg` (the average of the gradient) with `centered`; "
    "may be empty without it.",
    "momentum_buffer_list": "each parameter's `momentum_buffer`; may be empty without momentum.",
    "state_sums": "each parameter's `sum` (the sum of squared gradients).",
    "axs": "each parameter's `ax` (the averaged parameter).",
    "mus": "each parameter's `mu` (the averaging coefficient), a 0-d array.",
    "etas": "each parameter's `eta` (the current step size), a 0-d array.",
    "prevs": "each parameter's `prev` (the previous gradient, zeroed where its sign flipped).",
    "step_sizes": "each parameter's `step_size` (each element's step size; the class's "
    "option of this name is `step_size_min` and `step_size_max` here).",
    "row_vars": "each parameter's `row_var` (torch's keepdim shape) for a parameter of two "
    "or more dimensions; `None` for a vector.",
    "col_vars": "each parameter's `col_var` for a parameter of two or more dimensions; `None` "
    "for a vector.",
    "variances": "each parameter's `variance` for a vector or 0-d parameter; `None` for a matrix.",
    "muon_momentum_bufs": "each parameter's `momentum_buffer`.",
}


@dataclasses.dataclass(frozen=True)
class ListForm:
    """One of torch's functional optimizers over a lucid rule.

    Attributes:
      name: torch's function name (``"adam"``).
      rule: the rule it runs.
      signature: the class's signature, whose argument docs describe the options
        this function shares with the class.
      lists: ``(torch's list argument, the rule's state field)`` for every state list,
        in torch's order.
      options: the call's arguments -> the options the rule's ``split`` reads.
      grads: the name of torch's gradient list (``"d_p_list"`` for SGD).
      steps: ``"counted"``: the state steps count this update (torch increments them);
        ``"read"``: the caller has counted it already and they are returned as given
        (torch's ``sparse_adam``); ``"none"``: torch keeps no step (Muon).
      lazy: state lists whose ``None`` entries mean "start this state now" (torch's SGD
        writes a new momentum buffer into the list).
      own: the descriptions of arguments neither a knob nor a list nor the class's
        (``beta1``: the class's ``betas[0]``).
      check: further checks of the call's arguments, before anything runs.
      raises: what this function raises beyond every function's, by exception name
        (appended to that exception's entry).
    """

    name: str
    rule: Rule
    signature: Signature
    lists: tuple[tuple[str, str], ...]
    options: Callable[[Arguments], dict[str, Any]]
    grads: str = "grads"
    steps: str = "counted"
    lazy: tuple[str, ...] = ()
    own: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check: Callable[[Arguments], None] | None = None
    raises: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __call__(self, arguments: Arguments) -> tuple[list[Any], ...]:
        """Run the rule over the lists of one call; ``(params, *state lists)``, new."""
        _check_knobs(self.name, arguments)
        if self.check is not None:
            self.check(arguments)
        options = self.options(arguments)
        hyper, flags = self.rule.split(options)
        _validate.hypers(hyper, schedules=False)
        if self.rule.options.check_at_step is not None:
            self.rule.options.check_at_step(options)
        packed = pack(self.rule, {k: as_hyper(v) for k, v in hyper.items()})

        params = [jnp.asarray(p) for p in arguments["params"]]
        grads = list(arguments[self.grads])
        n = len(params)
        if len(grads) != n:
            raise ValueError(
                f"{self.name}: {self.grads} has {len(grads)} entries for {n} parameters"
            )
        given = {name: list(arguments[name]) for name, _ in self.lists}
        used = self._used_lists(flags)
        for name, values in given.items():
            if len(values) != n and (name in used or len(values) != 0):
                where = "" if name in used else " (or none, as it is not used)"
                raise ValueError(
                    f"{self.name}: {name} has {len(values)} entries for {n} parameters; "
                    f"give one per parameter{where}"
                )
        for i, (p, g) in enumerate(zip(params, grads)):
            check_complex(self.rule, p.dtype)
            if is_sparse(g):
                check_sparse_grad(self.rule, options, g, p.shape)
            elif jnp.shape(g) != p.shape:
                raise ValueError(
                    f"{self.name}: {self.grads}[{i}] has shape {jnp.shape(g)} for a parameter "
                    f"of shape {p.shape}"
                )
        shapes: dict[tuple, Any] = {}  # the rule's fresh state per (shape, dtype), traced once
        states = [
            self._state(i, p, flags, packed, given, used, shapes) for i, p in enumerate(params)
        ]
        grads = [g if is_sparse(g) else jnp.asarray(g) for g in grads]
        new_params, new_states = apply_leaves(
            self.rule, [flags] * n, [packed] * n, params, grads, states
        )
        out: list[list[Any]] = [new_params]
        for name, field in self.lists:
            if name not in used:
                out.append(given[name])
            elif field == "step" and self.steps == "read":
                out.append(given[name])  # torch reads the caller's count and keeps it
            else:
                new = [getattr(s, field) for s in new_states]
                # an entry the rule does not use for this parameter (Adafactor's
                # variance of a matrix) is returned as it came, as torch leaves it
                out.append([v if v is not None else given[name][i] for i, v in enumerate(new)])
        return tuple(out)

    def _used_lists(self, flags: Mapping[str, Any]) -> set[str]:
        """The lists the rule reads under ``flags`` (an optional field's flag off: not)."""
        optional = self.rule.fields.optional
        return {
            name
            for name, field in self.lists
            if field not in optional or flags.get(optional[field], False)
        }

    def _state(
        self,
        i: int,
        param: Array,
        flags: Mapping[str, Any],
        packed: Mapping[str, Any],
        given: Mapping[str, list[Any]],
        used: set[str],
        shapes: dict[tuple, Any],
    ) -> Any:
        """Parameter ``i``'s state: the lists' entries as the rule's fields, checked
        against the shapes the rule's own state would have."""
        key = (tuple(param.shape), param.dtype)
        if key not in shapes:
            shapes[key] = jax.eval_shape(lambda p: init_leaf(self.rule, flags, packed, p), param)
        fresh = shapes[key]
        fields: dict[str, Any] = {}
        started = False
        for name, field in self.lists:
            if name not in used:
                continue
            value = given[name][i]
            expected = getattr(fresh, field)
            if field == "step":
                value = jnp.asarray(value)
                if not jnp.issubdtype(value.dtype, jnp.floating):
                    value = value.astype(jnp.float32)
                if value.size != 1:
                    raise ValueError(
                        f"{self.name}: {name}[{i}] must be one number, got shape {value.shape}"
                    )
                value = value.reshape(())
                fields[field] = value - 1 if self.steps == "read" else value
                continue
            if expected is None:  # the rule keeps no such field for this parameter
                continue
            if value is None:
                if name in self.lazy:  # torch starts it from this step's gradient
                    started = True
                    continue
                raise ValueError(
                    f"{self.name}: {name}[{i}] is None, but parameter {i} (shape "
                    f"{tuple(param.shape)}) needs one of shape {tuple(expected.shape)}"
                )
            value = jnp.asarray(value)
            if value.shape != expected.shape:
                raise ValueError(
                    f"{self.name}: {name}[{i}] has shape {tuple(value.shape)}, but parameter "
                    f"{i} (shape {tuple(param.shape)}) needs {tuple(expected.shape)}"
                )
            fields[field] = value
        if started:
            return init_leaf(self.rule, flags, packed, param)
        values = {}
        for field in self.rule.state._fields:
            shape = getattr(fresh, field)
            if field in fields:
                values[field] = fields[field]
            elif field in self.rule.fields.hidden:  # lucid's own field: its value in a loaded state
                values[field] = jnp.asarray(self.rule.fields.hidden[field], jnp.float32)
            elif shape is None:
                values[field] = None
            else:  # a field no list holds and the update does not read
                values[field] = jnp.zeros(shape.shape, shape.dtype)
        return self.rule.state(**values)

    def document(self, function: Callable[..., Any], prose: str) -> None:
        """Write ``function``'s docstring: ``prose`` (with its example), then Args for
        every argument, Returns and Raises."""
        class_docs = {arg.name: arg.doc for arg in self.signature.keywords()}
        names = list(inspect.signature(function).parameters)
        args = []
        for name in names:
            if name in self.own:
                doc = self.own[name]
            elif name in LISTS:
                doc = LISTS[name]
            elif name in KNOBS:
                doc = KNOBS[name]
            else:
                doc = class_docs[name]
            args.append(entry(name, doc))
        returned = ", ".join(["params", *(name for name, _ in self.lists)])
        returns = (
            f"`({returned})`: new lists (torch updates these in place), each entry the new "
            "value of the one given, in its dtype."
        )
        if self.steps == "read":
            returns += " `state_steps` is returned as given (torch reads it, does not count it)."
        raised = {
            "ValueError": "a list whose length is not the number of parameters, an entry of "
            "the wrong shape (or `None` where the rule needs one), `differentiable=True`, or "
            "a `grad_scale` or `found_inf`.",
            "TypeError": "a hyper-parameter that is not a real number or one-element array, "
            "or an argument torch's signature does not take.",
            "RuntimeError": "torch's: a sparse gradient or a complex parameter where torch's "
            "optimizer takes none.",
        }
        raises = [entry(name, f"{doc} {self.raises.get(name, '')}") for name, doc in raised.items()]
        function.__doc__ = docstring(
            prose,
            {
                "Args": "\n".join(args),
                "Returns": "\n".join(textwrap.wrap(returns, width=84)),
                "Raises": "\n".join(raises),
            },
        )


def _check_knobs(name: str, arguments: Arguments) -> None:
    """torch's knobs that cannot mean anything here, refused in words."""
    if arguments.get("differentiable", False):
        raise ValueError(
            f"{name}(differentiable=True) is not supported: lucid's functions are pure JAX "
            "functions, so differentiate through them with jax.grad instead."
        )
    for knob in ("grad_scale", "found_inf"):
        if arguments.get(knob) is not None:
            raise ValueError(
                f"{name}({knob}=...) is not supported: torch uses grad_scale and found_inf in "
                "its fused kernels only (mixed-precision gradient scaling); unscale the "
                "gradients before the call, and skip it where they are not finite."
            )
