"""Eager kernels written in Python for saturn tensors: ``clone`` (and so ``contiguous``)
runs saturn's strided copy kernel on a GPU, with no trip through the host."""

from __future__ import annotations

import functools

import torch

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


_lib.impl("clone", clone, "PrivateUse1")
