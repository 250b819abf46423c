"""Data movement in the compiler: row takes (``Take``: embedding, index_select, x[index])
and two-operand concatenations (``Cat``), each placed as one device kernel that moves
bits, declined for dtypes the target has no kernel for, and evaluated by the reference
evaluator (takes with PyTorch's range check)."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat import optable as ot
from saturn.eqsat.errors import GraphError
from saturn.eqsat.evaluate import eval_program
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

TEXT = """(input table {d} [10 4])
(input idx {i} [2 3])
(let t (Take table idx))
(let r (Add t t))
(output r)
"""


def compiled(dtype: str, machine: str, index: str = "i64"):
    graph = parse_graph(TEXT.format(d=dtype, i=index))
    return compile_graph(graph, machine=machine, io_on_device=machine == "gpu")


def special_table(dtype: str) -> np.ndarray:
    t = np.arange(40, dtype=np.float64).reshape(10, 4) - 20
    t[0] = [np.nan, np.inf, -np.inf, -0.0]
    return t.astype(ot.NUMPY_DTYPE[dtype])


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
@pytest.mark.parametrize("index", ["i32", "i64"])
def test_a_take_is_one_device_kernel_and_keeps_every_value(machine, index):
    c = compiled("f32", machine, index)
    kinds = [k.kind for k in c.program.kernels]
    assert kinds == ["gather", "loop"] and c.program.count("host") == 0, c.program.to_text()
    table = special_table("f32")
    idx = np.array([[0, 9, 0], [3, 0, 1]], dtype=ot.NUMPY_DTYPE[index])
    (got,) = eval_program(c.program, {"table": table, "idx": idx})
    want = table[idx] + table[idx]
    np.testing.assert_array_equal(got, want)  # NaN in place, both infinities, -0.0 + -0.0
    assert np.signbit(got[0, 0, 3])


def test_half_tables_take_on_the_gpu_and_stay_on_the_host_of_the_reference_device():
    gpu = compiled("f16", "gpu")
    assert [k.kind for k in gpu.program.kernels][:1] == ["gather"]
    ref = compiled("f16", "cpu-reference")
    hosts = [s.op for s in ref.program.steps if s.kind == "host"]
    assert "Take" in hosts and all(k.kind != "gather" for k in ref.program.kernels)


def test_an_index_out_of_range_raises_in_the_evaluator():
    c = compiled("f32", "cpu-reference")
    table = special_table("f32")
    for bad in (10, -1):
        idx = np.array([[0, 1, 2], [3, bad, 1]], dtype=np.int64)
        with pytest.raises(IndexError, match="out of range for a table of 10 rows"):
            eval_program(c.program, {"table": table, "idx": idx})


@pytest.mark.parametrize(
    "text, message",
    [
        ("(input t f32 [10 4 2])\n(input i i64 [3])\n(let r (Take t i))", "2-D table"),
        ("(input t f32 [10 4])\n(input i f32 [3])\n(let r (Take t i))", "i32 or i64"),
        ("(input t f32 [10 4])\n(input i bool [3])\n(let r (Take t i))", "i32 or i64"),
    ],
)
def test_ill_typed_takes_are_graph_errors(text, message):
    with pytest.raises(GraphError, match=message):
        parse_graph(text + "\n(output r)\n")


CAT = """(input a {d} [2 1 4])
(input b {d} [2 5 4])
(let c (Cat a b 1))
(let r (Mul c c))
(output r)
"""


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
def test_a_concatenation_is_one_device_kernel_and_keeps_every_value(machine):
    c = compile_graph(
        parse_graph(CAT.format(d="f32")), machine=machine, io_on_device=machine == "gpu"
    )
    assert [k.kind for k in c.program.kernels] == ["concat", "loop"], c.program.to_text()
    assert c.program.count("host") == 0
    a = np.array([np.nan, np.inf, -np.inf, -0.0] * 2, dtype=np.float32).reshape(2, 1, 4)
    b = np.arange(40, dtype=np.float32).reshape(2, 5, 4) - 20
    (got,) = eval_program(c.program, {"a": a, "b": b})
    cat = np.concatenate([a, b], axis=1)
    np.testing.assert_array_equal(got, cat * cat)


def test_half_concatenations_stay_on_the_host_of_the_reference_device():
    ref = compile_graph(parse_graph(CAT.format(d="f16")), machine="cpu-reference")
    assert "Cat" in [s.op for s in ref.program.steps if s.kind == "host"]
    gpu = compile_graph(parse_graph(CAT.format(d="f16")), machine="gpu", io_on_device=True)
    assert "concat" in [k.kind for k in gpu.program.kernels]


@pytest.mark.parametrize(
    "text, message",
    [
        ("(input a f32 [2 3])\n(input b f32 [3 3])\n(let r (Cat a b 1))", "sizes differ"),
        ("(input a f32 [2 3])\n(input b f32 [2 3 1])\n(let r (Cat a b 0))", "cat of"),
        ("(input a f32 [2 3])\n(input b i64 [2 3])\n(let r (Cat a b 0))", "differ"),
    ],
)
def test_ill_typed_concatenations_are_graph_errors(text, message):
    with pytest.raises(GraphError, match=message):
        parse_graph(text + "\n(output r)\n")


PAD = """(input x {d} [2 3 4])
(let p (Pad x [0 0 1 2 0 1] {v}))
(let r (Add p p))
(output r)
"""


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
def test_a_pad_is_one_device_kernel_and_keeps_every_value(machine):
    c = compile_graph(
        parse_graph(PAD.format(d="f32", v="-inf")), machine=machine, io_on_device=True
    )
    assert [k.kind for k in c.program.kernels] == ["pad", "loop"], c.program.to_text()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 12
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -0.0]
    (got,) = eval_program(c.program, {"x": x})
    p = np.pad(x, [(0, 0), (1, 2), (0, 1)], constant_values=-np.inf)
    np.testing.assert_array_equal(got, p + p)


def test_half_pads_stay_on_the_host_of_the_reference_device():
    ref = compile_graph(parse_graph(PAD.format(d="f16", v="0.0")), machine="cpu-reference")
    assert "Pad" in [s.op for s in ref.program.steps if s.kind == "host"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("(input x f32 [2 3])\n(let r (Pad x [0 0 -1 1] 0.0))", ">= 0"),
        ("(input x f32 [2 3])\n(let r (Pad x [1 1] 0.0))", "per axis"),
    ],
)
def test_ill_formed_pads_are_graph_errors(text, message):
    with pytest.raises(GraphError, match=message):
        parse_graph(text + "\n(output r)\n")


ADD_TEXT = """(input table {d} [6 3])
(input idx {i} [5])
(input vals {d} [5 3])
(let r (IndexAdd table idx vals))
(output r)
"""


def compiled_add(dtype: str, machine: str, index: str = "i64"):
    graph = parse_graph(ADD_TEXT.format(d=dtype, i=index))
    return compile_graph(graph, machine=machine, io_on_device=True)


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
@pytest.mark.parametrize("dtype", ["f32", "i64"])
def test_rows_added_at_an_index_are_one_device_kernel(machine, dtype):
    c = compiled_add(dtype, machine)
    kinds = [k.kind for k in c.program.kernels]
    assert kinds == ["scatter"] and c.program.count("host") == 0, c.program.to_text()
    table = np.arange(18).reshape(6, 3).astype(ot.NUMPY_DTYPE[dtype])
    vals = (np.arange(15).reshape(5, 3) * 3 - 7).astype(ot.NUMPY_DTYPE[dtype])
    idx = np.array([1, 5, 1, -1, 0])  # a repeated row, and -1 the last row
    (got,) = eval_program(c.program, {"table": table, "idx": idx, "vals": vals})
    want = table.copy()
    for i, r in enumerate(idx):
        want[r] += vals[i]
    np.testing.assert_array_equal(got, want)


def test_rows_added_keep_nan_infinities_and_negative_zero():
    c = compiled_add("f32", "gpu")
    table = np.array([[-0.0, 1, 2], [3, 4, 5]] * 3, dtype=np.float32)
    vals = np.array([[-0.0, np.inf, np.nan]] * 2 + [[0.0, -np.inf, 1]] * 3, dtype=np.float32)
    idx = np.array([0, 2, 2, 4, 1])
    (got,) = eval_program(c.program, {"table": table, "idx": idx, "vals": vals})
    assert np.signbit(got[0, 0]) and got[0, 0] == 0  # -0.0 + -0.0 stays -0.0
    assert got[2, 0] == 0 and not np.signbit(got[2, 0])  # -0.0 + (-0.0) + 0.0 is +0.0
    assert np.isnan(got[2, 1])  # +inf and -inf meet: NaN in any order
    assert np.isnan(got[0, 2]) and got[0, 1] == np.inf and got[1, 1] == -np.inf


def test_rows_added_decline_half_tables_and_raise_out_of_range():
    for machine in ("gpu", "cpu-reference"):  # no atomic add kernel for half types
        c = compiled_add("bf16", machine)
        hosts = [s.op for s in c.program.steps if s.kind == "host"]
        assert "IndexAdd" in hosts and not c.program.kernels, c.program.to_text()
    c = compiled_add("f32", "cpu-reference")
    args = {
        "table": np.zeros((6, 3), np.float32),
        "idx": np.array([0, 1, 6, 2, 3]),
        "vals": np.ones((5, 3), np.float32),
    }
    with pytest.raises(IndexError, match="out of range"):
        eval_program(c.program, args)
    args["idx"] = np.array([0, 1, -7, 2, 3])
    with pytest.raises(IndexError, match="out of range"):
        eval_program(c.program, args)


def test_index_add_shapes_are_checked_when_the_graph_is_read():
    bad = ADD_TEXT.format(d="f32", i="i64").replace("vals f32 [5 3]", "vals f32 [4 3]")
    with pytest.raises(GraphError, match="a row per index"):
        compile_graph(parse_graph(bad), machine="gpu")


EMBED = """(input table {d} [10 8])
(input idx i64 [2 3])
(input pos f32 [3 8])
(param w f32 [8])
(param b f32 [8])
(let t {take})
(let r (LayerNorm (Add t pos) w b [2] 1e-05))
(output r{more})
"""


def fused_take(text: str):
    c = compile_graph(parse_graph(text), machine="gpu", io_on_device=True)
    return c.program, [k for k in c.program.kernels if "take" in k.attrs]


def test_a_take_read_only_by_a_layer_norm_is_read_inside_it():
    """The embedding block: the rows kernel reads the token rows from the table at the
    ids (``fuse_row_takes``); no gather kernel, no taken tensor in memory. The reference
    evaluator runs it as the gather it replaced, special values included, and raises on
    an id out of range as the gather does."""
    prog, fused = fused_take(EMBED.format(d="f32", take="(Take table idx)", more=""))
    assert [k.kind for k in prog.kernels] == ["rows"] and len(fused) == 1, prog.to_text()
    (k,) = fused
    t, x = k.attrs["take"]
    assert (k.inputs[t].indexing, k.inputs[x].indexing) == ("table", "rowindex")
    assert k.covers == ["r"] and "t" in k.fused  # the take is computed inside
    table = special_table("f32")
    table = np.concatenate([table, table], axis=1)  # rows of 8
    idx = np.array([[0, 9, 0], [3, 0, 1]], dtype=np.int64)
    rng = np.random.default_rng(0)
    pos = rng.standard_normal((3, 8)).astype(np.float32)
    w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    inputs = {"table": table, "idx": idx, "pos": pos, "w": w, "b": b}
    (got,) = eval_program(prog, inputs)
    ref = compile_graph(
        parse_graph(EMBED.format(d="f32", take="(Take table idx)", more="")),
        machine="cpu-reference",
    )
    (want,) = eval_program(ref.program, inputs)
    np.testing.assert_array_equal(got, want)  # NaN rows stay NaN, the same arithmetic
    with pytest.raises(IndexError, match="out of range"):
        eval_program(prog, {**inputs, "idx": np.array([[0, 1, 2], [3, 10, 1]])})


@pytest.mark.parametrize(
    "take, more, why",
    [
        ("(Take table idx)", " t", "the taken rows are an output too"),
        ("(Take (Permute tt [1 0]) idx)", "", "the table is a view (read through strides)"),
        ("(Take table (View idx6 [2 3]))", "", "the index is a view"),
    ],
)
def test_a_take_stays_a_gather_where_the_rows_kernel_cannot_read_it(take, more, why):
    text = EMBED.format(d="f32", take=take, more=more)
    text = "(input tt f32 [8 10])\n(input idx6 i64 [6])\n" + text
    prog, fused = fused_take(text)
    assert not fused and "gather" in [k.kind for k in prog.kernels], (why, prog.to_text())


@pytest.mark.parametrize(
    ("table", "fused"),
    [("bf16", True), ("f16", True), ("f64", True), ("i32", False), ("i64", False)],
)
def test_which_tables_a_rows_kernel_takes_from(table, fused):
    """Half and float tables are read inside (into float32, as the rows kernel reads any
    half operand); an integer table converted inside the rows kernel keeps its gather:
    the kernel's zero row for an id out of range is typed as its float reads."""
    text = EMBED.format(d=table, take="(Cast (Take table idx) f32)", more="")
    prog, got = fused_take(text)
    kinds = [k.kind for k in prog.kernels]
    assert bool(got) == fused and ("gather" in kinds) != fused, prog.to_text()
