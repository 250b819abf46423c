"""Eager elementwise ops without a GPU: on saturn:0 (host memory) they decline to PyTorch's
CPU kernel and are counted as fallbacks under the op's name; the GPU kernels' operand
layouts (read flat where operands share one dense layout, through strides otherwise) are
worked out the same way on any device."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import saturn
from saturn import eager_pointwise as ep

DEV = "saturn:0"


def test_saturn0_runs_pytorchs_cpu_kernel_and_counts_it():
    a, b = torch.randn(4, 5), torch.randn(5)
    got, bd = a.to(DEV), b.to(DEV)
    before = saturn.fallback_counts()
    got.add_(bd, alpha=-0.5).mul_(3.0)
    after = saturn.fallback_counts()
    want = a.clone().add_(b, alpha=-0.5).mul_(3.0)
    assert torch.equal(got.cpu(), want)
    for key in ("aten::add_.Tensor", "aten::mul_.Tensor"):
        assert after.get(key, 0) == before.get(key, 0) + 1, key


def test_cpu_kernel_errors_reach_the_caller():
    a = torch.zeros(1, 5, device=DEV)
    try:
        torch.zeros(1, 5).add_(torch.ones(3, 5))
    except RuntimeError as e:
        message = str(e)
    try:
        a.add_(torch.ones(3, 5, device=DEV))
    except RuntimeError as e:
        assert str(e) == message
    else:
        raise AssertionError("a broadcast that does not fit the target must raise")
    assert torch.equal(a.cpu(), torch.zeros(1, 5)), "nothing written on error"


def test_operands_sharing_one_dense_layout_are_read_flat():
    a = torch.randn(6, 4).t()  # transposed, dense
    b = torch.randn(6, 4).t()
    out = torch.empty_strided(a.shape, a.stride())
    ops, shapes, _strides, domain, direct = ep.layout(
        "f32", [a, b, torch.tensor(2.0)], a.shape, out
    )
    assert [o.indexing for o in ops] == ["same", "same", "scalar"]
    assert domain == (24,) and shapes[:2] == [(24,), (24,)] and direct


def test_broadcast_and_mixed_layouts_are_read_through_strides():
    a, b = torch.randn(4, 6), torch.randn(6)
    ops, _shapes, strides, domain, direct = ep.layout("f32", [a, b], (4, 6), torch.empty(4, 6))
    assert [o.indexing for o in ops] == ["strided", "strided"] and domain == (4, 6) and direct
    assert strides == [(6, 1), (1,)]
    t = torch.randn(6, 4).t()  # same shape, other layout than the packed output
    ops, *_ = ep.layout("f32", [a, t], (4, 6), torch.empty(4, 6))
    assert [o.indexing for o in ops] == ["strided", "strided"]
    # a strided in-place target with a broadcast operand is written through a packed result
    target = torch.randn(6, 4).t()
    *_, direct = ep.layout("f32", [target, b], (4, 6), target)
    assert not direct


def test_numbers_that_would_promote_are_declined():
    assert ep._number(2, "i32") == 2
    assert ep._number(torch.tensor(1.5), "f32") == 1.5
    for v, code in ((2.5, "i64"), (True, "f32"), (1j, "f32"), (torch.ones(2), "f32")):
        try:
            ep._number(v, code)
        except ep.DeclinedError:
            continue
        raise AssertionError(f"{v!r} with {code} must decline")


# --- the whole eager path on host memory: saturn:0 treated as a GPU, the launch replaced by
# the evaluator reading and writing the kernel's operands through their addresses ----------


class HostKernel:
    """Stands in for a CudaKernel: evaluates the body with numpy over memory at the
    launch's addresses (saturn:0 is host memory), shapes and strides as launched."""

    def __init__(self, body, code: str, ops, domain):
        self.body, self.code, self.ops, self.domain = body, code, ops, tuple(domain)
        self.launches = 0

    def view(self, ptr: int, shape, strides, code: str | None = None):
        dtype = NUMPY[code or self.code]
        itemsize = np.dtype(dtype).itemsize
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        raw = (ctypes.c_byte * (extent * itemsize)).from_address(ptr)
        base = np.frombuffer(raw, dtype=dtype)
        return np.lib.stride_tricks.as_strided(
            base, shape, [s * itemsize for s in strides], writeable=True
        )

    def launch(self, stream, out_ptr, in_ptrs, shapes, strides, workspace=None):
        from saturn.eqsat.evaluate import eval_expr

        self.launches += 1
        arrays = [
            self.view(p, sh, st, o.dtype)
            for p, sh, st, o in zip(in_ptrs, shapes, strides, self.ops, strict=True)
        ]
        value = np.broadcast_to(eval_expr(self.body, arrays), self.domain)
        packed = [1] * len(self.domain)
        for d in range(len(self.domain) - 2, -1, -1):
            packed[d] = packed[d + 1] * self.domain[d + 1]
        self.view(out_ptr, self.domain, packed)[...] = value


NUMPY = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "bool": np.bool_}


@pytest.fixture
def host_gpu(monkeypatch):
    kernels: list[HostKernel] = []

    def kernel(body, code, ops, domain):
        kernels.append(HostKernel(body, code, ops, domain))
        return kernels[-1]

    def gpu(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == "saturn"

    monkeypatch.setattr(ep, "_gpu", gpu)
    monkeypatch.setattr(torch.saturn, "stream_handle", lambda device=None: 0)
    monkeypatch.setattr(ep, "_kernel", kernel)
    monkeypatch.setattr(ep, "_PLANS", {})
    monkeypatch.setattr(ep, "_SCALARS", {})
    return kernels


CASES = {
    "add alpha": lambda a, b: torch.add(a, b, alpha=0.5),
    "sub number": lambda a, b: (a - b) * 2.5 - 1,
    "div": lambda a, b: a / b,
    "maximum": torch.maximum,
    "add_ alpha": lambda a, b: a.add_(b, alpha=-0.25),
    "mul_ 0-dim": lambda a, b: a.mul_(torch.tensor(3.0)),
    "addcmul_": lambda a, b: a.addcmul_(b, b, value=0.1),
    "addcdiv_": lambda a, b: a.addcdiv_(b, b.abs() + 1, value=-0.3),
    "lerp_ small": lambda a, b: a.lerp_(b, 0.1),
    "lerp_ large": lambda a, b: a.lerp_(b, 0.9),
    "sqrt": lambda a, b: torch.sqrt(b.abs()),
    "relu_": lambda a, b: a.relu_(),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("layout", ["packed", "transposed", "broadcast"])
def test_eager_path_on_host_memory(host_gpu, name, layout):
    torch.manual_seed(11)
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    if layout == "transposed":
        a, b = torch.randn(7, 5).t(), torch.randn(7, 5).t()
    elif layout == "broadcast":
        b = torch.randn(7)
    want = CASES[name](a.clone(), b.clone())
    da, db = a.to(DEV), b.to(DEV)
    before = saturn.fallback_counts()
    got = CASES[name](da, db)
    assert saturn.fallback_counts() == before, "declined"
    assert host_gpu and all(k.launches for k in host_gpu)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    if layout == "transposed" and not name.endswith("_"):
        assert got.stride() == want.stride()
    if layout != "broadcast":  # one dense layout: read flat
        assert all(o.indexing in ("same", "scalar") for k in host_gpu for o in k.ops)


def test_plans_are_reused_and_numbers_are_operands(host_gpu):
    a, b = torch.randn(4, 3).to(DEV), torch.randn(4, 3).to(DEV)
    for lr in (0.1, 0.2, 0.3):
        a.add_(b, alpha=-lr)
    assert len(host_gpu) == 1 and host_gpu[0].launches == 3, "one kernel for every alpha"
    assert len(ep._PLANS) == 1 and len(ep._SCALARS) == 3
    a.add_(b[:2], alpha=-0.1) if False else None
    a[:2].add_(b[:2], alpha=-0.1)
    assert len(ep._PLANS) == 2


def test_partial_overlap_raises_pytorchs_error(host_gpu):
    a = torch.randn(10).to(DEV)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        a[1:].add_(a[:-1])
    b = torch.randn(10).to(DEV)
    b.add_(b)  # the same view: fine
    assert not host_gpu or host_gpu[-1].launches == 1


def test_a_cpu_number_first_keeps_the_result_on_the_saturn_device():
    a = torch.arange(3.0, device=DEV)
    for got in (torch.tensor(2.0) * a, torch.tensor(1.0) - a, torch.maximum(torch.tensor(1.0), a)):
        assert got.device == torch.device(DEV)
    assert torch.equal((torch.tensor(2.0) * a).cpu(), torch.tensor([0.0, 2.0, 4.0]))


def test_a_cpu_number_first_runs_the_kernel(host_gpu):
    a = torch.arange(4.0).to(DEV)
    before = saturn.fallback_counts()
    got = torch.tensor(3.0) - a
    assert saturn.fallback_counts() == before and host_gpu
    assert got.device == torch.device(DEV)
    assert torch.equal(got.cpu(), torch.tensor([3.0, 2.0, 1.0, 0.0]))


def test_an_expanded_in_place_target_raises_pytorchs_error(host_gpu):
    message = "more than one element of the written-to tensor refers to a single memory"
    with pytest.raises(RuntimeError, match=message):
        torch.zeros(1).expand(3).add_(torch.arange(3.0))  # PyTorch on the CPU
    target = torch.zeros(1, device=DEV).expand(3)
    with pytest.raises(RuntimeError, match=message):
        target.add_(torch.arange(3.0).to(DEV))
    assert not host_gpu, "nothing launched"


def test_a_cpu_tensor_mixed_in_raises_pytorchs_device_error():
    a = torch.arange(3.0, device=DEV)
    before = saturn.fallback_counts()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3) + a
    with pytest.raises(RuntimeError, match="found at least two devices, saturn:0 and cpu"):
        a.add_(torch.ones(3))
    assert saturn.fallback_counts() == before
    assert torch.equal(a.cpu(), torch.arange(3.0)), "nothing written"


# --- copies between dtypes (saturn_rt::device_copy), the kernel on host memory -------------


@pytest.fixture
def host_copy(host_gpu, monkeypatch):
    monkeypatch.setattr(ep, "_COPY_PLANS", {})
    return host_gpu


@pytest.mark.parametrize(
    "layout, indexing",
    [
        ("packed", "same"),  # one dense layout on both sides: read flat
        ("transposed", "strided"),  # into a packed destination
        ("broadcast", "strided"),
    ],
)
@pytest.mark.parametrize("dtypes", [("f32", "f64"), ("f64", "i32"), ("i64", "f32")])
def test_a_conversion_is_one_kernel(host_copy, layout, indexing, dtypes):
    torch_dtype = {
        "f32": torch.float32,
        "f64": torch.float64,
        "i32": torch.int32,
        "i64": torch.int64,
    }
    base = (torch.randn(7, 5) * 40).to(torch_dtype[dtypes[0]])
    x = {"packed": base, "transposed": base.t(), "broadcast": base[:1].expand(7, 5)}[layout]
    # .to keeps a dense layout (the transposed one); the broadcast is made on the device
    xd = base[:1].to(DEV).expand(7, 5) if layout == "broadcast" else x.to(DEV)
    assert xd.stride() == x.stride()
    dst = torch.empty(x.shape, dtype=torch_dtype[dtypes[1]], device=DEV)
    assert ep.device_copy(xd, dst), "taken"
    (k,) = host_copy
    assert k.code == dtypes[1] and [o.indexing for o in k.ops] == [indexing]
    assert k.body == ("cast", ("in", 0), dtypes[1]) and k.launches == 1
    assert torch.equal(dst.cpu(), x.to(torch_dtype[dtypes[1]]))


def test_what_a_copy_kernel_does_not_take(host_copy):
    """A strided destination, operands sharing memory and complex numbers are staged."""
    x = torch.randn(6, 8, device=DEV)
    wide = torch.empty(6, 16, dtype=torch.float64, device=DEV)
    assert not ep.device_copy(x, wide[:, ::2])  # strided destination
    assert not ep.device_copy(x.view(torch.int32)[:, :4], x[:, 4:].view(torch.int32))
    z = torch.empty(6, 8, dtype=torch.complex64, device=DEV)
    assert not ep.device_copy(x, z)
    assert not host_copy, "no kernel was built"


SELECTS = {
    "gt": lambda a, b, m: a > b,
    "le number": lambda a, b, m: a <= 0.25,
    "eq broadcast row": lambda a, b, m: a == b[0],
    "ne self": lambda a, b, m: a != a,  # NaN only
    "where": lambda a, b, m: torch.where(m, a, b),
    "where broadcast": lambda a, b, m: torch.where(m[:, :1], a, b[0]),
    "masked_fill_": lambda a, b, m: a.masked_fill_(m, -1e9),
    "masked_fill_ row": lambda a, b, m: a.masked_fill_(m[0], float("-inf")),
}


@pytest.mark.parametrize("name", list(SELECTS))
def test_comparisons_and_selections_on_host_memory(host_gpu, name):
    torch.manual_seed(12)
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    a[0, 0], b[1, 1] = float("nan"), float("nan")
    m = torch.rand(5, 7) < 0.5
    want = SELECTS[name](a.clone(), b.clone(), m)
    before = saturn.fallback_counts()
    got = SELECTS[name](a.to(DEV), b.to(DEV), m.to(DEV))
    assert saturn.fallback_counts() == before, "declined"
    assert got.dtype == want.dtype and host_gpu and all(k.launches for k in host_gpu)
    assert torch.equal(got.cpu(), want) or torch.allclose(got.cpu(), want, equal_nan=True)


def test_selections_decline_what_promotes(host_gpu):
    """A float number compared with an integer tensor, ``where`` over two dtypes, or a
    condition that is not bool would promote or differ: the plan refuses them (PyTorch's
    CPU kernel then runs); the same calls with matching dtypes are planned."""
    i = torch.arange(6, dtype=torch.int32, device=DEV)
    f = torch.randn(6, device=DEV)
    m = torch.ones(6, dtype=torch.bool, device=DEV)
    gt = ("gt", ("in", 0), ("in", 1))
    where = ("where", ("in", 0), ("in", 1), ("in", 2))
    for body, args, conds in (
        (gt, [i, 0.5], ()),
        (where, [m, i, f], (0,)),
        (where, [f, f, f], (0,)),
    ):
        with pytest.raises(ep.DeclinedError):
            ep._plan(body, args, ep._INTS_TOO, False, torch.bool if body is gt else None, conds)
    assert ep._plan(gt, [i, 2], ep._INTS_TOO, False, torch.bool).result == torch.bool
    assert ep._plan(where, [m, f, f], ep._INTS_TOO, False, None, (0,)).result == torch.float32
