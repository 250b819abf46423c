"""Ops whose CUDA kernel takes operands PyTorch's CPU kernel refuses (``eager_host``):
``torch.histc`` of integers, which transformers' mixture-of-experts layers call on every
device but the CPU, equals CUDA's integer histogram on saturn tensors, eagerly and in a
compiled graph's host step (before, both raised "histogram_cpu not implemented for 'Int'")."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn import backend

DEV = torch.device("saturn:0")


def cuda_histc(values: list[int], bins: int, lo: int, hi: int) -> list[int]:
    """SummaryOps.cu's integer histogram, one element at a time (the bounds already the
    data's range where CUDA takes it)."""
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            counts[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return counts


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("bins", "lo", "hi"),
    [(8, 0, 7), (8, 0, 8), (3, -5, 20), (5, 2, 3), (7, 1, 100), (4, 2.9, 9.7)],
)
def test_integer_histc_is_cudas(dtype, bins, lo, hi):
    torch.manual_seed(0)
    low = 0 if dtype == torch.uint8 else -8
    x = torch.randint(low, 30, (5, 7), dtype=dtype)
    x[0, 0], x[0, 1] = int(lo), int(hi)  # both ends present: the last bin holds max
    before = saturn.fallback_counts().get("aten::histc", 0)
    got = torch.histc(x.to(DEV), bins=bins, min=lo, max=hi)
    assert saturn.fallback_counts().get("aten::histc", 0) == before + 1  # ran on the host
    assert got.device == DEV and got.dtype == dtype
    # the bounds truncate toward zero, as CUDA's conversion to int64 does
    want = cuda_histc(x.reshape(-1).tolist(), bins, int(lo), int(hi))
    assert got.cpu().tolist() == want


def test_integer_histc_bounds_from_the_data_and_its_refusals():
    x = torch.tensor([3, 5, 5, 9, 4], dtype=torch.int32)
    # min == max: the data's own range (3..9)
    assert torch.histc(x.to(DEV), bins=3).cpu().tolist() == cuda_histc(x.tolist(), 3, 3, 9)
    # one distinct value: the range widened by one each side
    same = torch.full((4,), 6, dtype=torch.int32)
    assert torch.histc(same.to(DEV), bins=2).cpu().tolist() == [0, 4]
    empty = torch.empty(0, dtype=torch.int32, device=DEV)
    assert torch.histc(empty, bins=3).cpu().tolist() == [0, 0, 0]
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to(DEV), bins=3, min=5, max=2)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x.to(DEV), bins=0, min=0, max=2)


def test_floating_histc_is_the_cpus():
    x = torch.tensor([0.0, -0.0, 0.5, 1.0, float("nan"), float("inf"), 2.0])
    got = torch.histc(x.to(DEV), bins=4, min=0, max=2)
    assert torch.equal(got.cpu(), torch.histc(x, bins=4, min=0, max=2))
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(x.to(DEV), bins=4)  # the data's range: NaN and inf, refused as the CPU does


def test_compiled_integer_histc_runs_compiled():
    """A compiled graph's ``histc`` host step takes CUDA's semantics too: the call neither
    fails nor reruns uncompiled, and the counts are CUDA's."""

    def count(ids):
        return torch.histc(ids.reshape(-1).int(), bins=4, min=0, max=3) + 1

    ids = torch.tensor([[0, 3, 3], [1, 3, 7]])
    before, failed = len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)
    torch._dynamo.reset()
    got = torch.compile(count, backend="saturn")(ids.to(DEV))
    assert backend.CACHE.fallbacks[before:] == [] and backend.CACHE.failed_calls[failed:] == []
    assert got.dtype == torch.int32
    assert got.cpu().tolist() == [2, 2, 1, 4]  # 7 is out of range
