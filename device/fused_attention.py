"""``saturn::attention(q, k, v, scale)``: ``softmax(scale * q @ k^T) @ v`` over [B, H, S, D]
saturn tensors (``saturn::attention_bias(q, k, v, bias, scale)``: a mask added to the scaled
scores), as one fused kernel on a GPU: cuDNN's for half types
(``codegen/attention.py``), saturn's own for float32 (``codegen/flash_attention.py``).

It is a saturn custom op with a host function: compiled graphs place it on the device as one
``Custom`` step (captured and replayed with the rest), eager calls run it directly. The
encoder layer's fast path (``decompositions.py``) calls it on a GPU where a fused kernel
takes the operands (``fused_attention_takes``), and writes the unfused product otherwise.
The reference is that unfused product (the CPU, saturn:0, and layouts cuDNN refuses at
run time, counted as fallbacks and logged)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from saturn.codegen import flash_attention
from saturn.codegen.attention import (
    AttentionError,
    AttentionGradPlan,
    AttentionPlan,
    check_bias,
    check_operands,
)
from saturn.codegen.conv import cudnn_unavailable
from saturn.codegen.flash_attention import FlashPlan
from saturn.codegen.flash_grad import FlashGradPlan
from saturn.codegen.gemm import Layout
from saturn.eqsat.program import packed_strides

from .custom_ops import count_fallback, custom_op
from .dtypes import DTYPES

log = logging.getLogger("saturn")

_PLANS: dict[tuple, tuple[AttentionPlan | FlashPlan, torch.Tensor] | str] = {}
_LOCK = threading.Lock()
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # cuDNN's; saturn's float32


def _layout(t: torch.Tensor) -> Layout:
    return Layout(DTYPES[t.dtype], tuple(t.shape), tuple(t.stride()))


def unfused(q, k, v, scale: float):
    """The product, softmax and product (q scaled first, as the fused kernel scales it)."""
    return torch.softmax((q * scale) @ k.transpose(-2, -1), dim=-1) @ v


def fused_attention_takes(q, k, v, scale: float = 1.0) -> bool:
    """Whether the fused kernel takes these operands (real or fake tensors): saturn GPU
    tensors, a half type, the layouts ``check_operands`` accepts. Any scale is taken (the
    parameter is there because a custom op's ``when`` receives every argument)."""
    if any(t.device.type != "saturn" or t.device.index < 1 for t in (q, k, v)):
        return False
    if q.dtype not in KERNEL_DTYPES or q.dim() != 4 or v.dim() != 4:
        return False
    if missing(q.dtype) is not None:
        return False
    if v.shape[-1] != q.shape[-1]:  # a custom op's output is typed like its first operand
        return False
    out = Layout(DTYPES[q.dtype], tuple(q.shape), packed_strides(tuple(q.shape)))
    try:
        kernel(q.dtype).check_operands(_layout(q), _layout(k), _layout(v), out)
    except AttentionError:
        return False
    return True


class Kernel(NamedTuple):
    """The fused kernel of one dtype: what it takes, the plan that runs it, and the plan
    of its gradient (decision 0128)."""

    check_operands: Callable
    check_bias: Callable
    plan: type
    grad_plan: type


# cuDNN's for half types (codegen/attention.py), saturn's own for float32 (decision 0115)
_CUDNN = Kernel(check_operands, check_bias, AttentionPlan, AttentionGradPlan)
_FLASH = Kernel(
    flash_attention.check_operands, flash_attention.check_bias, FlashPlan, FlashGradPlan
)


def kernel(dtype: torch.dtype) -> Kernel:
    return _FLASH if dtype == torch.float32 else _CUDNN


def missing(dtype: torch.dtype) -> str | None:
    """Why ``dtype``'s fused kernel cannot run here (cuDNN's frontend absent), or None:
    saturn's float32 kernel needs nothing beyond what its GPUs need."""
    return None if kernel(dtype) is _FLASH else cudnn_unavailable()


def cached_plan(cache: dict, key: tuple, build: Callable, device: torch.device, what: Callable):
    """(plan, workspace) for ``key``, built once per key on ``device``'s stream
    (``build(stream)``); None where the plan refused (``AttentionError``: logged once,
    saying ``what()``, and remembered)."""
    with _LOCK:
        have = cache.get(key)
        if have is None:
            index = device.index
            try:
                with torch.saturn.device(index):
                    plan = build(torch.saturn.stream_handle(index))
                ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device=device)
                have = (plan, ws)
            except AttentionError as e:
                log.warning("saturn: %s: %s", what(), e)
                have = str(e)
            cache[key] = have
    return None if isinstance(have, str) else have


def run_fused(out, q, k, v, bias, scale: float, causal: bool, stats=None) -> bool:
    """The fused kernel into ``out`` (and the row statistics into ``stats``); False where
    cuDNN refused this layout (logged once, remembered). Shared with ``device/sdpa.py``."""
    index = out.device.index
    layouts = [_layout(t) for t in (q, k, v, out)]
    blay = _layout(bias) if bias is not None else None
    key = (index, *layouts, blay, scale, causal, stats is not None)

    def build(stream: int):
        return kernel(q.dtype).plan(
            *layouts, scale, stream, bias=blay, causal=causal, stats=stats is not None
        )

    have = cached_plan(
        _PLANS, key, build, out.device, lambda: f"attention {list(q.shape)} runs unfused"
    )
    if have is None:
        return False
    plan, ws = have
    ptrs = [t.data_ptr() for t in (q, k, v, out)]
    ptrs += [t.data_ptr() for t in (bias, stats) if t is not None]
    with torch.saturn.device(index):
        plan.run(tuple(ptrs), ws.data_ptr())
    return True


def _run(out: torch.Tensor, q, k, v, scale: float) -> None:
    if not run_fused(out, q, k, v, None, float(scale), False):
        # refused: the unfused product through saturn's eager ops (products through
        # cuBLASLt; the softmax through the counted CPU fallback)
        count_fallback(attention.name)
        with torch.saturn.device(out.device.index):
            out.copy_(unfused(q, k, v, scale))


attention = custom_op(
    "saturn::attention",
    "(Tensor q, Tensor k, Tensor v, float scale) -> Tensor",
    reference=unfused,
    dtypes=KERNEL_DTYPES,
    host=_run,
    when=fused_attention_takes,
    # attention written out (softmax(q @ k^T * c) @ v) as this op: rewrites=["attention"]
    pattern=Path(__file__).with_name("attention.egg"),
)


def unfused_bias(q, k, v, bias, scale: float):
    """The masked product as it is written out: the scores scaled, then the mask added."""
    return torch.softmax((q @ k.transpose(-2, -1)) * scale + bias, dim=-1) @ v


def bias_view(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A mask that broadcasts to the scores as the kernel reads it, [1 or B, 1 or H, Sq,
    Skv]: leading unit axes added, batch and head axes an expand broadcast (zero strides)
    read once; the query and key axes broadcast by zero strides, which saturn's float32
    kernel reads (cuDNN's gets it packed)."""
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    for axis in (0, 1):
        if bias.stride(axis) == 0:
            bias = bias.narrow(axis, 0, 1)
    bias = bias.expand(bias_shape(q, k, bias))
    return bias if kernel(q.dtype) is _FLASH else bias.contiguous()


def bias_shape(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> tuple[int, ...]:
    """The shape the kernel reads a 4-D mask as: [1 or B, 1 or H, Sq, Skv], its batch and
    head axes kept where they are 1, its query and key axes written out."""
    b, h, sq, _ = q.shape
    return (b if bias.shape[0] != 1 else 1, h if bias.shape[1] != 1 else 1, sq, k.shape[2])


def _run_bias(out: torch.Tensor, q, k, v, bias, scale: float) -> None:
    if not run_fused(out, q, k, v, bias_view(q, k, bias), float(scale), False):
        count_fallback(attention_bias.name)
        with torch.saturn.device(out.device.index):
            out.copy_(unfused_bias(q, k, v, bias, scale))


attention_bias = custom_op(
    "saturn::attention_bias",
    "(Tensor q, Tensor k, Tensor v, Tensor bias, float scale) -> Tensor",
    reference=unfused_bias,
    dtypes=KERNEL_DTYPES,
    host=_run_bias,
    # found by attention.egg's masked forms (the file is attention's pattern)
)
