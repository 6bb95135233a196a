"""Each optimizer's signature and argument docs are written once and reach both forms.

``lucid.functional.<name>`` and ``lucid.optim.<Class>`` are built from one
``Signature`` (``lucid/functional/_signature.py``): these tests hold both forms to
torch's constructor (keywords, kinds, defaults, what a call that does not fit
raises, what a positional call binds) and to each other (every keyword described,
in the same words, in both docstrings).
"""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import pytest
import torch
from _docstrings import entry_texts, sections
from oracle import assert_signature_is_torchs

import lucid
import lucid.functional as LF
from lucid.optim._registry import entry_of, registered


def _forms() -> dict[str, str]:
    """Every lucid optimizer class built from a torch.optim signature, with its functional
    form (found by that signature, so a new optimizer is covered without listing it).
    pytorch_optimizer's classes, which lucid.optim also holds (SOAP, Shampoo), are checked
    against their package in their own test modules (tests/test_soap.py, test_shampoo.py)."""
    others = {e.signature for e in registered() if e.reference == "pytorch_optimizer"}
    factories = {
        getattr(LF, name).torch_signature: name
        for name in LF.__all__
        if hasattr(getattr(LF, name), "torch_signature")
        and getattr(LF, name).torch_signature not in others
    }
    forms = {}
    for name in lucid.optim.__all__:
        signature = getattr(getattr(lucid.optim, name), "torch_signature", None)
        if signature is not None and signature not in others:
            forms[name] = factories.pop(signature)
    assert not factories, f"functional forms without a class: {factories}"
    return forms


FORMS = _forms()


def _reference(name: str) -> type:
    """The class lucid.optim's ``name`` reproduces: torch.optim's, or another package's
    (kron-torch's ``Kron``, which lucid.optim holds beside torch's)."""
    package = entry_of(getattr(lucid.optim, name)).reference
    if package == "torch.optim":
        return getattr(torch.optim, name)
    module = pytest.importorskip({"kron-torch": "kron_torch"}[package])
    return getattr(module, name)


def test_every_optimizer_of_torch_213_has_both_forms():
    expected = {name for name in dir(torch.optim) if name[0].isupper()} - {
        "Optimizer",
        "lr_scheduler",
        "swa_utils",
    }
    torchs = {n for n in FORMS if entry_of(getattr(lucid.optim, n)).reference == "torch.optim"}
    assert torchs == expected


def _args(doc: str) -> dict[str, str]:
    """A docstring's ``Args`` entries, ``{name: description}``."""
    found = sections(doc)
    assert "Args" in found, "no Args: section"
    return entry_texts(found["Args"])


def _param(shape: tuple[int, ...] = (2, 2)) -> tuple[lucid.Parameter, torch.Tensor]:
    return lucid.Parameter(jnp.ones(shape)), torch.ones(shape, requires_grad=True)


@pytest.mark.parametrize("name", FORMS)
def test_both_forms_have_torchs_keywords_kinds_and_defaults(name):
    assert_signature_is_torchs(
        getattr(lucid.optim, name), _reference(name), getattr(LF, FORMS[name])
    )


@pytest.mark.parametrize("name", FORMS)
def test_every_keyword_is_described_in_the_same_words_in_both_docstrings(name):
    cls, factory = getattr(lucid.optim, name), getattr(LF, FORMS[name])
    keywords = list(inspect.signature(factory).parameters)
    class_args = _args(inspect.getdoc(cls))
    factory_args = _args(inspect.getdoc(factory))
    assert list(class_args) == ["params", *keywords]
    assert list(factory_args) == keywords
    for keyword in keywords:
        assert class_args[keyword] == factory_args[keyword] and len(class_args[keyword]) > 10


@pytest.mark.parametrize("name", FORMS)
def test_an_unknown_keyword_raises_torchs_type_error(name):
    w, tw = _param()
    with pytest.raises(TypeError) as theirs:
        _reference(name)([tw], not_an_option=1)
    with pytest.raises(TypeError) as ours:
        getattr(lucid.optim, name)([w], not_an_option=1)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match=rf"^{FORMS[name]}\(\) got an unexpected keyword"):
        getattr(LF, FORMS[name])(not_an_option=1)


def _distinct_values(defaults: list) -> list:
    """A valid value for each positional option, different from its default and from
    every other option's value, so that an argument bound to the wrong name shows
    (numbers move by a small amount that keeps torch's ranges; flags and ``None`` stay)."""

    def moved(value: float, i: int) -> float:  # towards 0 below 1, away from it above
        if not value:
            return (i + 1) * 1e-3
        step = (i + 1) * 1e-3
        return value * (1 + step) if abs(value) >= 1 else value * (1 - step)

    values = []
    for i, default in enumerate(defaults):
        if isinstance(default, bool) or default is None or isinstance(default, str):
            values.append(default)
        elif isinstance(default, int):
            values.append(default + i + 1)
        elif isinstance(default, float):
            values.append(moved(default, i))
        elif isinstance(default, tuple):
            values.append(tuple(v if v is None else moved(v, i) for v in default))
        else:
            values.append(default)
    return values


@pytest.mark.parametrize("name", FORMS)
def test_positional_arguments_bind_as_in_torch(name):
    """Every positional keyword given by position lands in the group under torch's name
    (each given a value of its own, so two swapped positions fail)."""
    positional = [
        p
        for p in inspect.signature(_reference(name).__init__).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "params")
    ]
    values = _distinct_values([p.default for p in positional])
    numbers = [v for v in values if not isinstance(v, bool | type(None) | str)]
    assert len(set(map(repr, numbers))) == len(numbers) and numbers != [
        p.default for p in positional if not isinstance(p.default, bool | type(None) | str)
    ]
    w, tw = _param()
    ours = getattr(lucid.optim, name)([w], *values).param_groups[0]
    theirs = _reference(name)([tw], *values).param_groups[0]
    for p, value in zip(positional, values):
        mine, reference = ours[p.name], theirs[p.name]
        if p.name == "preconditioner_update_probability":  # kron-torch's schedule object
            from lucid.functional.kron import as_schedule

            reference = as_schedule(reference)
        assert mine == reference, p.name
        if value is not None:  # None: an option torch derives (LBFGS's max_eval)
            assert ours[p.name] == value, p.name


def test_a_list_of_betas_is_stored_as_torchs_tuple():
    w, tw = _param()
    ours = lucid.optim.Adam([w], betas=[0.8, 0.9]).param_groups[0]["betas"]
    theirs = torch.optim.Adam([tw], betas=[0.8, 0.9]).param_groups[0]["betas"]
    assert ours == theirs and type(ours) is type(theirs) is tuple


def test_lbfgs_fills_max_eval_as_torch():
    w, tw = _param()
    ours = lucid.optim.LBFGS([w], max_iter=8).param_groups[0]["max_eval"]
    assert ours == torch.optim.LBFGS([tw], max_iter=8).param_groups[0]["max_eval"] == 10


def test_adamw_sets_decoupled_weight_decay_without_taking_it():
    w, tw = _param()
    assert "decoupled_weight_decay" not in inspect.signature(lucid.optim.AdamW).parameters
    ours = lucid.optim.AdamW([w]).param_groups[0]
    assert ours["decoupled_weight_decay"] is True
    assert ours == {**torch.optim.AdamW([tw]).param_groups[0], "params": [w]}
