"""Loops written in the layout a copying reshape reads them in (``eqsat/copied_views.py``):
attention's head split of a scaled query or key, on GPU programs, with the program's
values the graph's (both zeros, infinities, NaN); and the cases it declines."""

from __future__ import annotations

from saturn.eqsat import pipeline
from saturn.eqsat.channels_last import Layouts, packed_like
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

from .values import check_values


def program(text: str, machine: str = "gpu", copies_without: int = 1):
    """The graph and its program; ``copies_without``: the copying views the program has
    without the pass (what shows the case is the one the pass is for)."""
    graph = parse_graph(text)
    real = pipeline.write_through_copies
    pipeline.write_through_copies = lambda p: p
    try:
        before = compile_graph(graph, machine=machine, io_on_device=machine == "gpu").program
    finally:
        pipeline.write_through_copies = real
    assert len(copying_views(before)) == copies_without, before.to_text()
    prog = compile_graph(graph, machine=machine, io_on_device=machine == "gpu").program
    return graph, prog


def copying_views(prog) -> list[str]:
    """The reshapes the runner copies at every call: their source's layout is known and
    they cannot view it. Also checks every operand read by its flat index lies packed."""
    lay, out = Layouts(), []
    for s in prog.steps:
        for o in s.kernel.inputs if s.kernel is not None else ():
            if o.indexing not in ("strided", "scalar"):
                assert packed_like(o.shape, lay.strides[o.value]), (s.output, o)
        lay.add(s)
        if s.kind == "view" and s.op == "View" and lay.strides[s.output] is None:
            out.append(s.output)
    return out


def heads(read: str, then: str = "") -> str:
    """[B, S, H * D] scaled, split into heads [B, H, S, D] and merged to [B * H, S, D]
    for a batched product (``read``: the views after the split); ``then``: more lets."""
    return (
        "(input x f32 [2 4 16])\n(input y f32 [4 8 4])\n"
        "(let a (Mul x (Scalar 0.5 f32)))\n"
        f"(let h {read})\n(let p (BatchMatMul h y))\n{then}(output p)\n"
    )


QUERY = "(View (Permute (View a [2 4 2 8]) [0 2 1 3]) [4 4 8])"
KEY = "(View (Permute (Permute (View a [2 4 2 8]) [0 2 1 3]) [0 1 3 2]) [4 8 4])"


def loops(prog) -> list:
    return [k for k in prog.kernels if k.kind == "loop"]


def test_a_scaled_query_is_written_in_head_order():
    graph, prog = program(heads(QUERY))
    assert copying_views(prog) == [], prog.to_text()
    (k,) = loops(prog)
    assert k.domain == (2, 2, 4, 8) and k.inputs[0].indexing == "strided"
    check_values(graph, prog)


def test_a_transposed_key_is_written_in_head_order_and_read_transposed():
    """The loop keeps its contiguous axis (D) last: it writes [B, H, S, D], and the
    product reads it through a permute to [B, H, D, S] (a transposed operand)."""
    text = heads(KEY).replace("(input y f32 [4 8 4])", "(input y f32 [4 4 3])")
    graph, prog = program(text)
    assert copying_views(prog) == [], prog.to_text()
    (k,) = loops(prog)
    assert k.domain == (2, 2, 4, 8)
    check_values(graph, prog)


def test_a_broadcast_operand_is_read_through_the_same_views():
    """A bias [H * D] added before the split: expanded over the loop, then split and
    permuted with the rest."""
    text = (
        heads(QUERY)
        .replace("(Mul x (Scalar 0.5 f32))", "(Add (Mul x (Scalar 0.5 f32)) b)")
        .replace("(input y", "(input b f32 [16])\n(input y")
    )
    graph, prog = program(text)
    assert copying_views(prog) == [], prog.to_text()
    check_values(graph, prog)


def test_declines_a_loop_read_elsewhere_too():
    """The scaled value is also an output: written row-major for it, the copy stays."""
    text = heads(QUERY).replace("(output p)", "(output p a)")
    graph, prog = program(text)
    assert len(copying_views(prog)) == 1
    check_values(graph, prog)


def test_declines_where_the_contiguous_axis_would_leave_the_reshape_a_copy():
    """A [B*H, D, S] loop (a key's gradient, say) merged back to [B, S, H * D]: its
    contiguous axis S would have to stay last, and then the merge still copies."""
    text = (
        "(input g f32 [4 8 4])\n(input w f32 [16 3])\n"
        "(let a (Mul g (Scalar 0.5 f32)))\n"
        "(let t (View (Permute (Permute (View a [2 2 8 4]) [0 1 3 2]) [0 2 1 3]) [8 16]))\n"
        "(let p (MatMul t w))\n(output p)\n"
    )
    graph, prog = program(text)
    assert len(copying_views(prog)) == 1, prog.to_text()
    check_values(graph, prog)


def test_the_cpu_reference_program_is_left_as_lowered():
    graph, prog = program(heads(QUERY), machine="cpu-reference")
    (k,) = loops(prog)
    assert k.domain == (2, 4, 16)
    check_values(graph, prog)


def test_a_concatenation_of_gradients_runs_over_its_permuted_domain():
    """GPT-NeoX's backward joins the query's, key's and value's gradients [B, H, S, D] on a
    new axis and merges them to [B * S, H * 3 * D] for its fused projection's product: the
    pieces cannot be read through the merge, so the join runs over [B, S, H, 3, D] (its
    last axis kept last) and the views after it view its memory."""
    text = (
        "(input a f32 [2 2 4 8])\n(input b f32 [2 2 4 8])\n(input c f32 [2 2 4 8])\n"
        "(input w f32 [48 5])\n"
        "(let at (View (Arange 0 1 3 i64) [1 1 1 3 1]))\n"
        "(let pa (Expand (View a [2 2 4 1 8]) [2 2 4 3 8]))\n"
        "(let pb (Expand (View b [2 2 4 1 8]) [2 2 4 3 8]))\n"
        "(let pc (Expand (View c [2 2 4 1 8]) [2 2 4 3 8]))\n"
        "(let j (Where (Eq at (Scalar 0 i64)) pa (Where (Eq at (Scalar 1 i64)) pb pc)))\n"
        "(let t (View (Permute (View j [2 2 4 24]) [0 2 1 3]) [8 48]))\n"
        "(let p (MatMul t w))\n(output p)\n"
    )
    graph, prog = program(text)
    assert copying_views(prog) == [], prog.to_text()
    (k,) = [k for k in loops(prog) if len(k.domain) == 5]
    assert k.domain == (2, 4, 2, 3, 8)
    check_values(graph, prog)
