"""The kernel kinds have one home each (``eqsat/kinds/``): no module compares a kind with a
string or builds a kernel from one, and each interpreter of a program says which kinds it
runs through its ``KindTable``, failing with its name and the kind where it has none."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from saturn.eqsat import evaluate, schema
from saturn.eqsat.kinds import FACTS, SPECS, TERMS, Kind, KindTable, facts, spec
from saturn.eqsat.program import Kernel, Operand, Step, StepKind

ROOT = Path(__file__).resolve().parents[2]
NAMES = {k.value for k in Kind}
STEPS = {k.value for k in StepKind}


def _literals(node: ast.AST, names: set[str] = NAMES) -> list[str]:
    elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]


def _kindish(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
        isinstance(node, ast.Name) and node.id == "kind"
    )


def kind_strings(source: str) -> list[str]:
    """Comparisons of a kind with a kernel kind's name, and kernels built from one."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(_kindish(s) for s in sides) and any(_literals(s) for s in sides):
                found.append(f"line {n.lineno}: {ast.unparse(n)}")
        elif isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("Kernel", "library"):
            kind = [k.value for k in n.keywords if k.arg == "kind"] + n.args[:1]
            if any(_literals(a) for a in kind):
                found.append(f"line {n.lineno}: {ast.unparse(n)[:60]}")
    return found


def test_the_scan_sees_a_kind_string():
    assert kind_strings('if k.kind == "loop": pass')
    assert kind_strings('x = s.kernel.kind in ("gemm", "conv")')
    assert kind_strings('k = Kernel("pad", "out", "f32", (), [])')
    assert kind_strings('k = Kernel(kind="rows", output="out")')
    assert not kind_strings("if k.kind == Kind.LOOP: pass")
    assert not kind_strings('if s.kind == "kernel": pass')  # a step's kind, not a kernel's


def test_no_module_names_a_kind_by_its_string():
    found = {}
    for folder in ("eqsat", "codegen", "device"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent.name == "kinds":  # the registry: each kind's own module
                continue
            hits = kind_strings(path.read_text())
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found


def test_every_kind_has_its_facts_and_an_unknown_one_is_refused():
    assert set(FACTS) == set(Kind)
    assert facts("rows").body and not facts(Kind.GEMM).body
    assert facts("gather").indices and facts(Kind.SCATTER).indices and not facts("pad").indices
    with pytest.raises(ValueError, match="unknown kernel kind 'fft'"):
        facts("fft")


def test_the_reference_evaluator_runs_every_kind():
    assert evaluate.REFERENCE.covers() == set(Kind)


def test_a_table_without_a_kind_names_itself_and_the_kind():
    table: KindTable = KindTable("a test target")

    @table.on(Kind.LOOP)
    def loop(*a):
        return "ran"

    assert table["loop"]() == "ran"
    with pytest.raises(NotImplementedError, match="a test target cannot run a pad kernel"):
        table["pad"]
    with pytest.raises(ValueError, match="registered twice"):
        table.on(Kind.LOOP)(loop)


def test_the_reference_evaluator_dispatches_by_kind():
    """A pad kernel built from the registry's name runs its numpy reference."""
    x = Operand("x", "f32", (2,), "strided")
    k = Kernel(Kind.PAD, "y", "f32", (4,), [x], None, (4,), {"pads": (1, 1), "value_bits": 0})
    step = Step("kernel", "y", Kind.PAD, ("x",), dtype="f32", shape=(4,), kernel=k)
    got = evaluate.run_kernel(step, [np.array([1.0, 2.0], dtype=np.float32)])
    assert got.tolist() == [0.0, 1.0, 2.0, 0.0]


def test_each_kind_is_one_module_holding_its_spec():
    """``eqsat/kinds/<name>.py`` defines the kind ``name``; the kinds are named in their
    specs' order (their terms' order in the schema)."""
    modules = sorted(
        p.stem
        for p in (ROOT / "eqsat" / "kinds").glob("*.py")
        if p.stem not in ("__init__", "spec")
    )
    assert sorted(s.name for s in SPECS) == modules
    assert [k.value for k in Kind] == [s.name for s in sorted(SPECS, key=lambda s: s.order)]
    assert spec("pad") is spec(Kind.PAD) and TERMS["PadCopy"] is spec(Kind.PAD)
    with pytest.raises(ValueError, match="unknown kernel kind 'fft'"):
        spec("fft")


def test_each_kind_brings_what_every_stage_asks_of_it():
    """A kind made by a term declares it in the schema and types, costs and lowers it (a
    body kind's lowering is kernel_bodies'); every kind has its numpy reference."""
    text = schema.schema_text()
    for s in SPECS:
        assert s.reference is not None, s.name
        if s.term is None:
            continue
        assert f"(constructor {s.term} " in text, s.name
        assert s.type_of is not None and s.cost is not None, s.name
        assert (s.lower is None) == s.facts.body, s.name


def test_the_pad_kind_is_named_by_its_module_and_its_emitter_only():
    """What adding the pad kind would touch in the compiler: its kind module and its
    emitter (beside them, its importer handler makes the graph op ``Pad`` and its rule in
    rules/gather.egg the term ``PadCopy``). No other module of the core, codegen or the
    device package names the kind, its term or its emitter's launcher."""
    names = ("Kind.PAD", "PadCopy", "PadKernel", "PadLauncher", "fill_word")
    found = set()
    for folder in ("eqsat", "codegen", "device"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            if any(n in text for n in names):
                found.add(str(path.relative_to(ROOT)))
    assert found == {"eqsat/kinds/pad.py", "codegen/pad.py"}


def step_kind_strings(source: str) -> list[str]:
    """Comparisons of a kind with a step kind's name, and steps built from one."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(_kindish(s) for s in sides) and any(_literals(s, STEPS) for s in sides):
                found.append(f"line {n.lineno}: {ast.unparse(n)}")
        elif isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Step":
            if any(_literals(a, STEPS) for a in n.args[:1]):
                found.append(f"line {n.lineno}: {ast.unparse(n)[:60]}")
    return found


def test_no_module_names_a_step_kind_by_its_string():
    """Steps are named through ``StepKind`` (program.py) too. custom_ops.py is left out:
    a custom op's own kind (expression, kernel or host) is another thing."""
    assert step_kind_strings('if s.kind == "kernel": pass')
    assert step_kind_strings('Step("view", "y")')
    assert not step_kind_strings("if s.kind == StepKind.VIEW: pass")
    found = {}
    for folder in ("eqsat", "codegen", "device"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "custom_ops.py":
                continue
            hits = step_kind_strings(path.read_text())
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}, found
    assert repr(StepKind.KERNEL) == "'kernel'" and StepKind.KERNEL == "kernel"
