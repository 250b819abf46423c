"""saturn:0's step loop and the GPU runner each cover the kernel kinds their machine forms
(``eqsat/kinds/``): a kind added to the registry without its runners fails here."""

from __future__ import annotations

import pytest
import torch

from saturn import gpu_runner, recipe
from saturn.codegen import launchers
from saturn.codegen.pad import fill_word, fits_32
from saturn.eqsat.graph import float_bits
from saturn.eqsat.kinds import SPECS, Kind


def test_saturn0_runs_every_kind_its_machine_forms():
    # the cpu-reference machine forms no rows kernels (its fusion stops at loops and sums),
    # so none of their statistics
    assert recipe.HOST_KERNELS.covers() == set(Kind) - {Kind.ROWS, Kind.ROW_STAT}


def test_the_gpu_runner_builds_and_launches_every_kind():
    assert gpu_runner.BUILD.covers() == set(Kind)
    assert gpu_runner.LAUNCH.covers() == set(Kind)


def test_every_emitter_module_registers_its_kinds_launcher():
    """A kind whose spec names an emitter gets its launcher from there (the runner names
    none of them); one without an emitter is refused by codegen's table."""
    emitted = [s for s in SPECS if s.emitter]
    assert {s.name for s in emitted} == {"gather", "scatter", "concat", "pad", "roll"}
    for s in emitted:
        __import__(s.emitter)
    assert launchers.LAUNCHERS.covers() == {s.name for s in emitted}
    loop = type("K", (), {"kind": Kind.LOOP})()
    with pytest.raises(NotImplementedError, match="no launcher of its own for loop"):
        launchers.launcher(loop, (9, 0))


DTYPES = {
    "bool": torch.bool,
    "u8": torch.uint8,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
}


def _torch_word(value: float, dtype: str) -> int:
    t = torch.tensor(value, dtype=torch.float64).to(DTYPES[dtype])
    size = t.element_size()
    word = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])
    return int(word.item()) if size == 8 else int(word.item()) & ((1 << (8 * size)) - 1)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_pads_constant_is_the_bits_pytorch_converts_it_to(dtype):
    """codegen's conversion (numpy, no torch) against PyTorch's, for both zeros, the
    infinities, NaN, values that round differently through float32 than directly (half
    types) and ties; integers at values in their range."""
    floats = [0.0, -0.0, 1.0, -1.0, 0.1, -3.7, 1 / 3, 65504.0, 65520.0, 1e-8, 1e-45, 3e38]
    floats += [1.00390625, 1.0039062500001, 1.01171875, 2.0**-24 * 1.5, 1e300, -1e300]
    floats += [float("inf"), float("-inf"), float("nan")]
    ints = [0.0, 1.0, 7.9, -7.9, 100.0, -100.0, 127.0]
    values = floats if dtype in ("bool", "f16", "bf16", "f32", "f64") else ints
    if dtype == "u8":
        values = [v for v in values if v >= 0]
    for v in values:
        assert fill_word(float_bits(v), dtype) == _torch_word(v, dtype), v


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def launch(self, *args) -> None:
        self.calls.append(args)


class _Context:
    err_ptr = 4242

    def __init__(self) -> None:
        self.copies: list[tuple] = []

    def copy(self, src, dst) -> None:
        self.copies.append((src.data_ptr(), dst.data_ptr()))


def _kernel(kind, inputs, shape, attrs=None):
    from saturn.eqsat.program import Kernel, Operand

    ops = [Operand(f"in{i}", d, s, "strided") for i, (d, s) in enumerate(inputs)]
    return Kernel(kind, "out", inputs[0][0], shape, ops, None, shape, attrs or {})


def test_codegens_launchers_pass_each_kernel_its_operands_as_they_lie():
    """The launchers the GPU runner builds for codegen's kinds, run without a GPU: each
    hands its kernel the output's and operands' addresses, shapes and strides (a
    transposed operand as it lies), the runner's error word where the kind reads at
    indices, and a row add copies its table into the output first."""
    from saturn.codegen.concat import ConcatLauncher
    from saturn.codegen.pad import PadLauncher
    from saturn.codegen.scatter_add import ScatterAddLauncher
    from saturn.codegen.take import TakeLauncher

    cc, ctx = (9, 0), _Context()
    table, ids = torch.zeros(6, 4).t(), torch.zeros(3, dtype=torch.int64)  # table: [4, 6]
    out = torch.zeros(3, 6)
    la = launchers.launcher(_kernel(Kind.GATHER, [("f32", (4, 6)), ("i64", (3,))], (3, 6)), cc)
    assert isinstance(la, TakeLauncher) and la.expected() == []
    la.kernel = rec = _Recorder()
    la.launch(7, out, [table, ids], ctx)
    ptrs = (out.data_ptr(), table.data_ptr(), ids.data_ptr(), 4242)
    assert rec.calls == [(7, ptrs, ((4, 6), (1, 4)), ((3,), (1,)))]

    base, values = torch.zeros(5, 4), torch.zeros(3, 4)
    k = _kernel(Kind.SCATTER, [("f32", (5, 4)), ("i64", (3,)), ("f32", (3, 4))], (5, 4))
    la = launchers.launcher(k, cc)
    assert isinstance(la, ScatterAddLauncher)
    la.kernel = rec = _Recorder()
    out = torch.zeros(5, 4)
    la.launch(7, out, [base, ids, values], ctx)
    assert ctx.copies == [(base.data_ptr(), out.data_ptr())]
    ptrs = (out.data_ptr(), values.data_ptr(), ids.data_ptr(), 4242)
    assert rec.calls == [(7, ptrs, 5, ((3, 4), (4, 1)), ((3,), (1,)))]

    a, b = torch.zeros(2, 3), torch.zeros(3, 2).t()
    k = _kernel(Kind.CONCAT, [("bf16", (2, 3)), ("bf16", (2, 3))], (2, 6), {"dim": 1})
    la = launchers.launcher(k, cc)
    assert isinstance(la, ConcatLauncher) and la.kernel.width == 2 and la.kernel.dim == 1
    assert la.expected() == la.kernel.expected()
    la.kernel = rec = _Recorder()
    out = torch.zeros(2, 6)
    la.launch(7, out, [a, b], ctx)
    ptrs = (out.data_ptr(), a.data_ptr(), b.data_ptr())
    assert rec.calls == [(7, ptrs, ((2, 3), (3, 1)), ((2, 3), (1, 2)))]

    x = torch.zeros(2, 3)
    bits = float_bits(float("-inf"))
    k = _kernel(Kind.PAD, [("f16", (2, 3))], (2, 5), {"pads": (0, 0, 1, 1), "value_bits": bits})
    la = launchers.launcher(k, cc)
    # the traced layout's indices fit 32 bits: the narrow variant is the one built first
    assert isinstance(la, PadLauncher) and la.expected() == [la.kernel.narrow.g]
    # past 2^31 elements (or a span, or a pad, that large): the 64-bit variant
    assert fits_32((2, 3), (3, 1), (0, 0, 1, 1))
    assert not fits_32((2**16, 2**15), (2**15, 1), (0, 0, 0, 0))
    assert not fits_32((2, 3), (3, 1), (0, 0, 2**31, 0))
    assert la.fill == 0xFC00  # float16's -inf
    la.kernel = rec = _Recorder()
    out = torch.zeros(2, 5)
    la.launch(7, out, [x], ctx)
    assert rec.calls == [
        (7, (out.data_ptr(), x.data_ptr()), ((2, 3), (3, 1)), (0, 0, 1, 1), 0xFC00)
    ]
