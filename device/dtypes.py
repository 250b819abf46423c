"""The tables every layer of the device package shares, with no dependencies of their own:
torch dtype <-> the IR's dtype names, and how a host step calls an opaque op."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {
    torch.bool: "bool",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


@dataclass
class HostCall:
    """How to call an opaque op: its target and arguments, tensors as ("t", i) slots."""

    target: str  # e.g. "aten.cumsum.default"
    args: tuple
    kwargs: dict
