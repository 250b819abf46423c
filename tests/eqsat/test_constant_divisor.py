"""Integer remainder and floor division by a constant divisor (optable.CONSTANT_DIVISOR):
a device loop when the divisor is a Scalar b with 1 <= b <= 2^53 that fits the dtype, as
``take_along_dim`` wraps its index (``remainder(index, n)``); any other integer divisor is
a type error in a graph (the importer leaves such a call as PyTorch's op, which raises on a
zero divisor). Values from the reference evaluator, floored as Python and PyTorch floor
integers, at both ends of int64; floats are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat import optable as ot
from saturn.eqsat.errors import GraphError
from saturn.eqsat.evaluate import eval_graph, eval_program
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

I64 = np.iinfo(np.int64)
EXTREMES = [I64.min, I64.min + 1, -7, -5, -1, 0, 1, 4, 5, 7, I64.max - 1, I64.max]


def program(text: str, machine: str = "gpu"):
    graph = parse_graph(text)
    return graph, compile_graph(graph, machine=machine, io_on_device=True).program


def one(op: str, divisor: str, dtype: str = "i64", n: int = 12) -> str:
    return f"(input x {dtype} [{n}])\n(let r ({op} x (Scalar {divisor} {dtype})))\n(output r)\n"


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
@pytest.mark.parametrize("op,divisor", [("Remainder", 5), ("FloorDiv", 5), ("Remainder", 2**53)])
def test_an_integer_division_by_a_constant_is_one_device_loop(machine, op, divisor):
    graph, prog = program(one(op, str(divisor)), machine)
    assert [s.kind for s in prog.steps] == ["input", "kernel"], prog.to_text()
    x = np.array(EXTREMES, dtype=np.int64)
    (got,) = eval_program(prog, {"x": x})
    (want,) = eval_graph(graph, {"x": x})
    python = [v % divisor if op == "Remainder" else v // divisor for v in EXTREMES]
    assert got.dtype == np.int64 and got.tolist() == want.tolist() == python


def test_int32_by_a_constant_runs_on_the_device():
    _, prog = program(one("FloorDiv", "3", "i32", 8))
    assert [s.kind for s in prog.steps] == ["input", "kernel"], prog.to_text()
    x = np.array([-(2**31), -4, -3, -1, 0, 2, 3, 2**31 - 1], dtype=np.int32)
    (got,) = eval_program(prog, {"x": x})
    assert got.dtype == np.int32 and got.tolist() == [v // 3 for v in x.tolist()]


def test_narrow_integers_by_a_constant_stay_on_the_host():
    """int16 is not a device dtype: the op is valid, and placed on the host."""
    _, prog = program(one("Remainder", "5", "i16", 6))
    assert "host" in [s.kind for s in prog.steps] and not prog.kernels, prog.to_text()
    x = np.array([-(2**15), -7, -1, 0, 7, 2**15 - 1], dtype=np.int16)
    (got,) = eval_program(prog, {"x": x})
    assert got.tolist() == [v % 5 for v in x.tolist()]


@pytest.mark.parametrize(
    "text",
    [
        one("Remainder", "0"),  # PyTorch raises on an integer zero divisor
        one("FloorDiv", "0"),
        one("Remainder", "-3"),  # negative divisors are left to PyTorch
        one("FloorDiv", "-1"),  # INT64_MIN // -1 overflows
        one("Remainder", "2.5"),
        one("Remainder", str(2**54)),  # past 2^53: not exact as the Scalar's float64
        one("Remainder", "200", "i8"),  # does not fit the dtype
        "(input x i64 [4])\n(input d i64 [4])\n(let r (Remainder x d))\n(output r)\n",
    ],
    ids=["zero", "zero-floordiv", "negative", "minus-one", "fraction", "past-2^53", "i8", "tensor"],
)
def test_other_integer_divisors_are_type_errors(text):
    with pytest.raises(GraphError, match="Scalar divisor"):
        parse_graph(text)


def test_float_divisors_are_unchanged():
    """Floats take any divisor, tensors and zeros included (PyTorch's float rules)."""
    text = "(input x f32 [4])\n(input d f32 [4])\n(let r (Remainder x d))\n(output r)\n"
    graph, prog = program(text)
    assert [s.kind for s in prog.steps] == ["input", "input", "kernel"], prog.to_text()
    x = np.array([5.5, -5.5, 1.0, -0.0], dtype=np.float32)
    d = np.array([2.0, 2.0, 0.0, 3.0], dtype=np.float32)
    (got,) = eval_program(prog, {"x": x, "d": d})
    (want,) = eval_graph(graph, {"x": x, "d": d})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "value,dtype,ok",
    [
        (1, "i64", True),
        (2**53, "i64", True),
        (2**53 + 1, "i64", False),  # an int compared as itself, not rounded to 2^53
        (float(2**53 + 1), "i64", True),  # that float is 2^53
        (127, "i8", True),
        (128, "i8", False),
        (255, "u8", True),
        (0, "i32", False),
        (-2, "i32", False),
        (3.5, "i32", False),
        (float("inf"), "i64", False),
        (float("nan"), "i64", False),
        (3, "f32", False),  # floats are not CONSTANT_DIVISOR's business
    ],
)
def test_constant_divisor(value, dtype, ok):
    assert ot.constant_divisor(value, dtype) is ok
