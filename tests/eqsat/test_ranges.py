"""Index bounds (eqsat/ranges.py): a row take or row add whose index the program clamps or
makes as an in-range ``Arange`` needs no bounds check after the call; every other index
keeps it, including clamps one row too wide, wrap-around in narrow integers and indices
that are inputs."""

from __future__ import annotations

import math

import pytest

from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph
from saturn.eqsat.ranges import UNBOUNDED, indices_in_range, value_bounds


def program(text: str):
    return compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program


def movement(prog):
    kinds = ("gather", "scatter")
    (s,) = [s for s in prog.steps if s.kernel is not None and s.kernel.kind in kinds]
    return s


def add_rows(index: str, dtype: str = "i64") -> str:
    return (
        f"(input table f32 [10 4])\n(input ids {dtype} [2 3])\n(input vals f32 [6 4])\n"
        f"(let r (IndexAdd table (View {index} [6]) vals))\n(output r)\n"
    )


def take_rows(index: str, dtype: str = "i64") -> str:
    return (
        f"(input table f32 [10 4])\n(input ids {dtype} [2 3])\n"
        f"(let r (Take table {index}))\n(output r)\n"
    )


def clamp(lo: int, hi: int, dtype: str = "i64") -> str:
    return f"(Minimum (Maximum ids (Scalar {lo} {dtype})) (Scalar {hi} {dtype}))"


@pytest.mark.parametrize(
    "text,bounded",
    [
        (add_rows(clamp(-10, 9)), True),  # an embedding backward's clamp: negatives wrap
        (add_rows(clamp(-11, 9)), False),  # one row too low
        (add_rows(clamp(-10, 10)), False),  # one row too high
        (add_rows("ids"), False),  # an input: anything
        (take_rows(clamp(0, 9)), True),
        (take_rows(clamp(-1, 9)), False),  # takes do not wrap
        (take_rows(f"(Sub (Scalar 9 i64) {clamp(0, 9)})"), True),  # a reversed clamp
        (take_rows("(Where (Lt ids (Scalar 0 i64)) (Scalar 0 i64) (Scalar 9 i64))"), True),
        (take_rows("(Add ids (Scalar 1 i64))"), False),
    ],
)
def test_indices_in_range(text, bounded):
    prog = program(text)
    assert indices_in_range(prog, movement(prog)) is bounded, prog.to_text()


def wrap(n: int, dtype: str = "i64") -> str:
    return f"(Remainder ids (Scalar {n} {dtype}))"


@pytest.mark.parametrize(
    "index,bounded",
    [
        (wrap(10), True),  # take_along_dim's wrap: [0, 10)
        (wrap(11), False),  # one row too many
        (f"(FloorDiv {clamp(0, 29)} (Scalar 3 i64))", True),  # [0, 9]
        (f"(FloorDiv {clamp(0, 30)} (Scalar 3 i64))", False),  # [0, 10]
        (f"(FloorDiv {clamp(-3, 29)} (Scalar 3 i64))", False),  # floored: -1
        (f"(Fmod {clamp(0, 40)} (Scalar 10 i64))", True),  # truncated, nonnegative: [0, 9]
        (f"(Fmod {clamp(-1, 40)} (Scalar 10 i64))", False),  # the dividend's sign: -1
        (f"(Fmod {clamp(0, 40)} (Scalar 11 i64))", False),  # [0, 10]
        (f"(Mul {clamp(0, 4)} (Scalar 2 i64))", True),  # [0, 8]
        (f"(Mul {clamp(0, 5)} (Scalar 2 i64))", False),  # [0, 10]
        (f"(Mul {clamp(-1, 4)} {clamp(-1, 4)})", False),  # [-4, 16]
        # a condition every value decides the same way takes its branch's bounds alone
        (f"(Where (Lt {wrap(10)} (Scalar 10 i64)) {wrap(10)} (Scalar 99 i64))", True),
        (f"(Where (Ge {wrap(10)} (Scalar 0 i64)) {wrap(10)} (Scalar 99 i64))", True),
        (f"(Where (Eq {wrap(10)} (Scalar 10 i64)) (Scalar 99 i64) {wrap(10)})", True),
        (f"(Where (Lt {wrap(10)} (Scalar 9 i64)) {wrap(10)} (Scalar 99 i64))", False),
        (f"(Where (Lt ids (Scalar 10 i64)) {wrap(10)} (Scalar 99 i64))", False),
    ],
)
def test_wrapped_scaled_and_selected_indices(index, bounded):
    """Remainder and floor division by a constant, products, and a ``where`` whose
    condition the bounds decide (how ``gather``'s flat positions avoid their sentinel)."""
    prog = program(take_rows(index))
    assert indices_in_range(prog, movement(prog)) is bounded, prog.to_text()


def test_reversed_arange_takes_are_bounded():
    prog = program("(input t f32 [5 3])\n(let r (Take t (Arange 4 -1 5 i64)))\n(output r)\n")
    assert indices_in_range(prog, movement(prog)), prog.to_text()


def test_arithmetic_that_can_wrap_around_is_unbounded():
    """int32 arithmetic past 2^31 - 1 wraps to negative numbers: the interval (5, 2^31 + 3)
    would not hold the values, so it is not kept; the same sum in int64 is."""
    big = 2**31 - 2
    for dtype, want in (("i32", UNBOUNDED), ("i64", (5.0, float(big + 5)))):
        text = (
            f"(input ids {dtype} [6])\n"
            f"(let r (Add {clamp(0, big, dtype)} (Scalar 5 {dtype})))\n(output r)\n"
        )
        prog = program(text)
        (k,) = [s for s in prog.steps if s.kind == "kernel"]
        assert value_bounds(prog, k.output) == want, prog.to_text()


def test_float_values_are_not_bounded():
    prog = program("(input x f32 [6])\n(let r (Minimum x (Scalar 3 f32)))\n(output r)\n")
    (k,) = [s for s in prog.steps if s.kind == "kernel"]
    assert value_bounds(prog, k.output) == (-math.inf, math.inf)


def take_in_layer_norm(index: str) -> str:
    return (
        "(input table f32 [10 8])\n(input ids i64 [2 3])\n(param w f32 [8])\n"
        f"(param b f32 [8])\n(let r (LayerNorm (Take table {index}) w b [2] 1e-05))\n(output r)\n"
    )


@pytest.mark.parametrize(
    "index,bounded",
    [(clamp(0, 9), True), (clamp(0, 10), False), ("ids", False)],
    ids=["clamped", "one-row-too-high", "input"],
)
def test_a_take_read_inside_a_rows_kernel_is_bounded_as_a_take(index, bounded):
    """The rows kernel reading the take's rows (fuse_row_takes) checks its index as the
    take would have: [0, rows), the caller's ids unbounded."""
    prog = program(take_in_layer_norm(index))
    (s,) = [s for s in prog.steps if s.kernel is not None and "take" in s.kernel.attrs]
    assert indices_in_range(prog, s) == bounded, prog.to_text()
