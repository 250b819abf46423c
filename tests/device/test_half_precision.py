"""float16 and bfloat16 on a saturn GPU (marker gpu): conversions between dtypes and
layouts run one kernel on the device (no trip through the host), and elementwise
arithmetic on half tensors runs saturn's loop kernels, computing in float32 and rounding
once at the store as PyTorch's GPU kernels do. Values against PyTorch on the CPU;
``DEVICE_COPIES`` and the fallback counters show where the work ran."""

from __future__ import annotations

import math

import pytest
import torch

import saturn
from saturn import eager_pointwise as ep

pytestmark = pytest.mark.gpu
GPU = "saturn:1"
HALVES = [torch.bfloat16, torch.float16]
SPECIAL = [0.0, -0.0, 1 + 2**-8, 1 + 3 * 2**-8, 70000.0, 3.4e38, 1e-40, math.inf, -math.inf]


def values(shape, dtype=torch.float32, seed=0, special=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    if special:
        flat = x.view(-1)
        flat[: len(SPECIAL) + 1] = torch.tensor([*SPECIAL, math.nan])
    return x.to(dtype)


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal element for element, NaN where NaN, zeros with their signs."""
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    nan = want.isnan()
    keep = ~nan
    return (
        torch.equal(got.isnan(), nan)
        and torch.equal(got[keep], want[keep])
        and torch.equal(got[keep].signbit(), want[keep].signbit())
    )


def copies(fn):
    """(fn's result, device copies it ran, fallbacks it counted)."""
    before, fb = ep.DEVICE_COPIES, sum(saturn.fallback_counts().values())
    out = fn()
    return out, ep.DEVICE_COPIES - before, sum(saturn.fallback_counts().values()) - fb


PAIRS = [
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16),
    (torch.float16, torch.bfloat16),
    (torch.float64, torch.bfloat16),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.bool),
    (torch.bool, torch.bfloat16),
    (torch.float32, torch.int32),
    (torch.int64, torch.float16),
    (torch.int32, torch.uint8),
]


@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("layout", ["packed", "transposed", "sliced"])
def test_conversions_run_on_the_device(src, dst, layout):
    floats_only = not dst.is_floating_point and dst != torch.bool
    x = values((24, 40), seed=1, special=not floats_only)  # floats to ints: in range
    if not src.is_floating_point:
        x = (x * 20).round()
    x = x.to(src)
    view = {"packed": x, "transposed": x.t(), "sliced": x[:, ::3]}[layout]
    dev = x.to(GPU)
    dview = {"packed": dev, "transposed": dev.t(), "sliced": dev[:, ::3]}[layout]
    got, ran, fell = copies(lambda: dview.to(dst))
    assert same_values(got, view.to(dst)), (src, dst, layout)
    assert (ran, fell) == (1, 0)
    if layout == "transposed":
        assert got.stride() == view.to(dst).stride()  # a dense layout is kept


def test_a_same_dtype_gather_into_a_packed_tensor():
    x = values((30, 50), seed=2)
    dev = x.to(GPU)
    out = torch.empty(50, 30, device=GPU)
    _, ran, fell = copies(lambda: out.copy_(dev.t()))
    assert same_values(out, x.t().contiguous()) and (ran, fell) == (1, 0)


def test_what_stays_on_the_host_path_still_copies_right():
    """A strided destination is staged through the host (no kernel), with the same result."""
    x = values((8, 12), seed=3)
    dev = torch.zeros(8, 24, dtype=torch.bfloat16, device=GPU)
    _, ran, _ = copies(lambda: dev[:, ::2].copy_(x.to(GPU)))
    want = torch.zeros(8, 24, dtype=torch.bfloat16)
    want[:, ::2] = x.to(torch.bfloat16)
    assert same_values(dev, want) and ran == 0


BINARY = {
    "add alpha": lambda a, b: torch.add(a, b, alpha=0.3),
    "sub": lambda a, b: a - b,
    "mul number": lambda a, b: a * 0.3,
    "div": lambda a, b: a / b,
    "maximum": torch.maximum,
    "addcmul_": lambda a, b: a.addcmul_(b, b, value=0.1),
    "addcdiv_": lambda a, b: a.addcdiv_(b, a, value=-0.3),
    "lerp_ small": lambda a, b: a.lerp_(b, 0.1),
    "lerp_ large": lambda a, b: a.lerp_(b, 0.9),
}
UNARY = ["neg", "abs", "relu", "exp", "sqrt", "tanh", "sigmoid", "reciprocal"]


def opmath(fn, dtype, *args):
    """PyTorch's GPU semantics: the op computed in float32, rounded once to ``dtype`` (so
    every case is one op: a chain rounds after each)."""
    return fn(*[a.float() for a in args]).to(dtype)


def close(got, want, dtype):
    # one rounding of the half type apart at most (fused multiply-adds, libm differences)
    eps = {torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    torch.testing.assert_close(
        got.cpu().float(), want.float(), rtol=2 * eps, atol=1e-6, equal_nan=True
    )


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", list(BINARY))
def test_half_arithmetic_runs_on_the_device(dtype, name):
    a, b = values((48, 40), dtype, seed=4), values((48, 40), dtype, seed=5)
    fn = BINARY[name]
    want = opmath(fn, dtype, a, b)
    da, db = a.to(GPU), b.to(GPU)
    got, _, fell = copies(lambda: fn(da, db))
    assert fell == 0 and got.dtype == dtype
    close(got, want, dtype)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", UNARY)
def test_half_unary_ops_run_on_the_device(dtype, name):
    x = values((33, 17), dtype, seed=6)
    fn = getattr(torch.Tensor, name)
    got, _, fell = copies(lambda: fn(x.to(GPU)))
    assert fell == 0
    close(got, opmath(fn, dtype, x), dtype)
    if name in ("neg", "abs", "relu"):  # exact
        assert same_values(got, fn(x))


def test_a_number_is_not_rounded_to_the_half_type_first():
    """``x * 1.003`` in bfloat16: 1.003 rounds to 1.0 in bfloat16, so a kernel that rounded
    the number first would return x unchanged; PyTorch's GPU kernels (and saturn's) hold it
    in float32: 255 * 1.003 = 255.77, which rounds to 256 (bfloat16's step there is 1)."""
    x = torch.full((64,), 255.0, dtype=torch.bfloat16)
    got, _, fell = copies(lambda: x.to(GPU) * 1.003)
    assert fell == 0, "ran on the device"
    assert torch.equal(got.cpu(), torch.full((64,), 256.0, dtype=torch.bfloat16))
