"""A lucid optimizer class's constructor and docstring, from its rule's torch signature.

``@torch_optimizer(ADAM_SIGNATURE)`` on ``class Adam(Optimizer)`` gives the class
``__init__(self, params, <torch's keywords>)`` (its ``inspect.signature`` is torch's)
and completes the class docstring with ``Args`` (``params``, then every keyword's
meaning), ``Raises`` and the ``Examples`` of the signature: the same `Signature` the
functional form is made from, so neither the keyword list nor its descriptions are
written twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ..functional._signature import Signature, docstring, entry
from ._registry import register
from .optimizer import Optimizer, ParamsT

OptimizerType = TypeVar("OptimizerType", bound=type[Optimizer])

PARAMS_DOC = entry(
    "params",
    "the parameters to optimize: `lucid.Parameter`s, `(name, Parameter)` pairs, or "
    'parameter groups, dicts such as `{"params": [...], "lr": 0.1}` whose options '
    "override the defaults below for their parameters.",
)


def torch_optimizer(
    signature: Signature,
    *,
    step_example: bool = True,
    reference: str = "torch.optim",
    saved: tuple[str, ...] = (),
) -> Callable[[OptimizerType], OptimizerType]:
    """Give an `Optimizer` subclass torch's constructor.

    The constructor binds its arguments to ``signature`` (Python's ``TypeError``
    for a call that does not fit), passes the options to
    ``Optimizer.__init__`` as the defaults, then calls the class's
    ``constructed()`` for the checks and state torch makes at construction. The
    class keeps ``signature`` as its ``torch_signature``.

    Args:
      signature: the optimizer's torch signature and argument docs.
      step_example: show the signature's one-step example (`opt.step()` after
        setting `w.grad`); `False` for an optimizer whose step needs more (LBFGS's
        closure), whose docstring then brings its own `Examples:`.
      reference: the package whose signature and numbers the class reproduces
        (`lucid.optim._registry.REFERENCES`); the class is recorded in the registry.
      saved: the options every state_dict of the class holds in each group, in every
        version of the reference (torch's group keys less those its `__setstate__`
        fills in): `load_state_dict` refuses a group without one of them as another
        optimizer's.

    Returns:
      A class decorator.
    """

    def decorate(cls: OptimizerType) -> OptimizerType:
        def __init__(self: Optimizer, params: ParamsT, *args: Any, **kwargs: Any) -> None:
            options = signature.bind(f"{cls.__name__}.__init__", args, kwargs)
            super(cls, self).__init__(params, options)
            self.constructed()

        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        __init__.__module__ = cls.__module__
        __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                inspect.Parameter(
                    "params", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ParamsT
                ),
                *signature.parameters,
            ],
            return_annotation=None,
        )
        cls.__init__ = __init__
        cls.torch_signature = signature
        register(cls, signature, reference, saved)
        sections = {
            "Args": PARAMS_DOC + "\n" + signature.args_doc(),
            "Raises": signature.raises_doc(),
        }
        if step_example:
            sections["Examples"] = signature.example.optimizer(cls.__name__)
        cls.__doc__ = docstring(cls.__doc__ or "", sections)
        return cls

    return decorate
