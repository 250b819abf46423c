"""``__cuda_array_interface__`` for saturn GPU tensors.

PyTorch's DLPack export rejects a renamed PrivateUse1 device, so Numba, CuPy and
nvmath read saturn GPU tensors through the CUDA array interface (version 3) instead,
with saturn's stream named so that consumers order their work after saturn's.
"""

from __future__ import annotations

import torch

_TYPESTR = {
    torch.bool: "|b1",
    torch.uint8: "|u1",
    torch.int8: "|i1",
    torch.int16: "<i2",
    torch.int32: "<i4",
    torch.int64: "<i8",
    torch.uint16: "<u2",
    torch.uint32: "<u4",
    torch.uint64: "<u8",
    torch.float16: "<f2",
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.complex64: "<c8",
    torch.complex128: "<c16",
}


def cuda_array_interface(t: torch.Tensor) -> dict:
    """The interface dict of a saturn GPU tensor (raises for anything else)."""
    if t.device.type != "saturn" or t.device.index is None or t.device.index < 1:
        raise AttributeError(f"a tensor on {t.device} has no __cuda_array_interface__")
    if t.dtype not in _TYPESTR:
        raise TypeError(f"dtype {t.dtype} has no CUDA array interface type string")
    if t.requires_grad:
        raise RuntimeError(
            "a tensor that requires grad cannot be exported; use tensor.detach() first"
        )
    from .gpu_runner import take_back_lent

    take_back_lent(t)  # a compiled call's output must not keep pointing into its arena
    size = t.element_size()
    return {
        "shape": tuple(t.shape),
        "typestr": _TYPESTR[t.dtype],
        "data": (t.data_ptr() if t.numel() else 0, False),
        "version": 3,
        "strides": None if t.is_contiguous() else tuple(s * size for s in t.stride()),
        "stream": torch.saturn.stream_handle(t.device.index),
    }


def install() -> None:
    """Extend ``torch.Tensor.__cuda_array_interface__`` to saturn GPU tensors."""
    original = torch.Tensor.__cuda_array_interface__
    if getattr(original.fget, "_saturn", False):
        return

    def getter(self: torch.Tensor) -> dict:
        if self.device.type == "saturn":
            return cuda_array_interface(self)
        return original.__get__(self)

    prop = property(getter)
    prop.fget._saturn = True  # type: ignore[attr-defined]
    torch.Tensor.__cuda_array_interface__ = prop
