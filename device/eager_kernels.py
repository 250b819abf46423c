"""Eager kernels written in Python for saturn tensors: ``clone`` (and so ``contiguous``)
runs saturn's strided copy kernel on a GPU, and ``fill_`` (and so ``ones_like``,
``full``, a backward pass's seed gradient) the driver's memset, with no trip through the
host."""

from __future__ import annotations

import functools

import torch

from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")


@functools.cache
def _copy_kernel(width: int, rank: int, index: int):
    from saturn.codegen.cuda import CopyKernel

    return CopyKernel(width, rank, torch.saturn.get_device_capability(index))


def strided_copy(src: torch.Tensor, out: torch.Tensor) -> None:
    """Copy a (possibly strided) saturn GPU tensor into a packed one of the same shape."""
    index = src.device.index
    width = src.element_size()
    rank = max(src.dim(), 1)
    shape = list(src.shape) or [1]
    strides = list(src.stride()) or [1]
    with torch.saturn.device(index):
        _copy_kernel(width, rank, index).launch(
            torch.saturn.stream_handle(index), out.data_ptr(), src.data_ptr(), shape, strides
        )


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The addresses [lo, hi) a non-empty tensor's elements lie in (PyTorch's strides are
    non-negative, so its data pointer is the lowest)."""
    ptr = t.data_ptr()
    if t.is_contiguous():  # the common case, without a loop over the axes in Python
        return ptr, ptr + t.numel() * t.element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return ptr, ptr + extent * t.element_size()


def is_non_overlapping_and_dense(x: torch.Tensor) -> bool:
    """Its elements fill a span of memory exactly once, in some order of its axes."""
    if x.numel() <= 1:
        return True
    expected = 1
    for stride, size in sorted(
        (st, sz) for sz, st in zip(x.shape, x.stride(), strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def clone(x: torch.Tensor, memory_format=None) -> torch.Tensor:
    fmt = memory_format or torch.preserve_format
    if fmt == torch.preserve_format and is_non_overlapping_and_dense(x):
        out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        return out.copy_(x)  # same layout: one transfer of the bytes
    if fmt not in (torch.preserve_format, torch.contiguous_format):
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=fmt)
        return out.copy_(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    if x.device.index >= 1 and x.dim() <= 8 and x.element_size() in (1, 2, 4, 8, 16):
        strided_copy(x, out)
        return out
    return out.copy_(x)


impl(_lib, "clone", clone)

_DRIVER = None


def cuda_driver():
    """cuda.bindings' driver module, imported once."""
    global _DRIVER
    if _DRIVER is None:
        from cuda.bindings import driver

        _DRIVER = driver
    return _DRIVER


def _check(res, what: str) -> None:
    if res[0] != cuda_driver().CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"saturn: {what} failed: {res[0]!r}")


def memset_pattern(ptr: int, pattern: bytes, count: int, stream: int) -> None:
    """Write ``count`` copies of the element ``pattern`` (1 to 16 bytes) from ``ptr``:
    one memset of bytes, 16-bit or 32-bit words; wider elements whose 32-bit words differ
    as one pitched memset per word (each word of every element, ``len(pattern)`` apart)."""
    d = cuda_driver()
    width = len(pattern)
    if width == 1:
        return _check(d.cuMemsetD8Async(ptr, pattern[0], count, stream), "cuMemsetD8Async")
    if width == 2:
        word = int.from_bytes(pattern, "little")
        return _check(d.cuMemsetD16Async(ptr, word, count, stream), "cuMemsetD16Async")
    words = [int.from_bytes(pattern[i : i + 4], "little") for i in range(0, width, 4)]
    if len(set(words)) == 1:
        n = count * len(words)
        return _check(d.cuMemsetD32Async(ptr, words[0], n, stream), "cuMemsetD32Async")
    for j, word in enumerate(words):
        res = d.cuMemsetD2D32Async(ptr + 4 * j, width, word, 1, count, stream)
        _check(res, "cuMemsetD2D32Async")


def fill_(x: torch.Tensor, value) -> torch.Tensor:
    """``Tensor.fill_`` with a number. The value is converted as PyTorch's CPU ``fill_``
    converts it (raising where it does not fit the dtype), then its bytes are written: on a
    GPU by memset when ``x`` covers its span densely, otherwise through a copy (saturn:0:
    host memory; a strided GPU view: staged through the host, keeping the bytes between)."""
    one = torch.full((), value, dtype=x.dtype)
    if x.numel() == 0:
        return x
    index = x.device.index
    if (
        index == 0
        or not is_non_overlapping_and_dense(x)
        or x.element_size() not in (1, 2, 4, 8, 16)
    ):
        return x.copy_(one)
    pattern = one.reshape(1).view(torch.uint8).numpy().tobytes()
    with torch.saturn.device(index):
        memset_pattern(x.data_ptr(), pattern, x.numel(), torch.saturn.stream_handle(index))
    return x


def zero_(x: torch.Tensor) -> torch.Tensor:
    return fill_(x, 0)


def fill_tensor_(x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``fill_`` with a 0-dim tensor: its number (read from the device if it lives there)."""
    if value.dim() != 0:
        raise RuntimeError(
            "fill_ only supports 0-dimension value tensor but got tensor with "
            f"{value.dim()} dimensions."
        )
    return fill_(x, value.item())


impl(_lib, "fill_.Scalar", fill_)
impl(_lib, "fill_.Tensor", fill_tensor_)
impl(_lib, "zero_", zero_)
