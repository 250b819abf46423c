"""Rows kernels (``fuse_rows``): a loop and the last-axis reductions it reads per row become
one kernel in GPU programs, and the pass declines where a reduction is needed elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat import evaluate as ev
from saturn.eqsat import kernel_fusion
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph
from saturn.eqsat.program import ROWS_MAX, leaves

from .values import check_values


def program(text: str, machine: str = "gpu"):
    graph = parse_graph(text)
    return graph, compile_graph(graph, machine=machine, io_on_device=True).program


def kinds(prog) -> list[str]:
    return [k.kind for k in prog.kernels]


def test_softmax_is_one_rows_kernel_with_two_stages():
    graph, prog = program("(input x f32 [6 40])\n(let r (Softmax x 1))\n(output r)\n")
    assert kinds(prog) == ["rows"]
    (k,) = prog.kernels
    assert [st.reduce for st in k.stages] == ["max", "sum"]
    assert ("stage", 0) in leaves(k.stages[1].body)
    assert {("stage", 0), ("stage", 1)} <= leaves(k.body)
    assert k.covers == ["r"]  # explain still finds the op
    check_values(graph, prog)


def test_layer_norm_keeps_its_variance_epilogue_as_a_stage():
    graph, prog = program(
        "(input x f32 [4 24])\n(param w f32 [24])\n(param b f32 [24])\n"
        "(let r (LayerNorm x w b [1] 1e-05))\n(output r)\n"
    )
    assert kinds(prog) == ["rows"]
    check_values(graph, prog)


def test_cpu_reference_programs_keep_separate_reductions():
    _, prog = program("(input x f32 [6 40])\n(let r (Softmax x 1))\n(output r)\n", "cpu-reference")
    assert "rows" not in kinds(prog) and "reduce" in kinds(prog)


def test_a_reduction_that_is_an_output_is_written_by_the_rows_kernel():
    """The row max is also an output: the rows kernel writes it as a statistic (its stage's
    value, one per row) instead of leaving the max to a kernel of its own."""
    graph, prog = program(
        "(input x f32 [6 40])\n(let m (Amax x [1] 1))\n(let r (Exp (Sub x m)))\n(output r m)\n"
    )
    assert kinds(prog) == ["rows", "row_stat"], prog.to_text()
    rows, stat = prog.kernels
    assert rows.attrs["stats"] == ((("stage", 0), "f32"),)
    assert stat.inputs[0].value == rows.output and stat.attrs["stat"] == 0
    check_values(graph, prog)


def test_a_reduction_another_kernel_reads_later_is_written_once_by_the_rows_kernel():
    # the row mean feeds two loops that both stay (two outputs): the first is a rows
    # kernel, which writes the mean for the second to read
    graph, prog = program(
        "(input x f32 [6 40])\n(let m (Mean x [1] 1))\n(let a (Sub x m))\n"
        "(let b (Mul (Exp x) m))\n(output a b)\n"
    )
    assert kinds(prog) == ["rows", "row_stat", "loop"], prog.to_text()
    _, stat, loop = prog.kernels
    assert stat.output in [o.value for o in loop.inputs]
    check_values(graph, prog)


def test_declines_when_a_step_before_the_loop_reads_the_reduction():
    """The row max's column maximum is computed before the loop (which reads it): a
    statistic is ready only after the rows kernel, so the max keeps its own kernel."""
    graph, prog = program(
        "(input x f32 [6 40])\n(let m (Amax x [1] 1))\n(let c (Amax m [0] 1))\n"
        "(let r (Exp (Sub (Sub x m) c)))\n(output r)\n"
    )
    assert "rows" not in kinds(prog) and "row_stat" not in kinds(prog), prog.to_text()
    check_values(graph, prog)


def test_per_row_loops_of_the_stages_alone_are_statistics_others_stay_loops():
    """A row max's NaN test, as bool and as int32, is computed from the stage and written
    beside the softmax; a loop over one value per row that also reads another tensor is
    not (the rows kernel has no per-row operands for it): it stays a loop reading the max,
    which the rows kernel writes for it."""
    graph, prog = program(
        "(input x f32 [6 40])\n(input e f32 [6 1])\n(let m (Amax x [1] 1))\n"
        "(let r (Exp (Sub x m)))\n(let z (Ne m m))\n(let q (Mul m e))\n"
        "(let c (Cast (Eq m (Scalar inf f32)) i32))\n(output r z q c)\n"
    )
    assert kinds(prog) == ["rows", "row_stat", "row_stat", "row_stat", "loop"], prog.to_text()
    rows, _, _, _, loop = prog.kernels
    assert [t for _, t in rows.attrs["stats"]] == ["f32", "bool", "i32"]
    assert prog.kernels[1].output in [o.value for o in loop.inputs]
    check_values(graph, prog)


def test_the_rows_kernel_runs_as_early_as_its_operands_allow():
    """A full sum reading the row max comes before the softmax's loop in the extracted
    program: the rows kernel runs right after its one operand instead, so the sum reads
    the max it writes (a loss's mean over a last layer norm, bfloat16 DistilBERT)."""
    graph, prog = program(
        "(input x f32 [6 40])\n(let m (Amax x [1] 1))\n(let t (Sum (Sub x m) [0 1] 0))\n"
        "(let r (Exp (Sub x m)))\n(output t r)\n"
    )
    assert kinds(prog) == ["rows", "row_stat", "reduce"], prog.to_text()
    check_values(graph, prog)


# a training layer norm as the importer writes one: the norm, and its mean and reciprocal
# deviation (outputs the backward reads)
TRAINING_NORM = (
    "(input x f32 [6 40])\n(param w f32 [40])\n(param b f32 [40])\n"
    "(let r (LayerNorm x w b [1] 1e-05))\n(let m (Mean x [1] 1))\n(let v (Var x [1] 0 1))\n"
    "(let rs (Rsqrt (Add v (Scalar 1e-05 f32))))\n(output r m rs)\n"
)


def test_a_training_layer_norm_is_one_rows_kernel_writing_its_statistics():
    """One pass over the rows: the mean is the first stage's value, the reciprocal
    deviation the loop over one value per row that read the variance, computed from the
    stage by the same expression (no mean, variance or deviation kernel of their own)."""
    graph, prog = program(TRAINING_NORM)
    assert kinds(prog) == ["rows", "row_stat", "row_stat"], prog.to_text()
    rows = prog.kernels[0]
    (mean, _), (rstd, _) = rows.attrs["stats"]
    assert mean == ("stage", 0) and rstd[0] == "rsqrt"
    assert [s.output for s in prog.steps if s.kernel is not None][1:] == prog.outputs[1:]
    check_values(graph, prog)


def test_a_statistic_lives_from_its_rows_kernel_in_the_memory_plan():
    """A statistic's buffer is written by the rows kernel before its own step: the plan
    keeps it apart from everything live at that kernel (an operand that dies there)."""
    from saturn.eqsat.memory import plan_memory

    text = TRAINING_NORM.replace("(input x f32 [6 40])\n", "")
    head = "(input a f32 [6 8])\n(param p f32 [8 40])\n(let x (MatMul a p))\n"
    graph, prog = program(head + text)  # the product dies at the rows kernel
    assert kinds(prog) == ["gemm", "rows", "row_stat", "row_stat"], prog.to_text()
    plan = plan_memory(prog)
    index = {s.output: i for i, s in enumerate(prog.steps)}
    product = prog.kernels[0].output
    rows = index[prog.kernels[1].output]
    assert plan.slots[product].last == rows
    for s in prog.steps[rows + 1 :]:  # the two statistics
        assert plan.slots[s.output].first == rows
    assert plan.overlaps() == []
    check_values(graph, prog)


def test_declines_on_a_reduction_over_another_axis():
    graph, prog = program(
        "(input x f32 [6 40])\n(let m (Amax x [0] 1))\n(let r (Exp (Sub x m)))\n(output r)\n"
    )
    assert "rows" not in kinds(prog)
    check_values(graph, prog)


def test_declines_on_rows_longer_than_a_warp_takes():
    n = ROWS_MAX + 1
    _, prog = program(f"(input x f32 [2 {n}])\n(let r (Softmax x 1))\n(output r)\n")
    assert "rows" not in kinds(prog)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_log_softmax_rows_match_the_graph(dtype):
    graph, prog = program(f"(input x {dtype} [3 5 33])\n(let r (LogSoftmax x 2))\n(output r)\n")
    assert kinds(prog) == ["rows"]
    check_values(graph, prog, seed=3)


# Two layer norms in a row, each over a residual sum (the encoder's pattern): a GEMM writes
# the first norm's output (so it must be written), and the second reads the first.
TWO_NORMS = (
    "(input x f32 [8 32])\n(input y f32 [8 32])\n(input z f32 [8 32])\n"
    "(param w f32 [32])\n(param b f32 [32])\n(param m f32 [32 32])\n"
    "(let h (LayerNorm (Add x y) w b [1] 1e-05))\n"
    "(let f (MatMul h m))\n"
    "(let r (LayerNorm (Add (Add h f) z) w b [1] 1e-05))\n(output r)\n"
)


def test_a_norm_reads_the_written_norm_instead_of_recomputing_it():
    """The second norm reads the first's written output (one operand of 1 KiB instead of the
    two it was computed from), which leaves the first's mean and variance read by its own
    loop only: each norm is one rows kernel."""
    graph, prog = program(TWO_NORMS)
    assert kinds(prog) == ["rows", "gemm", "rows"], prog.to_text()
    first, _, second = prog.kernels
    assert first.output in [o.value for o in second.inputs]
    assert "x" not in [o.value for o in second.inputs] and len(second.stages) == 2
    check_values(graph, prog)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_norms_read_the_written_norm_rounded_in_its_body(dtype):
    """In a half type each op is placed with its rounding, so the first norm's body ends in
    the rounding to its own type: the written value is the recomputed one, bit for bit, and
    the second norm reads it. Each norm is one rows kernel."""
    graph, prog = program(TWO_NORMS.replace("f32", dtype))
    assert kinds(prog) == ["rows", "gemm", "rows"], prog.to_text()
    first, _, second = prog.kernels
    assert first.body[0] == "cast" and first.body[2] == dtype
    assert first.output in [o.value for o in second.inputs]
    assert "x" not in [o.value for o in second.inputs]
    if dtype == "f16":  # the numpy evaluator has no bfloat16
        check_values(graph, prog)


def test_reading_a_half_value_declines_where_the_store_rounds():
    """A bfloat16 loop whose body is not rounded to bfloat16 in the expression (here a float32
    sum) is rounded when written: the written value is not the recomputed one, so a second
    loop recomputing the sum keeps recomputing it."""
    from saturn.eqsat.kernel_fusion import reuse_written
    from saturn.eqsat.program import Kernel, Operand, Program, Step

    x = Operand("x", "bf16", (8, 32), "same")
    y = Operand("y", "bf16", (8, 32), "same")
    wide = ("add", ("cast", ("in", 0), "f32"), ("cast", ("in", 1), "f32"))
    p = Kernel("loop", "p", "bf16", (8, 32), [x, y], wide, (8, 32))
    q = Kernel("loop", "q", "f32", (8, 32), [x, y], ("exp", wide), (8, 32))
    steps = [Step("kernel", k.output, "loop", ("x", "y"), kernel=k) for k in (p, q)]
    reuse_written(Program(steps, ["p", "q"], {}))
    assert [o.value for o in q.inputs] == ["x", "y"] and q.body == ("exp", wide)
    # rounded in the body, the sum is read back: 512 B of operands instead of 1 KiB
    p.body = ("cast", wide, "bf16")
    q.body = ("exp", ("cast", ("cast", wide, "bf16"), "f32"))
    reuse_written(Program(steps, ["p", "q"], {}))
    assert [o.value for o in q.inputs] == ["p"]


def test_reading_the_written_value_declines_where_it_reads_more():
    """A second loop recomputing a cheap broadcast expression (a row's bias times a scalar)
    keeps recomputing it: reading the written full-size value would read more bytes."""
    from saturn.eqsat.kernel_fusion import reuse_written
    from saturn.eqsat.program import Kernel, Operand, Program, Step

    def loop(out, inputs, body):
        k = Kernel("loop", out, "f32", (8, 32), inputs, body, (8, 32))
        return Step("kernel", out, "loop", tuple(o.value for o in inputs), kernel=k)

    bias = Operand("b", "f32", (32,), "trailing")
    x = Operand("x", "f32", (8, 32), "same")
    scaled = ("mul", ("in", 0), ("const", 0x3E000000, "f32"))
    p = loop("p", [bias], scaled)
    q = loop("q", [x, bias], ("add", ("in", 0), ("mul", ("in", 1), ("const", 0x3E000000, "f32"))))
    prog = Program([p, q], ["p", "q"], {})
    reuse_written(prog)
    assert [o.value for o in q.kernel.inputs] == ["x", "b"]  # declined: 1 KiB + 128 B < 2 KiB
    assert p.kernel.body == scaled


def test_softmax_of_a_permuted_input_stays_one_rows_kernel():
    """Reading reductions in memory order (a permuted operand's axes) must not take a
    last-axis reduction out of the rows kernel it belongs to."""
    text = "(input x f32 [130 70])\n(let r (Softmax (Permute x [1 0]) 1))\n(output r)\n"
    prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
    assert [k.kind for k in prog.kernels] == ["rows"]


# Swin's shifted windows: scores plus a permuted bias, viewed to five axes to add the mask
# per window and back to four for the softmax
WINDOW_MASK = (
    "(input s f32 [4 3 7 7])\n(input b f32 [7 7 3])\n(input m f32 [4 7 7])\n"
    "(let bp (View (Permute b [2 0 1]) [1 3 7 7]))\n(let a (Add s bp))\n"
    "(let a5 (View a [1 4 3 7 7]))\n(let m5 (View m [1 4 1 7 7]))\n(let am (Add a5 m5))\n"
    "(let r (Softmax (View am [4 3 7 7]) 3))\n"
)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_a_loop_read_through_reshapes_is_computed_inside_the_softmax(dtype, monkeypatch):
    """The adds, over (1, 4, 3, 7, 7), are computed inside the softmax over (4, 3, 7, 7)
    that reads them through views: the same flat order, operands read right-aligned. In a
    half type the adds' body ends in its rounding, so the value is the one stored: float16
    gives the bits of the program that writes the adds (bfloat16: the CUDA simulator's
    ``run_half_row_producers``, the numpy evaluator having no bfloat16)."""
    graph, prog = program(WINDOW_MASK.replace("f32", dtype) + "(output r)\n")
    assert kinds(prog) == ["rows"], prog.to_text()
    assert not [s for s in prog.steps if s.kind == "view" and s.shape == (1, 4, 3, 7, 7)]
    if dtype == "f32":
        check_values(graph, prog)
    elif dtype == "f16":
        text = WINDOW_MASK.replace("f32", dtype) + "(output r)\n"
        same_bits_as_written(text, graph, prog, ["loop", "rows"], monkeypatch, 0, 600, 17)


def same_bits_as_written(text, graph, prog, apart_kinds, monkeypatch, seed, n, every) -> None:
    """Float16 ``prog`` gives the bits of the program that writes its loops (what
    ``inline_row_producers`` declines when a loop does not store its value in float32:
    here made to decline every float16 loop), on inputs with an infinity every ``every``."""
    monkeypatch.setattr(kernel_fusion, "stores_its_value", lambda k: k.dtype == "f32")
    _, apart = program(text)
    assert kinds(apart) == apart_kinds, apart.to_text()
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float16)
    x[::every] = np.inf
    inputs = {v.name: x[: np.prod(v.shape)].reshape(v.shape) for v in graph.inputs()}
    (fused,), (written,) = ev.eval_program(prog, inputs), ev.eval_program(apart, inputs)
    assert fused.view(np.uint16).tolist() == written.view(np.uint16).tolist()


def test_a_loop_whose_reshape_is_also_an_output_is_written():
    graph, prog = program(WINDOW_MASK + "(output r am)\n")
    assert kinds(prog) == ["loop", "rows"], prog.to_text()
    check_values(graph, prog)


def test_a_loop_reading_a_channel_of_more_axes_than_the_rows_is_written():
    """A per-head scale over (1, 1, 3, 1, 1) is read at ``(i // r) % m`` with ``r`` from the
    loop's own axes: a rows kernel over four axes would compute another ``r``."""
    text = WINDOW_MASK.replace(
        "(let am (Add a5 m5))",
        "(input c f32 [3 1 1])\n(let am (Mul (Add a5 m5) (View c [1 1 3 1 1])))",
    )
    graph, prog = program(text + "(output r)\n")
    assert kinds(prog) == ["loop", "rows"], prog.to_text()
    check_values(graph, prog)


# Swin at batch 2: the mask is added per image and window, over (2, 4, 3, 7, 7), and read
# by the softmax over (8, 3, 7, 7)
BATCHED = (
    WINDOW_MASK.replace("[4 3 7 7])\n(input b", "[8 3 7 7])\n(input b")
    .replace("[1 4 3 7 7]", "[2 4 3 7 7]")
    .replace("(View am [4 3 7 7])", "(View am [8 3 7 7])")
)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_softmax_runs_over_the_finer_grid_of_the_loops_it_reads(dtype, monkeypatch):
    """The softmax takes the mask add's grid (it splits the softmax's axes other than the
    row) and computes both adds inside; the bias add, over the softmax's own grid, is read
    at the same flat index. Float16: the bits of the program that writes the adds."""
    assert "(input s f32 [8 3 7 7])" in BATCHED and "(View am [8 3 7 7])" in BATCHED
    text = BATCHED.replace("f32", dtype) + "(output r)\n"
    graph, prog = program(text)
    assert kinds(prog) == ["rows"], prog.to_text()
    (k,) = prog.kernels
    assert tuple(k.domain) == (2, 4, 3, 7, 7) and tuple(k.shape) == (8, 3, 7, 7)
    if dtype == "f32":
        check_values(graph, prog)
        return
    same_bits_as_written(text, graph, prog, ["loop", "loop", "rows"], monkeypatch, 1, 2000, 13)


def test_a_channel_of_the_finer_grid_is_read_there():
    """A per-head scale over (1, 1, 3, 1, 1) is read at ``(i // r) % m`` with ``r`` from
    the finer grid's axes, which the softmax now runs over."""
    text = BATCHED.replace(
        "(let am (Add a5 m5))",
        "(input c f32 [3 1 1])\n(let am (Mul (Add a5 m5) (View c [1 1 3 1 1])))",
    )
    graph, prog = program(text + "(output r)\n")
    assert kinds(prog) == ["rows"], prog.to_text()
    check_values(graph, prog)


def test_a_per_row_operand_keeps_the_softmax_on_its_own_grid():
    """A value per row of the softmax's grid, (8, 3, 7, 1), would split into (2, 4, 3, 7,
    1): read right-aligned without a view it is another value, so the softmax keeps its
    grid and both adds stay loops (the bias add is read by the mask add, not the softmax)."""
    text = BATCHED.replace(
        "(let r (Softmax (View am [8 3 7 7]) 3))",
        "(input t f32 [8 3 7 1])\n(let r (Softmax (Add (View am [8 3 7 7]) t) 3))",
    )
    graph, prog = program(text + "(output r)\n")
    assert kinds(prog) == ["loop", "loop", "rows"], prog.to_text()
    assert tuple(prog.kernels[-1].domain) == (8, 3, 7, 7)
    check_values(graph, prog)
