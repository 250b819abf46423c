"""Kernels merged side by side (``eqsat/horizontal.py``) in GPU programs: sibling
reductions (the same domain, axes and kind, a common operand) become one reduce kernel,
small elementwise loops one launch, the others written beside the kernel's output; each
pass declines where that would change a value or read one before it is ready."""

from __future__ import annotations

import math

import numpy as np
import pytest

from saturn.eqsat import horizontal
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.memory import plan_memory
from saturn.eqsat.pipeline import compile_graph

from .values import check_values

BATCH_NORM = (
    "(input x f32 [4 3 5 6])\n(input g f32 [4 3 5 6])\n(input m f32 [1 3 1 1])\n"
    "(let db (Sum g [0 2 3] 0))\n(let dw (Sum (Mul g (Sub x m)) [0 2 3] 0))\n(output db dw)\n"
)


def program(text: str, machine: str = "gpu"):
    graph = parse_graph(text)
    return graph, compile_graph(graph, machine=machine, io_on_device=True).program


def kinds(prog) -> list[str]:
    return [k.kind for k in prog.kernels]


def test_a_batch_norm_backwards_two_sums_are_one_kernel():
    """The gradient's sum and its sum against the centred input, per channel: one kernel
    reading the gradient once, the second sum written beside the first."""
    graph, prog = program(BATCH_NORM)
    assert kinds(prog) == ["reduce", "row_stat"], prog.to_text()
    red, stat = prog.kernels
    assert len(red.inputs) == 3  # g, x and the mean, each once
    ((body, dtype),) = red.attrs["stats"]
    assert dtype == "f32" and body[0] == "mul"
    assert stat.inputs[0].value == red.output and stat.attrs["stat"] == 0
    assert stat.covers == ["dw"] and red.covers == ["db"]  # explain still finds each op
    check_values(graph, prog)


def test_three_maxima_keep_their_nans_each():
    graph, prog = program(
        "(input x f32 [5 40])\n(input y f32 [5 40])\n(let a (Amax x [1] 0))\n"
        "(let b (Amax (Mul x y) [1] 0))\n(let c (Amax (Neg x) [1] 0))\n(output a b c)\n"
    )
    assert kinds(prog) == ["reduce", "row_stat", "row_stat"], prog.to_text()
    assert [k.attrs["stat"] for k in prog.kernels[1:]] == [0, 1]
    check_values(graph, prog)


def test_means_with_an_epilogue_share_it():
    graph, prog = program(
        "(input x f32 [9 40])\n(input y f32 [9 40])\n(let a (Cast (Mean x [0] 0) f16))\n"
        "(let b (Cast (Mean (Mul x y) [0] 0) f16))\n(output a b)\n"
    )
    assert kinds(prog) == ["reduce", "row_stat"], prog.to_text()
    assert prog.kernels[0].epilogue is not None and prog.kernels[1].dtype == "f16"
    check_values(graph, prog)


def test_at_most_siblings_max_reductions_share_a_kernel():
    n = horizontal.SIBLINGS_MAX + 1
    lets = "".join(f"(let s{i} (Sum (Mul x (Scalar {i + 2}.0 f32)) [0] 0))\n" for i in range(n))
    outs = " ".join(f"s{i}" for i in range(n))
    graph, prog = program(f"(input x f32 [6 40])\n{lets}(output {outs})\n")
    assert kinds(prog).count("reduce") == 2, prog.to_text()
    assert kinds(prog).count("row_stat") == n - 2
    assert max(len(k.attrs.get("stats", ())) for k in prog.kernels) == n - 2
    check_values(graph, prog)


def test_a_statistic_lives_from_its_reduction_in_the_memory_plan():
    """The second sum's buffer is written by the merged kernel: the plan keeps it apart
    from everything live there, the gradient among them (which dies there)."""
    head = "(input a f32 [12 8])\n(param p f32 [8 30])\n(let q (MatMul a p))\n"
    graph, prog = program(
        head + "(input x f32 [12 30])\n(let db (Sum q [0] 0))\n"
        "(let dw (Sum (Mul q x) [0] 0))\n(output db dw)\n"
    )
    assert kinds(prog) == ["gemm", "reduce", "row_stat"], prog.to_text()
    plan = plan_memory(prog)
    index = {s.output: i for i, s in enumerate(prog.steps)}
    red = index[prog.kernels[1].output]
    assert plan.slots[prog.kernels[0].output].last == red
    assert plan.slots[prog.kernels[2].output].first == red
    assert plan.overlaps() == []
    check_values(graph, prog)


@pytest.mark.parametrize(
    "lets",
    [
        # one reads the other
        "(let a (Sum x [1] 1))\n(let c (Add y a))\n(let b (Sum (Mul x c) [1] 1))\n",
        # other axes, another kind, another keepdim
        "(let a (Sum x [0] 0))\n(let b (Sum (Mul x y) [1] 0))\n",
        "(let a (Sum x [0] 0))\n(let b (Amax (Mul x y) [0] 0))\n",
        "(let a (Sum x [0] 0))\n(let b (Sum (Mul x y) [0] 1))\n",
        # no common operand
        "(let a (Sum x [0] 0))\n(let b (Sum (Exp y) [0] 0))\n",
    ],
)
def test_two_reductions_stay_apart(lets):
    graph, prog = program(f"(input x f32 [6 40])\n(input y f32 [6 40])\n{lets}(output a b)\n")
    assert kinds(prog) == ["reduce", "reduce"], prog.to_text()
    check_values(graph, prog)


def test_declines_where_the_first_is_read_before_the_seconds_operand_is_ready():
    """The column sum is read by a loop before the loop that makes the second sum's
    operand: merged where the first runs, the second would read that operand too early;
    merged where the second runs, the loop would read the first too early."""
    graph, prog = program(
        "(input x f32 [6 40])\n(input y f32 [6 40])\n(let a (Sum x [0] 1))\n"
        "(let c (Mul x a))\n(let y2 (Exp y))\n(let b (Sum (Mul x y2) [0] 1))\n(output c y2 b)\n"
    )
    assert kinds(prog) == ["reduce", "loop", "loop", "reduce"], prog.to_text()
    check_values(graph, prog)


def test_cpu_reference_programs_keep_each_reduction():
    _, prog = program(BATCH_NORM, "cpu-reference")
    assert kinds(prog) == ["reduce", "reduce"]


# --- grouped loops ----------------------------------------------------------------------

UPDATES = (
    "(input p f32 [3 5])\n(input g f32 [3 5])\n(input q f32 [7])\n(input h f32 [7])\n"
    "(input r f64 [2 3 4])\n(input e f64 [2 3 4])\n"
    "(let a (Sub p (Mul g (Scalar 0.1 f32))))\n(let b (Sub q (Mul h (Scalar 0.1 f32))))\n"
    "(let c (Sub r (Mul e (Scalar 0.1 f64))))\n(let d (Gt q h))\n(output a b c d)\n"
)


def test_small_loops_are_one_launch_each_over_its_domain():
    """An optimizer's updates of small parameters: one kernel, each other loop written
    beside its output over its own domain and dtype."""
    graph, prog = program(UPDATES)
    assert kinds(prog) == ["loop", "row_stat", "row_stat", "row_stat"], prog.to_text()
    lead = prog.kernels[0]
    assert lead.attrs["segments"] == ((7,), (2, 3, 4), (7,))
    assert [t for _, t in lead.attrs["stats"]] == ["f32", "f64", "bool"]
    assert [k.covers for k in prog.kernels] == [["a"], ["b"], ["c"], ["d"]]
    check_values(graph, prog)


def test_at_most_group_max_loops_share_a_launch():
    n = horizontal.GROUP_MAX + 3
    ins = "".join(f"(input x{i} f32 [{i + 2}])\n" for i in range(n))
    lets = "".join(f"(let y{i} (Exp x{i}))\n" for i in range(n))
    outs = " ".join(f"y{i}" for i in range(n))
    graph, prog = program(f"{ins}{lets}(output {outs})\n")
    assert kinds(prog).count("loop") == 2, prog.to_text()
    assert kinds(prog).count("row_stat") == n - 2
    check_values(graph, prog)


def test_loop_groups_decline_large_broadcast_and_dependent_loops():
    big = horizontal.GROUP_NUMEL_MAX + 1
    graph, prog = program(
        f"(input x f32 [{big}])\n(input y f32 [7])\n(input z f32 [7])\n(input w f32 [3 7])\n"
        "(let a (Exp x))\n(let b (Exp y))\n(let c (Mul b z))\n(let d (Add w y))\n"
        "(output a b c d)\n"
    )
    # the large loop keeps its own kernel, the broadcast one too, and the product reads
    # the exponential: nothing to group
    assert "row_stat" not in kinds(prog), prog.to_text()
    check_values(graph, prog)


@pytest.mark.parametrize("first", [True, False])
def test_a_grouped_index_clamp_keeps_its_bounds(first, monkeypatch):
    """A clamp of token ids run beside another loop, as the group's own loop or beside it,
    is still known to lie in the table's rows: the take that reads it needs no index
    check after the call."""
    from saturn.eqsat import pipeline
    from saturn.eqsat.ranges import indices_in_range, value_bounds

    text = (
        "(input table f32 [10 4])\n(input ids i64 [2 3])\n(input x f32 [5])\n"
        "(let i (Minimum (Maximum ids (Scalar 0 i64)) (Scalar 9 i64)))\n"
        "(let t (Take table i))\n(let e (Exp x))\n(output t e i)\n"
    )
    monkeypatch.setattr(pipeline, "group_loops", lambda p: p)
    graph, apart = program(text)
    pos = {s.covers[0]: j for j, s in enumerate(apart.steps) if s.kernel is not None}
    clamp, exp = apart.steps[pos["i"]], apart.steps[pos["e"]]
    group = horizontal._Group(clamp if first else exp, min(pos["i"], pos["e"]), math.inf)
    group.members.append(exp if first else clamp)
    prog = horizontal._rebuilt(apart, [group], horizontal._group_attrs)
    (step,) = [s for s in prog.steps if s.covers == ["i"]]
    assert step.kernel.kind == ("loop" if first else "row_stat"), prog.to_text()
    assert value_bounds(prog, step.output) == (0.0, 9.0)
    take = next(s for s in prog.steps if s.kernel is not None and s.kernel.kind == "gather")
    assert indices_in_range(prog, take), prog.to_text()
    check_values(graph, prog)


def test_cpu_reference_programs_keep_each_loop():
    _, prog = program(UPDATES, "cpu-reference")
    assert "row_stat" not in kinds(prog)


def test_a_reduction_reading_a_moved_sibling_waits_for_where_it_now_runs():
    """Hand-ordered (lowering orders steps its own way): the column sum ``s1`` merges with a
    later sibling ``s2`` whose operand ``w`` comes after it, so both run where ``s2`` was;
    ``b``, whose sibling ``t`` ran before that, reads ``s1`` and must not join ``t`` there
    (it would read ``s1`` before it is computed)."""
    from saturn.eqsat import evaluate as ev
    from saturn.eqsat.program import Kernel, Operand, Program, Step, validate

    def reduce_(out, dims, shape, inputs, body):
        attrs = {"reduce": "sum", "dims": dims, "keepdim": 0}
        k = Kernel("reduce", out, "f32", shape, inputs, body, (4, 6), attrs)
        return Step("kernel", out, "reduce", dtype="f32", shape=shape, kernel=k, place="device")

    def xs(n: str) -> Operand:
        return Operand(n, "f32", (4, 6), "same")

    s1 = reduce_("s1", (0,), (6,), [xs("x")], ("in", 0))
    t = reduce_("t", (1,), (4,), [xs("z")], ("in", 0))
    loop = Kernel("loop", "w", "f32", (4, 6), [xs("v")], ("exp", ("in", 0)), (4, 6))
    w = Step("kernel", "w", "loop", dtype="f32", shape=(4, 6), kernel=loop, place="device")
    s2 = reduce_("s2", (0,), (6,), [xs("x"), xs("w")], ("mul", ("in", 0), ("in", 1)))
    trailing = Operand("s1", "f32", (6,), "trailing")
    b = reduce_("b", (1,), (4,), [xs("z"), trailing], ("mul", ("in", 0), ("in", 1)))
    inputs = [Step("input", n, dtype="f32", shape=(4, 6), place="device") for n in "xzv"]
    prog = Program([*inputs, s1, t, w, s2, b], ["t", "s2", "b"], {n: n for n in "xzv"})
    validate(prog)
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal((4, 6)).astype(np.float32) for n in "xzv"}
    want = ev.eval_program(prog, values)  # before the pass, which renames the steps
    merged = horizontal.merge_siblings(prog)
    validate(merged)
    assert [s.covers for s in merged.steps if "stats" in getattr(s.kernel, "attrs", {})]
    for g, w_ in zip(ev.eval_program(merged, values), want, strict=True):
        assert np.array_equal(g, w_)
