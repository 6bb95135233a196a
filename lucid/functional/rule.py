"""The contract every optimizer rule signs: torch's update for one parameter, and torch's
semantics around it.

A *rule* is torch.optim's update for a single parameter, written once:

$$(p_{t}, s_{t}) = \\mathrm{update}(p_{t-1}, g_t, s_{t-1}, h_t, \\mathit{flags}),
\\qquad s_0 = \\mathrm{init}(p_0, h_0, \\mathit{flags})$$

Everything above it (the optax transform over a pytree, the stateful `lucid.optim`
shell, the compiled and fused steps) calls the same rule, so each rule's math lives
once. What a rule is given:

* ``hyper`` ($h_t$) holds the float hyper-parameters as 0-d arrays in the *compute
  dtype* (float64 for float64 parameters, float32 otherwise), already resolved for
  this step, with ``one_minus_<name>`` for every name in `OptionSpec.complements`
  (``1 - beta`` computed in double precision on the host whenever the value is a
  Python number, as torch does);
* ``flags`` are static options (``amsgrad``, ``maximize``, ...): a change of flag is a
  change of program;
* ``param``, ``grad`` and the array fields of the state arrive upcast to the compute
  dtype and leave cast back to their storage dtype, so bfloat16 parameters are updated
  in float32 arithmetic and stored in bfloat16, like torch's opmath.

A rule is data: `Rule` (the math and torch's semantics, in four small specs) and
`Execution`, hints declared beside the math that only the code running a step reads.
Nothing here names a backend, a jax version or a sharding.

Examples:
  A rule of one line of math, run as an optax transform:

  >>> from typing import NamedTuple
  >>> import jax.numpy as jnp
  >>> from lucid.functional.rule import OptionSpec, Rule, transform
  >>> class PlainState(NamedTuple):
  ...     step: object
  >>> def update(p, g, state, h):  # p <- p - lr * g
  ...     return p - h["lr"] * g, PlainState(state.step + 1)
  >>> PLAIN = Rule(
  ...     name="Plain", state=PlainState,
  ...     options=OptionSpec(validate=lambda o: None, split=lambda o: ({"lr": o["lr"]}, {})),
  ...     init=lambda p, h: PlainState(jnp.zeros((), jnp.float32)), update=update)
  >>> tx = transform(PLAIN, {"lr": 0.5})
  >>> params = {"w": jnp.ones(2)}
  >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
  >>> updates["w"].tolist()
  [-0.5, -0.5]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from . import _validate

if TYPE_CHECKING:
    import optax

__all__ = [
    "Array",
    "Execution",
    "FieldSpec",
    "HyperValue",
    "OptionSpec",
    "Options",
    "Present",
    "Rule",
    "Schedule",
    "SparseSpec",
    "transform",
]

Array = jax.Array
Schedule = Callable[[Array], Array]
HyperValue = Any  # float | Array | Schedule
Options = Mapping[str, Any]


class Present(NamedTuple):
    """A sparse gradient laid out dense: its values (zero where it stores no entry) and
    the mask of the entries it stores (``present``), handed to `SparseSpec.masked_update`
    (a flat buffer holding a sparse gradient is one: a mask of ones over its other
    parameters' dense gradients)."""

    grad: Array
    present: Array


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """torch's keyword options of a rule: how they are checked and split.

    Attributes:
      validate: raises torch's ``ValueError`` for invalid options (at construction).
      split: maps torch's keyword options to ``(hyper, flags)``: the float
        hyper-parameters (runtime values) and the static options.
      complements: hyper-parameters whose ``1 - x`` the rule uses (``one_minus_<name>``).
      guarded: options (torch's names, ``eps[0]`` for an element of a pair) the rule
        keeps at its dtype's smallest normal number when they are nonzero and subnormal
        (a divisor's guard such as ``eps``), so that XLA's flush to zero
        does not turn torch's ``0 / eps`` into ``0 / 0``; every other nonzero option
        below float32's smallest normal warns when the options are checked.
      check_at_step: checks torch makes at a step rather than at construction (Muon's
        ``ns_steps``), run before every step moves anything.
    """

    validate: Callable[[Options], None]
    split: Callable[[Options], tuple[dict[str, HyperValue], dict[str, Any]]]
    complements: tuple[str, ...] = ()
    guarded: tuple[str, ...] = ()
    check_at_step: Callable[[Options], None] | None = None


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """The state's fields as torch's ``state_dict`` shows and starts them.

    Attributes:
      scalar: fields that are 0-d per parameter (``step``, ``eta``).
      optional: fields that exist only while a flag is on, mapped to that flag
        (``{"max_exp_avg_sq": "amsgrad"}``). torch creates them with the rest of the
        state; turning the flag on once the state exists raises torch's ``KeyError``
        unless ``start_optional`` starts the field, and turning it off keeps the field
        untouched.
      start_optional: ``start_optional(state, param, flags) -> state`` starts an optional
        field whose flag came on after the state was made, where torch does (SGD's
        momentum buffer begins from the raw gradient); ``None`` where torch raises.
      hidden: fields lucid keeps that torch's state_dict does not show, mapped to the
        value each takes when a state is loaded from a checkpoint (SGD's ``step``, which
        only tells a new momentum buffer from a started one).
    """

    scalar: tuple[str, ...] = ("step",)
    optional: Mapping[str, str] = dataclasses.field(default_factory=dict)
    start_optional: Callable[..., Any] | None = None
    hidden: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SparseSpec:
    """A rule's update for sparse gradients, for the rules torch gives them (SGD,
    Adagrad, SparseAdam; LBFGS, which torch densifies). A rule without one refuses a
    sparse gradient with torch's ``RuntimeError``.

    Attributes:
      update: the update for a ``jax.experimental.sparse`` gradient, called as
        `Rule.update` is.
      masked_update: ``masked_update(param, grad, present, state, hyper, **flags)``, the
        sparse update for a sparse gradient given dense, with the mask of its stored
        entries (a `Present` gradient), for the rules whose sparse numbers are not the
        dense ones: where a sparse gradient stores no entry nothing changes, where it
        stores a zero the rule runs (Adagrad's ``0/0`` with ``eps=0``, SparseAdam's decay
        of its moments). ``None``: the dense update gives the sparse numbers (SGD).
      check_options: raises torch's ``RuntimeError`` for options a sparse gradient cannot
        be combined with (``weight_decay`` for SGD and Adagrad).
    """

    update: Callable[..., tuple[Array, Any]]
    masked_update: Callable[..., tuple[Array, Any]] | None = None
    check_options: Callable[[Options], None] | None = None


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a rule's update may be run, declared beside its math and read only by the code
    that runs steps (the transform's `apply_leaves` and `lucid.optim`'s engine). A hint
    never changes a number: each is tested against the per-parameter update it stands in
    for.

    Attributes:
      elementwise: the update is elementwise math, so it may run on several parameters
        laid end to end in one flat buffer. ``False`` for rules that reduce over a
        parameter or treat it as a matrix (Adafactor's row and column statistics, Muon's
        Newton-Schulz iteration): each parameter is then updated as itself, and its state
        fields may have shapes of their own.
      batched: (for a rule that is not elementwise) same-shaped parameters may be updated
        in one call under ``jax.vmap`` (Muon's Newton-Schulz products over a model's
        matrices become one batched matrix product per shape). Declare it only for an
        update whose numbers do not change under ``jax.vmap``.
      own_kernel: on an accelerator the update runs a fused kernel of its own per
        parameter (bitsandbytes' 8-bit step), into which a stacked batch would only be
        copied: ``batched`` then holds only where no such kernel runs.
      blocks: for a rule that is not elementwise but treats a parameter's flattened value
        as independent blocks (bitsandbytes' and torchao's block-wise state), so that
        parameters may still share a flat buffer: ``blocks(value, flags, state) -> (block,
        flags_override)`` for a parameter whose array is ``value`` (its size and dtype are
        read; ``state`` is its state, or ``None`` before its first step), its size a
        multiple of ``block``: parameters of one block and override are laid end to end
        and updated as one array under the group's flags updated by ``flags_override``,
        each state field kept with one entry per ``k`` elements (1 for a field shaped as
        the parameter; a per-block scale, ``block``; two 4-bit codes a byte, 2). Returns
        ``None`` for a parameter that must be updated alone (a reduction over it: LAMB's
        trust ratio; a partial last block, which a neighbour would fill; a per-parameter
        random key).
      fusion_sensitive: laid out by ``blocks``, the update's numbers equal the
        per-parameter ones only on an XLA that keeps its fusions apart (that of
        jax 0.10 or later); elsewhere each parameter keeps its own buffer.
      whole_per_device: (for a rule that is not elementwise) with state sharded over
        devices (``shard_state_over``), same-shaped parameters are dealt out whole to the
        devices, each device updating its own (under ``jax.vmap`` where ``batched``
        holds, else one by one) with no collective inside the update, rather than every
        parameter cut by rows with the collectives a product over cut rows needs: for an
        update whose work is matrix products and decompositions over the whole parameter
        (Muon's Newton-Schulz iteration; SOAP's, Shampoo's and Kron's preconditioners).
    """

    elementwise: bool = True
    batched: bool = False
    own_kernel: bool = False
    blocks: Callable[[Array, Mapping[str, Any], Any], tuple[int, dict] | None] | None = None
    fusion_sensitive: bool = False
    whole_per_device: bool = False


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Rule:
    """One torch.optim update rule: its math and torch's semantics around it.

    Attributes:
      name: torch's class name (``"Adam"``).
      state: the NamedTuple type of the state; its fields are torch's state names. A
        field that an option switches off (``max_exp_avg_sq`` without ``amsgrad``) holds
        ``None``.
      options: torch's keyword options: their checks and their split into ``(hyper,
        flags)`` (`OptionSpec`).
      init: ``init(param, hyper, **flags) -> state`` for one parameter.
      update: ``update(param, grad, state, hyper, **flags) -> (param, state)``.
      fields: the state's fields as torch's state_dict shows and starts them
        (`FieldSpec`).
      sparse: the update for sparse gradients (`SparseSpec`), ``None`` where torch
        refuses them.
      supports_complex: whether torch runs this rule on complex parameters (on their
        real view, ``(..., 2)``: real and imaginary parts are two reals).
      storage_dtype: ``update`` also receives ``storage_dtype=`` (the dtype the parameter
        is stored in, before the upcast to the compute dtype), for a rule whose math
        depends on it (Adafactor's default ``eps1`` is that dtype's machine epsilon).
      execution: how the update may be run (`Execution`), read only by the code that
        runs steps.
    """

    name: str
    state: type
    options: OptionSpec
    init: Callable[..., Any]
    update: Callable[..., tuple[Array, Any]]
    fields: FieldSpec = FieldSpec()
    sparse: SparseSpec | None = None
    supports_complex: bool = True
    storage_dtype: bool = False
    execution: Execution = Execution()

    def split(self, options: Options) -> tuple[dict[str, HyperValue], dict[str, Any]]:
        """torch's keyword options as ``(hyper, flags)`` (`OptionSpec.split`)."""
        return self.options.split(options)

    def check(self, options: Options, *, schedules: bool = False, warn: bool = True) -> None:
        """Every check of a group's options, before anything uses them: torch's value
        checks (`OptionSpec.validate`), then every float hyper-parameter a real scalar.

        Args:
          options: a group's options, torch's keywords.
          schedules: whether a hyper-parameter may be a schedule (the functional
            transforms: yes; `lucid.optim`'s groups, read as host numbers: no).
          warn: warn about values XLA flushes to zero: when a transform or optimizer is
            made, a group added or loaded; not at every step.

        Raises:
          ValueError: torch's conditions (``Invalid learning rate: -1.0``,
            ``Tensor lr must be 1-element``).
          TypeError: a hyper-parameter that is not a real number or one-element array.

        Warns:
          UserWarning: (with ``warn``) a nonzero option below float32's smallest normal
            number, which XLA flushes to zero, naming the option and its value.
        """
        self.options.validate(options)
        _validate.hypers(self.split(options)[0], schedules=schedules)
        if warn:
            _validate.flushed(options, self.name, self.options.guarded)

    def check_step(self, options: Options) -> None:
        """`check`, and the checks torch makes only when stepping
        (`OptionSpec.check_at_step`)."""
        self.check(options, warn=False)
        if self.options.check_at_step is not None:
            self.options.check_at_step(options)


def transform(rule: Rule, options: Options) -> optax.GradientTransformation:
    """``rule`` with torch's keyword ``options`` as an optax transformation (every
    ``lucid.functional`` optimizer is one: ``adam(...)`` is ``transform(ADAM, ...)`` with
    its signature's defaults).

    ``init(params)`` builds the state NamedTuple whose fields are pytrees shaped like
    ``params``; ``update(grads, state, params)`` evaluates schedules at the number of
    updates done so far, applies the rule to every leaf and returns ``new_params -
    params`` as the update (so ``optax.apply_updates`` lands on torch's new parameters),
    0 where a parameter stays as it was (an infinite one included).

    Raises:
      ValueError, TypeError: the options fail `Rule.check` (and
        `OptionSpec.check_at_step`: a transform has no later moment to refuse at).
    """
    from ._apply import transform as _transform

    return _transform(rule, options)
