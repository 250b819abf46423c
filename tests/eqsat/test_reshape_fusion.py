"""Loops fused through a reshape (``eqsat/reshape_fusion.py``): rotate_half's cat computed
inside the loop that reads it, on GPU programs, with the program's values the graph's; and
the cases it declines."""

from __future__ import annotations

import pytest

from saturn.eqsat.graph import parse_graph
from saturn.eqsat.kernel_fusion import typed_as
from saturn.eqsat.pipeline import compile_graph
from saturn.eqsat.program import Operand
from saturn.eqsat.reshape_fusion import refinement

from .values import check_values


def program(text: str, machine: str = "gpu"):
    graph = parse_graph(text)
    prog = compile_graph(graph, machine=machine, io_on_device=machine == "gpu").program
    return graph, prog


def rotary(dtype: str = "f32", d: int = 16) -> str:
    """A query (a permuted view) times cos plus rotate_half(query) times sin, the cat a
    where on a [.., 2, d/2] grid read through a reshape, as the importer writes it."""
    h = d // 2
    return (
        f"(input q {dtype} [2 16 4 {d}])\n(input c {dtype} [1 1 16 {d}])\n"
        f"(input s {dtype} [1 1 16 {d}])\n"
        "(let t (Permute q [0 2 1 3]))\n(let i (Arange 0 1 2 i64))\n"
        "(let iv (View i [1 1 1 2 1]))\n(let sel (Eq iv (Scalar 0.0 i64)))\n"
        f"(let x1 (Slice t 3 0 {h} 1))\n(let x2 (Slice t 3 {h} {d} 1))\n(let n (Neg x2))\n"
        f"(let a (Expand (View n [2 4 16 1 {h}]) [2 4 16 2 {h}]))\n"
        f"(let b (Expand (View x1 [2 4 16 1 {h}]) [2 4 16 2 {h}]))\n"
        f"(let w (Where sel a b))\n(let rot (View w [2 4 16 {d}]))\n"
        "(let r (Add (Mul t c) (Mul rot s)))\n(output r)\n"
    )


def loops(prog) -> list:
    return [k for k in prog.kernels if k.kind == "loop"]


@pytest.mark.parametrize("d", [16, 64])
def test_rotate_half_is_computed_inside_its_reader(d):
    graph, prog = program(rotary(d=d))
    (k,) = loops(prog)  # one kernel: the cat is not written
    assert k.domain == (2, 4, 16, 2, d // 2) and "where" in str(k.body)
    assert prog.steps[-1].kind == "view" and prog.steps[-1].shape == (2, 4, 16, d)
    check_values(graph, prog)


def test_half_rotate_half_is_inlined_its_negation_rounded_in_its_body():
    """bf16: the cat's value is a bf16 value already (where of a negation cast back), so
    storing it rounded nothing and computing it inside the reader is exact."""
    _, prog = program(rotary("bf16"))
    assert len(loops(prog)) == 1


def test_the_cpu_reference_program_is_left_as_lowered():
    graph, prog = program(rotary(), machine="cpu-reference")
    assert len(loops(prog)) == 2
    check_values(graph, prog)


def test_a_half_producer_is_taken_only_where_its_value_has_its_type():
    """A bf16 loop stores its body's value rounded to bf16. Computed inside the reader, the
    body must already give a bf16 value (it ends in the rounding, or only selects and
    negates bf16 values), or the reader would see an unrounded one."""
    ins = [Operand("x", "bf16", (4,), "same"), Operand("m", "f32", (4,), "same")]
    x, m = ("in", 0), ("in", 1)
    assert typed_as(("cast", ("mul", x, x), "bf16"), "bf16", ins)
    assert typed_as(("where", ("eq", m, m), ("cast", ("neg", x), "bf16"), x), "bf16", ins)
    assert not typed_as(("mul", x, x), "bf16", ins)  # rounded only when stored
    assert not typed_as(("where", ("eq", m, m), m, x), "bf16", ins)  # an f32 branch
    assert not typed_as(("cast", m, "f16"), "bf16", ins)


def test_declines_where_the_producer_is_an_output():
    text = rotary().replace("(output r)", "(output r w)")
    graph, prog = program(text)
    assert len(loops(prog)) == 2
    check_values(graph, prog)


def test_declines_where_the_reader_is_finer_than_the_producer():
    """A reshape that splits the producer's axes for the reader (the reader's grid is the
    finer one) is not this pass's: left as lowered."""
    text = (
        "(input x f32 [4 16])\n(input y f32 [4 2 8])\n(input z f32 [4 16])\n"
        "(let p (Exp (Add x z)))\n(let v (View p [4 2 8]))\n(let r (Mul v y))\n"
        "(let q (Sin (Add p z)))\n(output r q)\n"
    )
    graph, prog = program(text)
    check_values(graph, prog)
    assert all(k.domain in ((4, 16), (4, 2, 8)) for k in loops(prog))


def test_refinement_groups_axes():
    assert refinement((2, 4, 16, 2, 8), (2, 4, 16, 16)) == [[2], [4], [16], [2, 8]]
    assert refinement((1, 16, 1, 8), (1, 16, 8)) == [[1], [16], [1, 8]]
    assert refinement((16, 1), (16,)) == [[16, 1]]
    assert refinement((4, 4), (2, 8)) is None  # not a split of each axis
    assert refinement((2, 8), (16, 1)) == [[2, 8], []]
    assert refinement((3, 5), (16,)) is None


def test_declines_a_producer_with_arithmetic_read_by_two_loops():
    """A producer read through one reshape by two loops is inlined into both only where
    its body only selects; an exponential would be computed twice: left as its kernel."""
    text = (
        "(input x f32 [4 2 8])\n(input y f32 [4 16])\n(input z f32 [4 16])\n"
        "(let p (Exp x))\n(let v (View p [4 16]))\n"
        "(let r (Mul v y))\n(let q (Sub v z))\n(output r q)\n"
    )
    graph, prog = program(text)
    check_values(graph, prog)
    assert any(k.body == ("exp", ("in", 0)) for k in loops(prog))  # written once
