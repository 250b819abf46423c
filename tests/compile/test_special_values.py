"""Special values through every float op saturn compiles: NaN, both infinities, both zeros,
subnormals and the largest finite values, in float16, bfloat16, float32 and float64.

Each op runs compiled on a saturn device and eagerly (on the CPU for saturn:0; on the GPU
against eager CUDA too). NaN positions and signs of zero must be eager's exactly; other
values within a rounding of the dtype (transcendental functions differ from PyTorch's by
an ulp). Where eager CPU and eager CUDA disagree, saturn:1 may match either, and
``CPU_ON_THE_GPU`` names the ops where it matches the CPU's (see its comment)."""

from __future__ import annotations

import itertools

import pytest
import torch

F = torch.nn.functional
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6, torch.float64: 1e-14}

UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "log1p": torch.log1p,
    "sin": torch.sin,
    "cos": torch.cos,
    "expm1": torch.expm1,
    "tanh": torch.tanh,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "round": torch.round,
    "erf": torch.erf,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "clamp_0_6": lambda x: torch.clamp(x, 0, 6),
    "clamp_min_0": lambda x: torch.clamp_min(x, 0.0),
    "clamp_max_neg0": lambda x: torch.clamp_max(x, -0.0),
    "pow_0.5": lambda x: x**0.5,
    "pow_-0.5": lambda x: x**-0.5,
    "pow_2": lambda x: x**2,
    "pow_3": lambda x: x**3,
    "pow_-1": lambda x: x**-1,
    "pow_-2": lambda x: x**-2,
    "pow_1.5": lambda x: x**1.5,
    "square": torch.square,
    "sign": torch.sign,
    "to_f64": lambda x: x.to(torch.float64),
    "to_f32": lambda x: x.to(torch.float32),
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "fmod": torch.fmod,
    "remainder": torch.remainder,
    "floor_divide": torch.floor_divide,
    "atan2": torch.atan2,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "gt": torch.gt,
    "lt": torch.lt,
    "ge": torch.ge,
    "le": torch.le,
    "eq": torch.eq,
    "ne": torch.ne,
    "where_gt": lambda a, b: torch.where(a > b, a, b),
    "clamp_tensor": lambda a, b: torch.clamp(a, min=b * 0 - 1, max=b * 0 + 1),
}
# Zero ties of maximum and minimum: PyTorch's CPU kernels return either zero depending on
# the path (scalar or vectorised), so only the value, not the sign, is compared there.
SIGNLESS_TIES = {"maximum", "minimum"}
# Ops whose -0.0 saturn:1 gives as PyTorch's CPU kernels do where eager CUDA differs:
# clamp (and relu, CUDA's clamp_min at 0) keeps x on a tie on the CPU (std::max(x, lo))
# and returns the bound on CUDA (fmaxf): saturn keeps x on both machines.
CPU_ON_THE_GPU = {"relu", "relu6", "clamp_0_6", "clamp_min_0", "clamp_max_neg0", "hardtanh"}


def specials(dtype: torch.dtype) -> torch.Tensor:
    fi = torch.finfo(dtype)
    sub = fi.tiny * fi.eps  # the smallest subnormal
    vals = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, sub, -sub, fi.tiny]
    vals += [fi.max, -fi.max, 1.0, -1.0, 0.5, -2.5, 7.0, -7.0, 100.0]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


def mismatches(got: torch.Tensor, want: torch.Tensor, signs: bool = True) -> torch.Tensor:
    """A mask of the elements where ``got`` is not ``want``: NaN positions, signs of zero,
    then values within the dtype's rounding."""
    got, want = got.cpu(), want.cpu()
    if got.dtype == torch.bool or not got.dtype.is_floating_point:
        return got != want
    g, w = got.double(), want.double()
    bad = g.isnan() != w.isnan()
    zeros = (g == 0) & (w == 0)
    if signs:
        bad |= zeros & (g.signbit() != w.signbit())
    both = ~g.isnan() & ~w.isnan() & ~zeros
    inf = g.isinf() | w.isinf()
    bad |= both & inf & (g != w)
    close = (g - w).abs() <= RTOL[got.dtype] * w.abs() + RTOL[got.dtype] * torch.finfo(
        got.dtype
    ).tiny
    bad |= both & ~inf & ~close
    return bad


def _run(fn, args: list[torch.Tensor], dev: str) -> torch.Tensor:
    torch._dynamo.reset()
    g = torch.compile(fn, backend="saturn", options={"device": dev}, dynamic=False)
    with torch.no_grad():
        return g(*[a.to(dev) for a in args]).cpu()


# Where saturn follows eager CUDA rather than eager CPU: the elements eager CPU computes
# otherwise, skipped on saturn:0 and compared with eager CUDA on the GPU. gelu: PyTorch's
# CPU kernel gives NaN at +-inf and inf at the largest floats, where x * 0.5 * (1 +
# erf(x / sqrt 2)), CUDA's formula and saturn's, gives +-inf... and the largest float.
CUDA_ON_THE_CPU = {
    "gelu": lambda a: a.isinf() | (a.abs() == torch.finfo(a.dtype).max),
}


def _eager_cpu(fn, args: list[torch.Tensor]) -> torch.Tensor:
    """Eager CPU, one element at a time: PyTorch's scalar path. Its vectorised path differs
    at the edges for some ops (fmod and remainder of a huge dividend by a tiny divisor give
    NaN there, the exact remainder here; zero ties of maximum), and which one runs depends
    on the tensor's length; the scalar path is the exact one, and CUDA's."""
    with torch.no_grad():
        out = [fn(*(a.flatten()[i : i + 1] for a in args)) for i in range(args[0].numel())]
    return torch.cat(out)


def _check(name: str, fn, args: list[torch.Tensor], dev: str) -> None:
    want = _eager_cpu(fn, args)
    got = _run(lambda *xs: fn(*(x * 1 for x in xs)), args, dev)  # fused with a product
    signs = name not in SIGNLESS_TIES
    bad = mismatches(got, want, signs)
    if dev == "saturn:0":  # a host op is PyTorch's kernel on the whole tensor: its path
        with torch.no_grad():
            bad &= mismatches(got, fn(*args), signs)
    if dev == "saturn:0" and name in CUDA_ON_THE_CPU:
        bad &= ~CUDA_ON_THE_CPU[name](args[0])
    if dev != "saturn:0":  # against eager CUDA, and the CPU's where named
        with torch.no_grad():
            cuda = fn(*[a.to("cuda") for a in args]).cpu()
        on_cuda = mismatches(got, cuda, signs)
        bad = on_cuda & bad if name in CPU_ON_THE_GPU else on_cuda
    if bad.any():
        where = bad.nonzero().flatten().tolist()[:6]
        inputs = [[a.flatten()[i].item() for a in args] for i in where]
        pytest.fail(
            f"{name}: at inputs {inputs}: saturn {[got.flatten()[i].item() for i in where]}, "
            f"eager {[want.flatten()[i].item() for i in where]}"
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_at_special_values(dev, name, dtype):
    if (name == "to_f32" and dtype == torch.float32) or (
        name == "to_f64" and dtype == torch.float64
    ):
        pytest.skip("a cast to its own dtype is not a conversion")
    _check(name, UNARY[name], [specials(dtype)], dev)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_at_special_values(dev, name, dtype):
    v = specials(dtype)
    pairs = list(itertools.product(range(len(v)), repeat=2))
    a = v[torch.tensor([i for i, _ in pairs])]
    b = v[torch.tensor([j for _, j in pairs])]
    _check(name, BINARY[name], [a, b], dev)
