"""Each optimizer's torch signature and argument docs, written once.

An optimizer exists in two forms, ``lucid.functional.adam(...)`` (an optax
transform) and ``lucid.optim.Adam(params, ...)`` (torch's stateful class),
with torch's keyword list, kinds and defaults. Both are derived from one
`Signature`: its `Arg`s give each keyword's default, type and meaning; `bind`
turns a call's arguments into the option dict the rule reads
(explicitly, through `inspect.Signature.bind`); `args_doc` writes the Google
`Args:` entries of both docstrings; an `Example` written once is shown (and
doctested) in both forms, printing the same numbers.

The descriptions every optimizer shares are written once below, as torch
shares its `_maximize_doc` and friends.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import optax

from ._apply import transform
from .rule import Rule

Options = dict[str, Any]

INDENT = "  "


@dataclasses.dataclass(frozen=True)
class Arg:
    """One keyword of a torch.optim constructor.

    Attributes:
      name: torch's keyword.
      default: torch's default.
      annotation: the type shown in the signature.
      doc: what the argument means, tied to the rule's symbols (one paragraph,
        Markdown).
      convert: applied to the bound value in both forms (``betas`` given as a
        list becomes a tuple, as torch stores it).
      extension: a keyword lucid adds to the reference's signature (keyword-only,
        its default the reference's behaviour): a state_dict's group leaves it out
        while it holds its default, so a checkpoint made without it is the
        reference's, key for key (a group loaded without it takes the default).
    """

    name: str
    default: Any
    annotation: Any
    doc: str
    convert: Callable[[Any], Any] | None = None
    extension: bool = False


class _KeywordOnly:
    def __repr__(self) -> str:
        return "KEYWORD_ONLY"


KEYWORD_ONLY = _KeywordOnly()
"""Marks where torch's signature starts its keyword-only arguments (``*``)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One step on a tiny parameter, shown in both forms' docstrings.

    Both print ``result``: the transform's ``optax.apply_updates`` and the
    class's ``w.data`` after ``opt.step()``, rounded to 4 decimals.

    Attributes:
      kwargs: the keyword arguments written in the call (``"lr=0.1"``).
      param: the parameter's value as a Python literal (``"[1.0, -2.0]"``).
      grad: the gradient's value as a Python literal.
      result: the updated parameter as jax prints it, rounded to 4 decimals.
    """

    kwargs: str
    param: str
    grad: str
    result: str

    def transform(self, factory: str) -> str:
        """The doctest for ``lucid.functional.<factory>``."""
        return "\n".join(
            [
                ">>> import jax, jax.numpy as jnp, optax, lucid.functional as LF",
                f'>>> params = {{"w": jnp.array({self.param})}}',
                f">>> tx = LF.{factory}({self.kwargs})",
                ">>> state = tx.init(params)",
                f'>>> grads = {{"w": jnp.array({self.grad})}}',
                ">>> updates, state = jax.jit(tx.update)(grads, state, params)",
                '>>> optax.apply_updates(params, updates)["w"].round(4)',
                self.result,
            ]
        )

    def optimizer(self, cls: str) -> str:
        """The doctest for ``lucid.optim.<cls>``."""
        return "\n".join(
            [
                ">>> import jax.numpy as jnp, lucid",
                f">>> w = lucid.Parameter(jnp.array({self.param}))",
                f">>> opt = lucid.optim.{cls}([w]{', ' + self.kwargs if self.kwargs else ''})",
                f">>> w.grad = jnp.array({self.grad})",
                ">>> opt.step()",
                ">>> w.data.round(4)",
                self.result,
            ]
        )


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Signature:
    """torch's constructor signature of one optimizer, and what each argument means.

    Attributes:
      args: the keywords in torch's order, with ``KEYWORD_ONLY`` where torch
        puts ``*``.
      fixed: options the optimizer always sets and does not take (AdamW's
        ``decoupled_weight_decay=True``).
      complete: fills options torch derives from others (LBFGS's ``max_eval``).
      example: the step both docstrings show.
    """

    args: tuple[Arg | _KeywordOnly, ...]
    example: Example
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    complete: Callable[[Options], Options] | None = None

    def keywords(self) -> list[Arg]:
        """The arguments, in torch's order."""
        return [arg for arg in self.args if isinstance(arg, Arg)]

    @functools.cached_property
    def parameters(self) -> tuple[inspect.Parameter, ...]:
        """The keywords as ``inspect.Parameter``s, of torch's kinds (built once)."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = []
        for arg in self.args:
            if arg is KEYWORD_ONLY:
                kind = inspect.Parameter.KEYWORD_ONLY
                continue
            parameters.append(
                inspect.Parameter(arg.name, kind, default=arg.default, annotation=arg.annotation)
            )
        return tuple(parameters)

    @functools.cached_property
    def _binder(self) -> inspect.Signature:
        return inspect.Signature(self.parameters)

    def bind(self, owner: str, args: tuple, kwargs: Mapping[str, Any]) -> Options:
        """The options a call gives: its arguments bound to torch's keywords, defaults
        filled in, each ``convert``ed, ``fixed`` added and ``complete`` applied.

        Args:
          owner: the callable's name in an error (``"Adam.__init__"``).
          args: the positional arguments after any the callable takes first (``params``).
          kwargs: the keyword arguments.

        Returns:
          The options, one entry per keyword of torch's (plus ``fixed``).

        Raises:
          TypeError: the call does not fit the signature, in Python's words
            (``Adam.__init__() got an unexpected keyword argument 'foo'``).
        """
        try:
            bound = self._binder.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{owner}() {error}") from None
        bound.apply_defaults()
        options = dict(bound.arguments)
        for arg in self.keywords():
            if arg.convert is not None:
                options[arg.name] = arg.convert(options[arg.name])
        options.update(self.fixed)
        return self.complete(options) if self.complete is not None else options

    def args_doc(self) -> str:
        """The Google ``Args:`` entries for torch's keywords (without the header)."""
        return "\n".join(entry(arg.name, arg.doc) for arg in self.keywords())

    def raises_doc(self, also: str = "") -> str:
        """The Google ``Raises:`` entries every optimizer shares, then ``also``."""
        refused = ", or `differentiable=True`" if "differentiable" in self.names() else ""
        entries = [
            entry(
                "ValueError",
                f"torch's message for an invalid value (`Invalid learning rate: -1.0`){refused}.",
            ),
            entry(
                "TypeError",
                "an argument torch's signature does not take, or a hyper-parameter that is "
                "not a real number or one-element array.",
            ),
        ]
        return "\n".join(entries + ([also] if also else []))

    def names(self) -> list[str]:
        """torch's keywords, in order."""
        return [arg.name for arg in self.keywords()]

    def unsaved_defaults(self) -> dict[str, Any]:
        """lucid's `extension` keywords and their defaults: a state_dict's group leaves
        each out while it holds its default."""
        return {arg.name: arg.default for arg in self.keywords() if arg.extension}


def entry(name: str, doc: str) -> str:
    """One Google-style entry, ``name: doc``, wrapped with its continuation indented."""
    wrapped = textwrap.wrap(f"{name}: {' '.join(doc.split())}", width=84)
    return "\n".join([wrapped[0], *(INDENT + line for line in wrapped[1:])])


def docstring(prose: str, sections: Mapping[str, str]) -> str:
    """``prose`` followed by Google sections (``{"Args": entries, ...}``).

    An ``Examples:`` section already in ``prose`` goes last: appended to the generated
    ``Examples`` (the last of ``sections``) when there is one.
    """
    prose = inspect.cleandoc(prose)
    own = re.search(r"^Examples?:\n", prose, flags=re.M)
    parts = [(prose[: own.start()] if own else prose).rstrip()]
    for title, body in sections.items():
        parts.append(f"{title}:\n{textwrap.indent(body, INDENT)}")
    if own and "Examples" in sections:
        parts[-1] += "\n\n" + prose[own.end() :].rstrip()
    elif own:
        parts.append(prose[own.start() :].rstrip())
    return "\n\n".join(parts)


_FACTORIES: dict[Signature, Callable[..., optax.GradientTransformation]] = {}


def record_factory(
    signature: Signature, factory: Callable[..., optax.GradientTransformation]
) -> None:
    """Record ``factory`` as the functional form made from ``signature`` (one each), for
    `factory_of` (``lucid.optim._registry``: a class's transform is the one of its signature)."""
    if _FACTORIES.setdefault(signature, factory) is not factory:
        raise ValueError(f"a second factory {factory.__name__!r} for one signature")


def factory_of(signature: Signature) -> Callable[..., optax.GradientTransformation] | None:
    """The functional form made from ``signature``, or ``None`` (a form with no transform,
    such as the Schedule-Free closure classes)."""
    return _FACTORIES.get(signature)


def transform_of(
    rule: Rule,
    signature: Signature,
    name: str,
    prose: str,
    *,
    raises: str = "",
) -> Callable[..., optax.GradientTransformation]:
    """The functional form: ``name(<torch's keywords>) -> optax.GradientTransformation``.

    Args:
      rule: the `Rule` the transform runs.
      signature: the optimizer's torch signature and argument docs.
      name: the function's name (``"adam"``).
      prose: the docstring's text before the generated sections (it may end
        with an ``Examples:`` section of its own, shown after the generated one).
      raises: ``Raises`` entries of this optimizer beyond every optimizer's (one
        Google entry, ``"IndexError: ..."``).

    Returns:
      A function whose ``inspect.signature`` is torch's keywords and whose
      docstring holds Args, Returns, Raises and Examples from ``signature``
      (kept as its ``torch_signature``).
    """

    def factory(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
        return transform(rule, signature.bind(name, args, kwargs))

    factory.__name__ = factory.__qualname__ = name
    factory.torch_signature = signature  # type: ignore[attr-defined]
    factory.__module__ = rule.update.__module__
    factory.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        signature.parameters, return_annotation=optax.GradientTransformation
    )
    returns = (
        f"An `optax.GradientTransformation` whose state is an `{rule.state.__name__}`, each "
        "field a "
        "pytree shaped like the parameters (`None` for a field the options switch off)."
    )
    factory.__doc__ = docstring(
        prose,
        {
            "Args": signature.args_doc(),
            "Returns": "\n".join(textwrap.wrap(returns, width=84)),
            "Raises": signature.raises_doc(raises),
            "Examples": signature.example.transform(name),
        },
    )
    record_factory(signature, factory)
    return factory


# -- descriptions every optimizer shares (torch's _maximize_doc and friends) --------------


def lr(default: Any, meaning: str = "learning rate γ") -> Arg:
    """``lr``: the learning rate (or what this optimizer makes of it)."""
    return Arg(
        "lr",
        default,
        Any,
        f"{meaning}: a float, a one-element array, or (in `lucid.functional` only) a "
        "schedule `step -> lr`.",
    )


def betas(
    default: tuple[Any, Any] = (0.9, 0.999),
    meaning: str = "(β₁, β₂): decay rates of the averages of the gradient (m) and of its "
    "square (v).",
    *,
    first_two: bool = False,
) -> Arg:
    """``betas``: the two averaging coefficients (Adam's by default), stored as a tuple.

    With ``first_two`` (torch 2.15's Adam and AdamW), a longer tuple or list keeps its
    first two entries; torch 2.13 stored it whole and failed at the first step."""
    if first_two:
        meaning += (
            " A longer tuple or list gives its first two entries (torch 2.15; torch 2.13 kept "
            "it whole and failed at the first step)."
        )

    def convert(value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        return tuple(value[:2]) if first_two else tuple(value)

    return Arg("betas", default, tuple[Any, Any], meaning, convert=convert)


def eps(default: Any, where: str) -> Arg:
    """``eps``: the term added for numerical stability, and where it is added."""
    return Arg("eps", default, Any, f"ε, added {where} for numerical stability.")


def weight_decay(default: Any, decoupled: bool | None = False) -> Arg:
    """``weight_decay``: L2 penalty added to the gradient, or decoupled decay."""
    coupled = "λ: L2 penalty, `g ← g + λ p` before the update"
    meaning = {
        False: coupled + ".",
        True: "λ: decoupled weight decay, `p ← p (1 - γ λ)` before the update.",
        None: coupled + " (or, with `decoupled_weight_decay`, `p ← p (1 - γ λ)`).",
    }[decoupled]
    return Arg("weight_decay", default, Any, meaning)


MAXIMIZE = Arg(
    "maximize", False, bool, "ascend the objective instead of descending (the gradient is negated)."
)
FOREACH = Arg(
    "foreach",
    None,
    bool | None,
    "torch's choice of multi-tensor kernels: accepted and ignored (XLA fuses the update).",
)
CAPTURABLE = Arg(
    "capturable",
    False,
    bool,
    "torch's CUDA-graph capture support: accepted and ignored (every lucid step is jit-able).",
)
DIFFERENTIABLE = Arg(
    "differentiable",
    False,
    bool,
    "torch's autograd through the step: `True` raises `ValueError` (differentiate "
    "lucid's pure update with `jax.grad` instead).",
)
FUSED = Arg("fused", None, bool | None, "torch's fused CUDA kernel: accepted and ignored.")
DECOUPLED_WEIGHT_DECAY = Arg(
    "decoupled_weight_decay",
    False,
    bool,
    "apply `weight_decay` to the parameter (`p ← p (1 - γ λ)`) instead of adding "
    "`λ p` to the gradient (AdamW's decay).",
)
