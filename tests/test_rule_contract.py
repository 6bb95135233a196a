"""`lucid.functional.rule` is the public contract every rule signs: the math and torch's
semantics in at most ten fields, execution hints beside them, and nothing of the engine
in `lucid/functional` (no backend names, jax-version gates or sharding arguments: those
are decided in `lucid._platform` and the engine)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

import lucid.functional as F
from lucid import _platform
from lucid.functional import rule as rule_module
from lucid.functional.rule import Execution, Rule
from lucid.optim._registry import registered

FUNCTIONAL = pathlib.Path(F.__file__).parent
SOURCES = sorted(FUNCTIONAL.rglob("*.py"))
# what only the code that runs steps may read: which backend it runs on, which jax
GATES = {"default_backend", "__version_info__", "version_info", "devices", "local_devices"}
# a sharding handed to a rule or to the math that applies it
SHARDING_ARGUMENTS = {"places", "sharding", "shardings", "mesh", "shard_state_over"}


def test_a_rule_has_at_most_ten_fields_and_each_is_documented():
    fields = [field.name for field in dataclasses.fields(Rule)]
    assert len(fields) <= 10, fields
    doc = Rule.__doc__ or ""
    missing = [name for name in fields if f"  {name}:" not in doc]
    assert not missing, f"Rule's docstring does not describe {missing}"


def test_the_contract_is_a_public_module_that_exports_only_its_api():
    assert F.rule is rule_module and F.Rule is Rule
    names = {name for name in vars(rule_module) if not name.startswith("_")}
    exported = set(rule_module.__all__)
    assert exported <= names
    assert all(not name.startswith("_") for name in exported)
    assert {"Rule", "OptionSpec", "FieldSpec", "SparseSpec", "Execution", "Present"} <= exported


def test_execution_hints_name_no_backend_and_no_jax_version():
    """The hints are facts about the math (elementwise, batched, ...); where each holds is
    `lucid._platform`'s decision."""
    for entry in registered():
        hints = entry.rule.execution
        assert isinstance(hints, Execution), entry.name
        values = [getattr(hints, field.name) for field in dataclasses.fields(hints)]
        assert not any(isinstance(value, str | tuple) for value in values), entry.name


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(FUNCTIONAL)))
def test_the_functional_layer_reads_no_platform_no_jax_version_and_takes_no_sharding(path):
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in GATES:
            found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.arg) and node.arg in SHARDING_ARGUMENTS:
            found.append(f"line {node.lineno}: argument {node.arg!r}")
    assert not found, f"{path.name} decides what only lucid._platform or the engine may: {found}"


def test_the_platform_gates_decide_batching_from_the_hints(monkeypatch):
    """`own_kernel` turns batching off only where rules' kernels run."""
    kernel = Execution(elementwise=False, batched=True, own_kernel=True)
    plain = Execution(elementwise=False, batched=True)
    monkeypatch.setattr(_platform.jax, "default_backend", lambda: "gpu")
    assert not _platform.batches(kernel) and _platform.batches(plain)
    monkeypatch.setattr(_platform.jax, "default_backend", lambda: "cpu")
    assert _platform.batches(kernel) and _platform.batches(plain)
    assert not _platform.batches(Execution())


def test_a_fusion_sensitive_rule_lays_blocks_flat_only_where_xla_keeps_them_exact(monkeypatch):
    def blocks(value, flags, state):
        return (256, {})

    sensitive = Execution(elementwise=False, blocks=blocks, fusion_sensitive=True)
    robust = Execution(elementwise=False, blocks=blocks)
    for exact in (True, False):
        monkeypatch.setattr(_platform, "FLAT_EXACT", exact)
        assert _platform.flat_blocks(sensitive) is exact
        assert _platform.flat_blocks(robust)
    assert not _platform.flat_blocks(Execution())
