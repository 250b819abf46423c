"""What only a GPU shows: pinned memory, out-of-memory recovery, and Numba reading saturn
tensors through the CUDA array interface on saturn's stream."""

from __future__ import annotations

import pytest
import torch

import saturn  # noqa: F401

pytestmark = pytest.mark.gpu
GPU = "saturn:1"


def test_pinned_memory_round_trip():
    h = torch.randn(1 << 20).pin_memory()
    assert h.is_pinned()
    assert not torch.randn(4).is_pinned()
    d = h.to(GPU, non_blocking=True)
    back = torch.empty_like(h).pin_memory()
    back.copy_(d)
    assert torch.equal(back, h)


def test_out_of_memory_recovers_by_releasing_the_cache():
    torch.saturn.empty_cache(GPU)
    live = torch.saturn.memory_stats(GPU)["allocated"]  # tensors other tests still hold
    block = 16 << 30
    held = []
    failures = torch.saturn.memory_stats(GPU)["failures"]
    with pytest.raises(torch.OutOfMemoryError, match=r"released .* cached bytes"):
        for _ in range(64):
            held.append(torch.empty(block, dtype=torch.uint8, device=GPU))
    assert torch.saturn.memory_stats(GPU)["failures"] == failures + 1
    assert len(held) >= 2
    del held  # all of it goes to the cache, still reserved
    stats = torch.saturn.memory_stats(GPU)
    assert stats["reserved"] >= 2 * block
    # A different size class cannot come from the cache and the GPU is full of cached
    # blocks: the allocator releases the cache and retries once.
    big = torch.empty(block + (2 << 20), dtype=torch.uint8, device=GPU)
    after = torch.saturn.memory_stats(GPU)
    assert after["retries"] == stats["retries"] + 1
    assert after["reserved"] == live + block + (2 << 20)  # the whole cache was released
    big.fill_(3)
    assert big[-1].item() == 3
    del big
    torch.saturn.empty_cache(GPU)
    assert torch.saturn.memory_reserved(GPU) == live


def test_numba_kernel_reads_saturn_tensor():
    from numba import cuda

    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + y[i]

    x = torch.randn(10_001)
    y = torch.randn(10_001)
    xs, ys = x.to(GPU), y.to(GPU)
    out = torch.empty_like(xs).fill_(float("nan"))
    # cuda.core (under numba-cuda) special-cases torch tensors and rejects a PrivateUse1
    # device, so hand Numba views built from the CUDA array interface.
    views = [cuda.as_cuda_array(t) for t in (xs, ys, out)]
    assert views[0].__cuda_array_interface__["data"][0] == xs.data_ptr()  # no copy
    stream = cuda.external_stream(torch.saturn.stream_handle(GPU))
    axpy[(x.numel() + 255) // 256, 256, stream](2.0, *views)
    torch.testing.assert_close(out.cpu(), 2.0 * x + y, rtol=1e-6, atol=1e-6)
    cai = xs.__cuda_array_interface__
    assert cai["data"][0] == xs.data_ptr() and cai["typestr"] == "<f4"
    strided = xs[::2].__cuda_array_interface__
    assert strided["strides"] == (8,)


def test_cpu_reference_device_has_no_array_interface():
    with pytest.raises(AttributeError):
        _ = torch.ones(2, device="saturn:0").__cuda_array_interface__
