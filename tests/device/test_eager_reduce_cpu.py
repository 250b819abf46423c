"""Eager reductions without a GPU: on saturn:0 they run PyTorch's CPU kernel (counted); the
GPU path's decisions (the axis order the kernel walks, packed or strided reads, the kept
axes' order in the result, keepdim) are checked on host memory with a stand-in for the
kernel that reduces with numpy over the launch's shapes and strides."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import saturn
from saturn import eager_reduce as er

DEV = "saturn:0"
NUMPY = {"f32": np.float32, "f64": np.float64}
HALF = {"f16": torch.float16, "bf16": torch.bfloat16}
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def test_saturn0_runs_pytorchs_cpu_kernel_and_counts_it():
    x = torch.randn(4, 5)
    before = saturn.fallback_counts()
    got = x.to(DEV).sum(0)
    assert torch.equal(got.cpu(), x.sum(0))
    key = "aten::sum.dim_IntList"
    assert saturn.fallback_counts()[key] == before.get(key, 0) + 1


class HostReduce:
    """Stands in for a CudaKernel of kind reduce: numpy over memory at the launch's
    addresses (saturn:0 is host memory), the input seen with the launch's shape and strides
    (its domain), the output written packed."""

    def __init__(self, k):
        self.k, self.launches = k, 0

    def view(self, ptr: int, shape, strides) -> np.ndarray:
        """The memory (half types: their 16-bit patterns) seen with shape and strides."""
        dtype = NUMPY.get(self.k.dtype, np.int16)
        size = np.dtype(dtype).itemsize
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        base = np.frombuffer((ctypes.c_byte * (extent * size)).from_address(ptr), dtype=dtype)
        return np.lib.stride_tricks.as_strided(
            base, shape, [s * size for s in strides], writeable=True
        )

    def launch(self, stream, out_ptr, in_ptrs, shapes, strides, workspace=None):
        self.launches += 1
        assert workspace is not None and workspace(64) > 0
        x = self.view(in_ptrs[0], shapes[0], strides[0])
        half = HALF.get(self.k.dtype)
        if half is not None:  # widened into a float32 accumulator, as the kernel does
            x = torch.from_numpy(x.copy()).view(half).float().numpy()
        value = REDUCE[self.k.attrs["reduce"]](x, axis=tuple(self.k.attrs["dims"]))
        if half is not None:  # one rounding at the store
            value = torch.from_numpy(np.asarray(value)).to(half).view(torch.int16).numpy()
        shape = tuple(self.k.shape)
        packed = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            packed[d] = packed[d + 1] * shape[d + 1]
        self.view(out_ptr, shape, packed)[...] = value


@pytest.fixture
def host_reduce(monkeypatch):
    made: list[HostReduce] = []

    def compile_(k, index):
        made.append(HostReduce(k))
        return made[-1]

    monkeypatch.setattr(er, "_compile", compile_)
    monkeypatch.setattr(er, "_gpu", lambda t: t.device.type == "saturn")
    monkeypatch.setattr(torch.saturn, "stream_handle", lambda device=None: 0)
    monkeypatch.setattr(er, "_PLANS", {})
    return made


CASES = {
    # name: (input maker, op, reduced axes in the kernel's order, indexing)
    "rows of a matrix (a bias gradient)": (
        lambda: torch.randn(6, 5),
        lambda x: x.sum(0),
        (0,),
        "same",
    ),
    "last axis, kept": (
        lambda: torch.randn(6, 5),
        lambda x: x.amax(-1, keepdim=True),
        (1,),
        "same",
    ),
    "everything": (lambda: torch.randn(3, 4, 5), lambda x: x.mean(), (0, 1, 2), "same"),
    "a transposed matrix over its rows": (
        lambda: torch.randn(5, 6).t(),  # memory order (1, 0): axis 0 is the inner one
        lambda x: x.sum(0),
        (1,),
        "same",
    ),
    "axes apart": (lambda: torch.randn(3, 4, 5), lambda x: x.amin((0, 2)), (1, 2), "strided"),
    "a slice": (
        lambda: torch.randn(6, 9)[:, 1:8],
        lambda x: x.mean(1, keepdim=True),
        (1,),
        "strided",
    ),
    "channels of an image": (
        lambda: torch.randn(2, 3, 4, 5),
        lambda x: x.sum((0, 2, 3)),
        (1, 2, 3),
        "strided",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reductions_on_host_memory(host_reduce, name):
    make, op, dims, indexing = CASES[name]
    torch.manual_seed(5)
    x = make()
    want = op(x)
    if x._base is None:
        dev = x.to(DEV)  # keeps a dense layout (the transposed one)
    else:  # a slice: the same view of a device copy of its base
        dev = x._base.to(DEV).as_strided(x.shape, x.stride(), x.storage_offset())
    assert dev.stride() == x.stride()
    before, count = saturn.fallback_counts(), er.REDUCTIONS
    got = op(dev)
    assert saturn.fallback_counts() == before, "declined"
    assert er.REDUCTIONS == count + 1
    (k,) = host_reduce
    assert tuple(k.k.attrs["dims"]) == dims and k.k.inputs[0].indexing == indexing
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


def test_nan_propagates_through_max(host_reduce):
    x = torch.randn(4, 6)
    x[2, 3] = float("nan")
    got = x.to(DEV).amax(1).cpu()
    assert torch.isnan(got[2]) and torch.equal(got[[0, 1, 3]], x.amax(1)[[0, 1, 3]])


def test_what_a_reduction_kernel_does_not_take(host_reduce):
    x = torch.randn(4, 6, device=DEV)
    before = sum(saturn.fallback_counts().values())
    x.sum(dtype=torch.float64)  # another dtype
    torch.zeros(0, 3, device=DEV).sum(0)  # empty
    x.to(torch.int64).sum(0)  # integers
    assert sum(saturn.fallback_counts().values()) == before + 3 and not host_reduce
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.sum(5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_reductions_accumulate_in_float32(host_reduce, dtype):
    torch.manual_seed(5)
    x = torch.randn(6, 40).to(dtype)
    before = saturn.fallback_counts()
    got = [x.to(DEV).sum(1), x.to(DEV).mean(0), x.to(DEV).amax(1)]
    assert saturn.fallback_counts() == before, "declined"
    want = [x.float().sum(1), x.float().mean(0), x.float().amax(1)]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert torch.equal(g.cpu(), w.to(dtype))  # the stand-in sums as numpy does
    code = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    for k in (h.k for h in host_reduce):
        assert k.body == ("cast", ("in", 0), "f32") and k.attrs["acc_dtype"] == "f32"
        assert k.epilogue == ("cast", ("in", 0), code)
