"""Integer remainder and floor division by a constant (decision 0048) in compiled graphs:
``x % n``, ``x // n`` and ``div(x, n, rounding_mode="floor")`` of int32/int64 tensors by a
Python int 1 <= n <= 2^53 are device loops, so ``take_along_dim`` (which wraps its index
with ``remainder``) runs with no host op, and its take is seen to stay in range, so a GPU
call reads no error word back. Values against eager on the CPU at both ends of int64; any
other integer divisor (a tensor, zero, negative, past 2^53) stays PyTorch's op, which raises
on a zero divisor as PyTorch does. saturn:0, and (marker gpu) saturn:1 under replay."""

from __future__ import annotations

import pytest
import torch

from saturn.eqsat.ranges import indices_in_range

from .helpers import DEV, compile_and_compare, last_compiled

GPU = "saturn:1"
EXTREMES = torch.tensor(
    [-(2**63), -(2**63) + 1, -(2**31), -7, -5, -1, 0, 1, 4, 5, 7, 2**31 - 1, 2**63 - 1]
)
DIVISIONS = {
    "remainder": lambda x: x % 5,
    "floor_divide": lambda x: x // 7,
    "div floor": lambda x: torch.div(x, 3, rounding_mode="floor"),
    "remainder by 2^53": lambda x: torch.remainder(x, 2**53),
    "int32": lambda x: (x.int() % 6) + x.int() // 4,
    "fmod": lambda x: torch.fmod(x, 5),  # truncating: the dividend's sign
    "fmod int32": lambda x: torch.fmod(x.int(), 3) * 2,
    "fmod by 1": lambda x: torch.fmod(x, 1),
}
TAKES = {  # (x shape, index shape, dim)
    "last axis": ((4, 5), (4, 3), 1),
    "first axis": ((5, 3), (2, 3), 0),
    "negative dim": ((2, 3, 4), (2, 3, 6), -1),
}


def host_ops(prog) -> list[str]:
    return [s.op.split("#")[0] for s in prog.steps if s.kind == "host"]


def special_values(shape) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return x


def wrapped_indices(xshape, ishape, dim) -> torch.Tensor:
    n = xshape[dim]  # negative, in range and past the end: take_along_dim wraps them all
    return torch.randint(-3 * n, 3 * n, ishape, generator=torch.Generator().manual_seed(8))


@pytest.mark.parametrize("name", DIVISIONS)
def test_integer_divisions_by_a_constant_are_device_loops(name):
    fn = DIVISIONS[name]
    compile_and_compare(fn, EXTREMES, rtol=0, atol=0)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and [k.kind for k in prog.kernels] == ["loop"], prog.to_text()


@pytest.mark.parametrize("name", TAKES)
def test_take_along_dim_runs_with_no_host_op_and_a_bounded_take(name):
    xshape, ishape, dim = TAKES[name]
    x, i = special_values(xshape), wrapped_indices(xshape, ishape, dim)
    compile_and_compare(lambda x, i: torch.take_along_dim(x, i, dim), x, i, rtol=0, atol=0)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    (take,) = [s for s in prog.steps if s.kernel is not None and s.kernel.kind == "gather"]
    assert indices_in_range(prog, take), prog.to_text()


@pytest.mark.parametrize("shift", [3, -2, 7])
def test_roll_is_a_take_at_wrapped_positions_with_no_host_op(shift):
    """torch.roll decomposes to index_select at ``fmod(arange + start, n)`` (Swin's shifted
    windows): the fmod is a loop and the take is seen to stay in range."""
    x = special_values((5, 6))
    compile_and_compare(lambda x: torch.roll(x, shift, 1) + 1, x, rtol=0, atol=0)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()


def test_a_gather_of_caller_indices_keeps_its_check():
    """The same take without the wrap: the caller's indices are unbounded."""
    x, i = special_values((4, 5)), torch.randint(0, 5, (4, 3))
    compile_and_compare(lambda x, i: torch.gather(x, 1, i), x, i, rtol=0, atol=0)
    prog = last_compiled().compiled.program
    (take,) = [s for s in prog.steps if s.kernel is not None and s.kernel.kind == "gather"]
    assert not indices_in_range(prog, take), prog.to_text()


@pytest.mark.parametrize(
    "fn,op",
    [
        (lambda x: x % torch.full_like(x, 3), "aten.remainder.Tensor"),
        (lambda x: x % -3, "aten.remainder.Scalar"),
        (lambda x: x // -1, "aten.floor_divide.default"),
        (lambda x: x % (2**53 + 1), "aten.remainder.Scalar"),
        (lambda x: torch.div(x, 2, rounding_mode="trunc"), "aten.div.Tensor_mode"),
        (lambda x: torch.fmod(x, torch.full_like(x, 3)), "aten.fmod.Tensor"),
        (lambda x: torch.fmod(x, -3), "aten.fmod.Scalar"),
    ],
    ids=["tensor", "negative", "minus-one", "past-2^53", "trunc", "fmod-tensor", "fmod-negative"],
)
def test_other_integer_divisors_stay_pytorch_ops(fn, op):
    compile_and_compare(fn, EXTREMES[1:], rtol=0, atol=0)  # -2^63 // -1 overflows in PyTorch
    assert host_ops(last_compiled().compiled.program) == [op]


def test_a_zero_divisor_raises_as_in_pytorch():
    torch._dynamo.reset()
    cf = torch.compile(lambda x: x % 0, backend="saturn", dynamic=False)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        EXTREMES % 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        cf(EXTREMES.to(DEV))


# --- on the GPU ---------------------------------------------------------------------------


def compile_gpu(fn, *args):
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="saturn", dynamic=False)
    cf(*args)
    return cf, last_compiled().recipe


@pytest.mark.gpu
@pytest.mark.parametrize("name", DIVISIONS)
def test_integer_divisions_by_a_constant_on_the_gpu(name):
    """Numba's floored ``%`` and ``//`` compiled for CUDA, at both ends of int64."""
    fn = DIVISIONS[name]
    xd = EXTREMES.to(GPU)
    cf, recipe = compile_gpu(fn, xd)
    assert host_ops(recipe.program) == [] and [k.kind for k in recipe.program.kernels] == ["loop"]
    for _ in range(3):
        torch.testing.assert_close(cf(xd).cpu(), fn(EXTREMES), rtol=0, atol=0)
    assert recipe.runner.replays >= 1 and recipe.last.crossings == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", TAKES)
def test_take_along_dim_on_the_gpu_reads_no_error_word(name):
    """Replayed, bit for bit, after the indices change in place; the take's index is
    bounded, so the call never waits to read an error word."""
    xshape, ishape, dim = TAKES[name]
    x, i = special_values(xshape), wrapped_indices(xshape, ishape, dim)
    xd, idd = x.to(GPU), i.to(GPU)

    def f(x, i):
        return torch.take_along_dim(x, i, dim)

    cf, recipe = compile_gpu(f, xd, idd)
    assert host_ops(recipe.program) == [] and not recipe.runner._unbounded_indices
    for _ in range(3):
        torch.testing.assert_close(cf(xd, idd).cpu(), f(x, i), rtol=0, atol=0, equal_nan=True)
    i2 = wrapped_indices(xshape, ishape, dim).flip(0).contiguous()
    idd.copy_(i2)
    torch.testing.assert_close(cf(xd, idd).cpu(), f(x, i2), rtol=0, atol=0, equal_nan=True)
    assert recipe.runner.replays >= 1 and recipe.last.crossings == 0
