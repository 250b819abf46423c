"""The column-major mapping of half-precision products (codegen.cublaslt.lt_problem), run
on numpy buffers as cuBLASLt reads them: every layout a product takes as stored gives
``a @ b``, and layouts it cannot read are refused with a reason."""

import numpy as np
import pytest

from saturn.codegen.cublaslt import _N, _T, lt_problem, simulate
from saturn.codegen.gemm import GemmError, Layout


def _operand(rng, shape, order, pad=0):
    """A buffer holding a ``shape`` matrix (batched when 3-D) laid out ``order``: "row"
    (packed rows), "col" (packed columns), with ``pad`` unused elements per leading row."""
    *batch, r, c = shape
    if order == "row":
        strides = (c + pad, 1)
        per = r * (c + pad)
    else:
        strides = (1, r + pad)
        per = c * (r + pad)
    nb = batch[0] if batch else 1
    buf = rng.standard_normal(nb * per).astype(np.float32)
    full = ((per,) if batch else ()) + strides
    lay = Layout("f32", tuple(shape), full)
    view = np.lib.stride_tricks.as_strided(buf, shape, tuple(s * 4 for s in full))
    return buf, lay, view.copy()


@pytest.mark.parametrize("a_order", ["row", "col"])
@pytest.mark.parametrize("b_order", ["row", "col"])
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("pad", [0, 5])
def test_every_stored_layout_gives_the_product(a_order, b_order, batch, pad):
    rng = np.random.default_rng(7)
    m, k, n = 6, 4, 5
    lead = (batch,) if batch else ()
    abuf, alay, a = _operand(rng, (*lead, m, k), a_order, pad)
    bbuf, blay, b = _operand(rng, (*lead, k, n), b_order, pad)
    out_strides = ((m * (n + pad),) if batch else ()) + (n + pad, 1)
    olay = Layout("f32", (*lead, m, n), out_strides)
    dbuf = np.full((batch or 1) * m * (n + pad), np.nan, np.float32)
    p = lt_problem(alay, blay, olay)
    assert (p.m, p.n, p.k, p.batch) == (n, m, k, batch or 1)
    assert p.a.op == (_N if b_order == "row" else _T)  # saturn's b is the library's a
    assert p.b.op == (_N if a_order == "row" else _T)
    simulate(p, bbuf, abuf, dbuf)
    got = np.lib.stride_tricks.as_strided(dbuf, olay.shape, tuple(s * 4 for s in out_strides))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-6)
    if pad:  # the padding of the output's rows is never written
        rows = dbuf.reshape(-1, n + pad)
        assert np.isnan(rows[:, n:]).all()


def test_the_bias_is_per_output_feature():
    rng = np.random.default_rng(3)
    abuf, alay, a = _operand(rng, (7, 3), "row")
    bbuf, blay, b = _operand(rng, (3, 4), "col")  # a weight's transpose, as linear reads it
    bias = rng.standard_normal(4).astype(np.float32)
    dbuf = np.zeros(28, np.float32)
    p = lt_problem(alay, blay, Layout("f32", (7, 4), (4, 1)))
    simulate(p, bbuf, abuf, dbuf, bias=bias, relu=True)
    np.testing.assert_allclose(dbuf.reshape(7, 4), np.maximum(a @ b + bias, 0), rtol=1e-5)


def test_unit_axes_take_any_stride():
    # PyTorch gives a unit axis any stride (a row vector of a transposed matrix)
    p = lt_problem(
        Layout("f32", (1, 8), (3, 1)), Layout("f32", (8, 1), (1, 99)), Layout("f32", (1, 1), (7, 7))
    )
    assert p.d.ld >= p.d.rows and p.a.ld >= p.a.rows and p.b.ld >= p.b.rows


@pytest.mark.parametrize(
    "a, b, out, reason",
    [
        # a broadcast operand (stride 0) is neither row- nor column-major
        (((4, 3), (0, 1)), ((3, 2), (2, 1)), ((4, 2), (2, 1)), "operand a"),
        # every second column: no packed axis
        (((4, 3), (6, 2)), ((3, 2), (2, 1)), ((4, 2), (2, 1)), "operand a"),
        # a column-major output cannot be written as out^T
        (((4, 3), (3, 1)), ((3, 2), (2, 1)), ((4, 2), (1, 4)), "rows must be packed"),
        # rows overlapping each other
        (((4, 3), (3, 1)), ((3, 2), (1, 1)), ((4, 2), (2, 1)), "operand b"),
    ],
)
def test_layouts_it_cannot_read_are_refused(a, b, out, reason):
    lays = [Layout("f32", s, st) for s, st in ((a[0], a[1]), (b[0], b[1]), (out[0], out[1]))]
    with pytest.raises(GemmError, match=reason):
        lt_problem(*lays)


def test_overlapping_output_batches_are_refused():
    with pytest.raises(GemmError, match="overlap"):
        lt_problem(
            Layout("f32", (2, 3, 4), (12, 4, 1)),
            Layout("f32", (2, 4, 5), (20, 5, 1)),
            Layout("f32", (2, 3, 5), (5, 5, 1)),
        )


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"a": Layout("f32", (8, 4), (4, 1))}, "dtypes"),  # bf16 @ f32: no mixed products
        ({"bias": Layout("bf16", (6,), (2,))}, "packed bias"),
        ({"epilogue": "silu_bias"}, "unknown GEMM epilogue"),
        ({"epilogue": "none"}, "with a bias"),
        ({"a": Layout("i32", (8, 4), (4, 1)), "b": Layout("i32", (4, 6), (6, 1))}, "dtypes"),
    ],
)
def test_plans_refuse_what_cublaslt_cannot_take_before_touching_the_device(change, reason):
    from saturn.codegen.cublaslt import LtPlan

    args = {
        "a": Layout("bf16", (8, 4), (4, 1)),
        "b": Layout("bf16", (4, 6), (6, 1)),
        "out": Layout("bf16" if "i32" not in str(change) else "i32", (8, 6), (6, 1)),
        "epilogue": "bias",
        "bias": Layout("bf16", (6,), (1,)),
    }
    args.update(change)
    with pytest.raises(GemmError, match=reason):
        LtPlan(**args, ptrs=(0, 0, 0, 0), stream=0, workspace=(0, 0))
