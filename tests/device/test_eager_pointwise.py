"""Eager elementwise ops on saturn GPU tensors (marker gpu) run saturn's loop kernels:
values against PyTorch eager on the CPU, and the CPU-fallback counters unchanged (the only
other way these ops run). Declined arguments run PyTorch's CPU kernel and are counted."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

import saturn

pytestmark = pytest.mark.gpu
GPU = "saturn:1"
SPECIAL = torch.tensor([0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 1e-30, 3e38])


def values(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=dtype)
        flat = x.view(-1)
        k = min(flat.numel(), SPECIAL.numel())
        flat[:k] = SPECIAL[:k].to(dtype)
        return x
    info = torch.iinfo(dtype)
    x = torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)
    x.view(-1)[:2] = torch.tensor([info.max, info.min], dtype=dtype)
    return x


def on_gpu(fn, *cpu_args, **kwargs):
    """(result on the GPU brought back, result on the CPU, fallback counts added)."""
    want = fn(*[copy.deepcopy(a) for a in cpu_args], **kwargs)
    dev = [a.to(GPU) if isinstance(a, torch.Tensor) and a.dim() > 0 else a for a in cpu_args]
    before = saturn.fallback_counts()
    got = fn(*dev, **kwargs)
    after = saturn.fallback_counts()
    added = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return got, want, added


def check(got, want, exact=False):
    assert got.device == torch.device(GPU)
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        assert torch.equal(got.cpu(), want)
    else:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6, equal_nan=True)


CASES = {
    "add alpha": lambda a, b: torch.add(a, b, alpha=0.5),
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "number": lambda a, b: (a * 2.5 + 1) / 3,
    "add_ alpha": lambda a, b: a.add_(b, alpha=-0.25),
    "mul_": lambda a, b: a.mul_(b),
    "div_ number": lambda a, b: a.div_(7.0),
    "addcmul_": lambda a, b: a.addcmul_(b, b, value=0.1),
    "addcdiv_": lambda a, b: a.addcdiv_(b, b.abs() + 1, value=-0.3),
    "addcmul": lambda a, b: torch.addcmul(a, b, a),
    "lerp_ small": lambda a, b: a.lerp_(b, 0.1),
    "lerp_ large": lambda a, b: a.lerp_(b, 0.9),
    "lerp one": lambda a, b: torch.lerp(a, b, 1.0),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("layout", ["packed", "transposed", "broadcast"])
def test_binary_ops_run_on_the_device(name, layout):
    a, b = values((64, 48), seed=1), values((64, 48), seed=2)
    if layout == "transposed":  # one dense layout, not row-major: the loop runs over memory
        a, b = values((48, 64), seed=1).t(), values((48, 64), seed=2).t()
    elif layout == "broadcast":
        b = values((48,), seed=2)
    got, want, added = on_gpu(CASES[name], a, b)
    check(got, want)
    assert added == {}, added
    if layout == "transposed" and not name.endswith("_"):
        assert got.stride() == want.stride()  # laid out as its operands, as PyTorch does


UNARY = ["neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("inplace", [False, True])
def test_unary_ops_run_on_the_device(name, inplace):
    x = values((33, 17), seed=3)
    fn = getattr(torch.Tensor, name + ("_" if inplace else ""))
    got, want, added = on_gpu(fn, x)
    check(got, want)
    assert added == {}, added
    if name in ("neg", "abs", "relu"):  # signs of zeros kept exactly (a NaN's bits may not be)
        keep = ~want.isnan()
        assert torch.equal(got.cpu()[keep].view(torch.int32), want[keep].view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64])
def test_other_dtypes(dtype):
    a, b = values((40, 9), dtype, seed=4), values((40, 9), dtype, seed=5)
    for fn in (lambda a, b: a + b, lambda a, b: a * b - b, lambda a, b: torch.maximum(-a, b)):
        got, want, added = on_gpu(fn, a, b)
        check(got, want, exact=not dtype.is_floating_point)  # integers wrap as PyTorch's
        assert added == {}, added


def test_a_zero_dim_device_tensor_and_an_empty_tensor():
    a = values((5, 6), seed=6)
    s = torch.tensor(1.75)
    got = a.to(GPU) * s.to(GPU)
    check(got, a * s)
    empty = torch.empty(0, 6)
    check(empty.to(GPU) + a[:1].to(GPU), empty + a[:1])


def test_strided_in_place_target_with_a_broadcast_operand():
    base = values((20, 30), seed=7)
    b = values((20,), seed=8)
    want = base.clone()
    want.t().add_(b, alpha=2.0)
    dev = base.to(GPU)
    dev.t().add_(b.to(GPU), alpha=2.0)
    check(dev, want)


@pytest.mark.parametrize(
    "case,op",
    [
        ("promotes an integer tensor to float", lambda d: d["i"] * 2.5),
        ("mixed float dtypes", lambda d: d["f"] + d["f"].double()),
        ("bool operands", lambda d: d["f"].gt(0) + d["f"].lt(1)),
        ("a partly overlapping in-place operand", lambda d: d["f"][1:].add_(d["f"][:-1])),
        ("an in-place target smaller than the result", lambda d: d["f"][:1].add_(d["f"])),
    ],
)
def test_declined_arguments_run_pytorchs_cpu_kernel(case, op):
    torch.manual_seed(9)
    f, i = torch.randn(6, 5), torch.randint(-9, 9, (6, 5), dtype=torch.int32)
    try:
        want = op({"f": f.clone(), "i": i.clone()})
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=re.escape(str(e)[:60])):
            op({"f": f.to(GPU), "i": i.to(GPU)})
        return
    before = sum(saturn.fallback_counts().values())
    got = op({"f": f.to(GPU), "i": i.to(GPU)})
    check(got, want)
    assert sum(saturn.fallback_counts().values()) > before, case


@pytest.mark.parametrize("foreach", [False, True])
def test_an_uncompiled_adamw_step_runs_on_the_device(foreach):
    torch.manual_seed(10)
    params = [torch.randn(32, 16), torch.randn(16), torch.randn(4, 8, 3)]
    grads = [[torch.randn_like(p) for p in params] for _ in range(4)]

    def train(device):
        ps = [torch.nn.Parameter(p.clone().to(device)) for p in params]
        opt = torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=foreach)
        for step in grads:
            for p, g in zip(ps, step, strict=True):
                p.grad = g.to(device)
            opt.step()
        return ps

    want = train("cpu")
    before = saturn.fallback_counts()
    got = train(GPU)
    added = {k for k, v in saturn.fallback_counts().items() if v != before.get(k, 0)}
    for p, q in zip(want, got, strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    arithmetic = {"add", "sub", "mul", "div", "lerp", "addcmul", "addcdiv", "sqrt"}

    def op(key: str) -> str:  # "aten::_foreach_addcdiv_.ScalarList" -> "addcdiv"
        return key.removeprefix("aten::").removeprefix("_foreach_").split(".")[0].rstrip("_")

    ran_on_host = {k for k in added if op(k) in arithmetic}
    assert not ran_on_host, sorted(added)


def test_a_cpu_number_first_and_an_expanded_target():
    a = values((4, 3), seed=12)
    got = torch.tensor(2.5) - a.to(GPU)
    check(got, torch.tensor(2.5) - a)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.zeros(1, 3, device=GPU).expand(4, 3).add_(a.to(GPU))


SELECTS = {
    "gt": lambda a, b, m: a > b,
    "le number": lambda a, b, m: a <= 0.25,
    "eq broadcast row": lambda a, b, m: a == b[0],
    "ne self": lambda a, b, m: a != a,
    "where": lambda a, b, m: torch.where(m, a, b),
    "where broadcast": lambda a, b, m: torch.where(m[:, :1], a, b[0]),
    "masked_fill_": lambda a, b, m: a.masked_fill_(m, -1e9),
    "masked_fill_ row": lambda a, b, m: a.masked_fill_(m[0], float("-inf")),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("name", list(SELECTS))
def test_comparisons_and_selections_run_on_the_device(name, dtype):
    if dtype == torch.int64 and name.startswith(("le", "masked")):
        pytest.skip("a float number with an integer tensor promotes (declined, see CPU tests)")
    a, b = values((40, 24), dtype, seed=10), values((40, 24), dtype, seed=11)
    m = torch.rand(40, 24, generator=torch.Generator().manual_seed(12)) < 0.5
    want = SELECTS[name](a.clone(), b.clone(), m)
    before = saturn.fallback_counts()
    got = SELECTS[name](a.to(GPU), b.to(GPU), m.to(GPU))
    assert saturn.fallback_counts() == before, "declined"
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want) or torch.allclose(got.cpu(), want, equal_nan=True)
