"""What both program runners (``recipe``'s step loop and ``gpu_runner``) do with a step
before running it: the host tensor of a constant, and the operand shapes a kernel was
compiled for. A leaf below both."""

from __future__ import annotations

import torch

from saturn.eqsat import optable as ot
from saturn.eqsat.bits import bits_float
from saturn.eqsat.program import Step

from .dtypes import TORCH_DTYPES


def const_tensor(s: Step) -> torch.Tensor:
    """The host tensor of a ``const`` step: a scalar (its float64 bits, in its dtype) or an
    ``Arange`` (the op table's values)."""
    if s.op == "Arange":
        return torch.from_numpy(ot.arange_values(*s.attrs))
    return torch.tensor(bits_float(s.attrs[0]), dtype=TORCH_DTYPES[s.attrs[1]])


def check_operands(s: Step, operands: list[torch.Tensor]) -> None:
    """Every operand has the shape the kernel was compiled for (raises before a launch)."""
    for o, t in zip(s.kernel.inputs, operands, strict=True):
        if tuple(t.shape) != tuple(o.shape):
            raise RuntimeError(
                f"kernel {s.output}: operand of shape {list(t.shape)}, compiled for {list(o.shape)}"
            )
