"""saturn:0's step loop and the GPU runner each cover the kernel kinds their machine forms
(``eqsat/kinds/``): a kind added to the registry without its runners fails here."""

from __future__ import annotations

import pytest
import torch

from saturn import gpu_runner, recipe
from saturn.codegen import launchers
from saturn.codegen.pad import fill_word
from saturn.eqsat.graph import float_bits
from saturn.eqsat.kinds import SPECS, Kind


def test_saturn0_runs_every_kind_its_machine_forms():
    # the cpu-reference machine forms no rows kernels (its fusion stops at loops and sums)
    assert recipe.HOST_KERNELS.covers() == set(Kind) - {Kind.ROWS}


def test_the_gpu_runner_builds_and_launches_every_kind():
    assert gpu_runner.BUILD.covers() == set(Kind)
    assert gpu_runner.LAUNCH.covers() == set(Kind)


def test_every_emitter_module_registers_its_kinds_launcher():
    """A kind whose spec names an emitter gets its launcher from there (the runner names
    none of them); one without an emitter is refused by codegen's table."""
    emitted = [s for s in SPECS if s.emitter]
    assert {s.name for s in emitted} == {"gather", "scatter", "concat", "pad"}
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
