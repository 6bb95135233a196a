"""The registry of optimizer classes (``lucid.optim._registry``) feeds everything else.

Every class declared with ``@torch_optimizer`` is recorded there with its rule, its
signature, its functional form and its reference package. The exports, the docs' tables and
the tests' tables must list exactly the registry's optimizers: where a list is derived
from the registry (``tests/cases.py``'s ``functional``, ``compile_optimizer``'s classes) it
cannot drift; where it is data only a person can write (option sets, bad values), this
module checks it names every registered optimizer of its package, or gives, here, the
reason it leaves one out. Adding an optimizer therefore fails here, naming each table
still to fill in (``lucid/optim/_registry.py`` lists the places).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

import lucid
import lucid.functional
import lucid.functional.bnb
import lucid.functional.schedulefree
import lucid.functional.torchao
import lucid.optim.bnb
import lucid.optim.schedulefree
import lucid.optim.torchao
from lucid.optim._registry import REFERENCES, named, registered

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def _names(reference: str) -> set[str]:
    return {entry.name for entry in registered(reference)}


def _literal_names(path: Path, variable: str) -> list[str]:
    """The optimizer names a module-level table of a test file lists, read from its source
    (the test module is not imported): a dict's keys, or the first item of each entry of
    a list of names or of tuples (``*OTHER`` entries are followed)."""
    tree = ast.parse(path.read_text())
    tables = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }

    def names(value: ast.expr) -> list[str]:
        if isinstance(value, ast.Dict):
            return [key.value for key in value.keys if isinstance(key, ast.Constant)]
        if isinstance(value, ast.BinOp):
            return names(value.left) + names(value.right)
        if isinstance(value, ast.Name):
            return names(tables[value.id])
        found = []
        for item in value.elts:
            if isinstance(item, ast.Starred):
                found += names(tables[item.value.id])
            elif isinstance(item, ast.Constant):
                found.append(item.value)
            elif isinstance(item, ast.Tuple) and isinstance(item.elts[0], ast.Constant):
                found.append(item.elts[0].value)
        return found

    assert variable in tables, f"{path.name} has no table {variable}"
    return names(tables[variable])


@dataclasses.dataclass(frozen=True)
class Table:
    """A hand-kept table of a test file, and the registered optimizers it leaves out, each
    with the reason."""

    path: str
    variable: str
    reference: str = "torch.optim"
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)

    def listed(self) -> set[str]:
        return set(_literal_names(TESTS / self.path, self.variable))


SPECIAL = {
    "SparseAdam": "lazy updates at a sparse gradient's entries: tests/test_sparse_adam.py",
    "LBFGS": "a closure and inner iterations: tests/test_lbfgs.py",
    "Muon": "2-D parameters only: tests/test_muon.py",
}
NO_EPS = "no eps to guard"
TABLES = [
    Table("cases.py", "CASES", left_out=SPECIAL),
    Table(
        "test_validation.py",
        "HYPERS",
        left_out={
            "Adafactor": "torch's own error inputs for it are replayed by "
            "tests/test_torch_error_inputs.py (a gap here)",
            "Muon": "torch's own error inputs for it are replayed by "
            "tests/test_torch_error_inputs.py (a gap here)",
        },
    ),
    Table(
        "test_bad_input.py",
        "SPARSE_CASES",
        left_out={
            "LBFGS": "reads a sparse gradient densified, with a closure: its own test there",
            "Adafactor": "no sparse case yet (a gap: docs/bad_input.md promises torch's error)",
            "Muon": "no sparse case yet (a gap: 2-D parameters only, the table's are 1-D)",
        },
    ),
    Table(
        "test_nonfinite.py",
        "GUARDED",
        left_out={
            "SGD": NO_EPS,
            "ASGD": NO_EPS,
            "Rprop": NO_EPS,
            "LBFGS": NO_EPS,
            "SparseAdam": "no subnormal-eps case yet (a gap)",
        },
    ),
    Table("test_nonfinite.py", "FLUSHED"),
    Table("test_schedulefree.py", "ALL", reference="schedulefree"),
]
# tables that are a sample on purpose: every name must be a registered optimizer
SAMPLES = [Table("test_bad_input.py", "OPTIMIZERS")]


@pytest.mark.parametrize("table", TABLES, ids=lambda t: f"{t.path}:{t.variable}")
def test_a_test_table_lists_exactly_the_registry(table):
    listed, registry = table.listed(), _names(table.reference)
    assert not set(table.left_out) - registry, "a reason given for an unregistered name"
    assert not set(table.left_out) & listed, "a name left out with a reason is listed"
    missing = registry - listed - set(table.left_out)
    assert not missing, f"{table.path}'s {table.variable} lacks {sorted(missing)}"
    assert not listed - registry, f"{table.path}'s {table.variable} names unregistered classes"
    assert all(reason.strip() for reason in table.left_out.values())


@pytest.mark.parametrize("table", SAMPLES, ids=lambda t: f"{t.path}:{t.variable}")
def test_a_sample_names_only_registered_optimizers(table):
    assert table.listed() and table.listed() <= _names(table.reference)


def test_the_bitsandbytes_cases_cover_every_family():
    """test_bnb.py's trajectories run one or more classes of each bitsandbytes family
    (the paged and 8/32-bit variants of a family share its kernels; every class's
    signature is checked against bitsandbytes' there)."""

    def family(name: str) -> str:
        return name.removeprefix("Paged").removesuffix("8bit").removesuffix("32bit")

    listed = set(_literal_names(TESTS / "test_bnb.py", "CASES"))
    assert listed <= _names("bitsandbytes")
    assert {family(n) for n in listed} == {family(n) for n in _names("bitsandbytes")}


def test_the_stateful_machines_run_every_class_of_the_cases():
    """The two state machines take their classes from tests/cases.py (checked above), less
    what the first does not drive yet."""
    import test_stateful_torch
    import test_stateful_twins

    cases = set(_literal_names(TESTS / "cases.py", "CASES"))
    assert set(test_stateful_twins.CLASSES) == cases
    assert set(test_stateful_torch.CLASSES) == cases - {"Adafactor"}
    assert {"Adafactor"} == test_stateful_torch.NOT_DRIVEN  # a gap, not a reason


def test_the_table_reader_reads_tables():
    """The source reader finds the names a table lists (a reader that found nothing would
    pass the tests above only if the registry were empty too)."""
    assert {"SGD", "Adafactor"} <= set(_literal_names(TESTS / "cases.py", "CASES"))
    assert "SGDScheduleFreeClosure" in _literal_names(TESTS / "test_schedulefree.py", "ALL")
    assert len(_names("torch.optim")) == 15


# ------------------------------------------------------------------ exports


PACKAGES = {
    "torch.optim": (lucid.optim, lucid.functional),
    "bitsandbytes": (lucid.optim.bnb, lucid.functional.bnb),
    "torchao": (lucid.optim.torchao, lucid.functional.torchao),
    "schedulefree": (lucid.optim.schedulefree, lucid.functional.schedulefree),
    # kron-torch's Kron and pytorch_optimizer's SOAP and Shampoo sit beside torch's
    # optimizers, as their names do not clash
    "kron-torch": (lucid.optim, lucid.functional),
    "pytorch_optimizer": (lucid.optim, lucid.functional),
}


def test_every_package_of_the_registry_has_its_namespaces():
    assert set(PACKAGES) == set(REFERENCES)


@pytest.mark.parametrize("reference", REFERENCES)
def test_each_registered_class_and_its_transform_are_exported(reference):
    """Each class is exported by its package's namespace (in ``__all__``, the same
    object), and so is its functional form; and the namespace holds no optimizer class the
    registry does not know."""
    classes, transforms = PACKAGES[reference]
    for entry in registered(reference):
        assert entry.name in classes.__all__ and getattr(classes, entry.name) is entry.cls
        if entry.transform is not None:
            name = entry.transform.__name__
            assert name in transforms.__all__ and getattr(transforms, name) is entry.transform
    shares = {ref for ref, spaces in PACKAGES.items() if spaces[0] is classes}
    exported = {
        name
        for name in classes.__all__
        if isinstance(getattr(classes, name), type)
        and issubclass(getattr(classes, name), lucid.optim.Optimizer)
        and getattr(classes, name).rule is not None
        and getattr(classes, name).torch_signature is not None
    }
    # a namespace several packages share (lucid.optim: torch.optim's, kron-torch's and
    # pytorch_optimizer's classes) holds exactly their classes together
    assert exported == set().union(*(_names(ref) for ref in shares))


def test_a_transform_is_the_form_of_its_class():
    """The registry's transform of a class takes the class's keywords (all but ``params``),
    and every class of torch.optim, bitsandbytes and torchao has one."""
    import inspect

    for entry in registered():
        if entry.transform is None:
            assert entry.reference == "schedulefree" and entry.name.endswith("Closure")
            continue
        keywords = list(inspect.signature(entry.cls).parameters)[1:]
        assert list(inspect.signature(entry.transform).parameters) == keywords
    assert named("AdamW").transform is lucid.functional.adamw


# ------------------------------------------------------------------ the docs


def _table(page: str, header: str) -> list[list[str]]:
    """The body rows (cells) of the table of ``docs/<page>`` whose header row starts with
    ``header``."""
    lines = (ROOT / "docs" / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _code_names(cell: str, links_only: bool = False) -> set[str]:
    """The identifiers in a cell's code spans (last dotted part), or only those of links."""
    pattern = r"\[`([\w.]+)`\]" if links_only else r"`([\w.]+)`"
    return {name.rsplit(".", 1)[-1] for name in re.findall(pattern, cell)}


DOC_TABLES = [
    # page, header, reference, class column, transform column (None: none), links only
    ("optimizers/index.md", "| torch.optim |", "torch.optim", 1, 2, False),
    ("reference/optim.md", "| class | transform |", "torch.optim", 0, 1, True),
    ("optimizers/torchao.md", "| torchao |", "torchao", 1, 2, True),
    ("optimizers/schedulefree.md", "| schedulefree |", "schedulefree", 1, 2, True),
    ("optimizers/bnb.md", "| bitsandbytes |", "bitsandbytes", 0, None, False),
    ("optimizers/kron.md", "| kron-torch |", "kron-torch", 1, 2, True),
    ("optimizers/index.md", "| pytorch_optimizer |", "pytorch_optimizer", 1, 2, False),
]
# classes a docs table lists beside the registered ones, and why
DOCS_EXTRA = {
    "ScheduleFreeWrapper": "wraps any lucid optimizer: no rule of its own to register",
    "ScheduleFreeWrapperReference": "wraps any lucid optimizer: no rule of its own to register",
}


@pytest.mark.parametrize("table", DOC_TABLES, ids=lambda t: t[0])
def test_a_docs_table_lists_exactly_the_registry(table):
    page, header, reference, classes, transforms, links_only = table
    rows = _table(page, header)
    listed = set().union(*(_code_names(row[classes], links_only) for row in rows))
    listed -= set(DOCS_EXTRA)
    assert listed == _names(reference), f"docs/{page}: {sorted(listed ^ _names(reference))}"
    if transforms is not None:
        shown = set().union(*(_code_names(row[transforms], True) for row in rows)) or set().union(
            *(_code_names(row[transforms]) for row in rows)
        )
        wanted = {e.transform.__name__ for e in registered(reference) if e.transform}
        assert shown == wanted, f"docs/{page}: {sorted(shown ^ wanted)}"


@pytest.mark.parametrize(
    "page, pattern",
    [
        ("docs/optimizers/index.md", r"All (\d+) of torch\.optim's optimizers"),
        ("README.md", r"torch's (\d+) optimizers"),
    ],
)
def test_the_count_of_torchs_optimizers_in_the_prose_is_the_registrys(page, pattern):
    counts = re.findall(pattern, (ROOT / page).read_text())
    assert counts and {int(c) for c in counts} == {len(_names("torch.optim"))}


def test_every_optimizer_module_has_its_page():
    """Each module that declares torch.optim classes has its page in the docs' nav."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for entry in registered("torch.optim"):
        module = entry.cls.__module__.rsplit(".", 1)[-1]
        assert f"optimizers/{module}.md" in nav, entry.name
        assert importlib.import_module(entry.cls.__module__) is not None
