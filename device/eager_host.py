"""Ops whose CUDA kernel takes operands PyTorch's CPU kernel refuses, computed on the host
with the CUDA kernel's semantics.

A saturn tensor's op with no kernel of saturn's runs on the host (the counted fallback, or
a compiled program's host step): PyTorch's CPU kernel, which for these ops refuses dtypes
that code written for GPUs passes. ``torch.histc`` on integers is one: transformers' mixture
of experts (Mixtral, Qwen-MoE, OLMoE, ...) counts tokens per expert with ``histc`` of
int32 ids on every device but the CPU and MPS, and on a saturn tensor both the eager call
and the compiled graph's host step raised "histogram_cpu not implemented for 'Int'".
Each op here is written once and serves both paths (``HOST`` maps the ATen overload to it;
``host_ops`` looks compiled programs' host steps up there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")


def histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """``torch.histc`` of a host tensor as CUDA computes it (``SummaryOps.cu``). Integers:
    the bounds are taken as int64 (truncated toward zero), an element in [min, max] falls
    in bin ``(x - min) * bins // (max - min)`` in int64 arithmetic (the last bin includes
    ``max``), and the counts have the input's dtype. Floating point: PyTorch's CPU kernel.
    """
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return torch.ops.aten.histc.default(x, bins, min, max)  # its own errors included
    if bins <= 0:
        raise RuntimeError("bins must be > 0")
    lo, hi = int(min), int(max)
    v = x.reshape(-1).to(torch.int64)
    if lo == hi and v.numel() > 0:  # the data's own range, as CUDA reads it back
        lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not lo < hi:
        raise RuntimeError("max must be larger than min")
    v = v[(v >= lo) & (v <= hi)]
    # v - lo >= 0 here, so floor division is C's truncating division
    b = ((v - lo) * bins // (hi - lo)).clamp_max(bins - 1)
    return torch.bincount(b, minlength=bins).to(x.dtype)


HOST: dict[str, Callable] = {"aten.histc.default": histc}


def _on_host(name: str, fn: Callable):
    def kernel(x: torch.Tensor, *args, **kwargs):
        torch.ops.saturn_rt.count_fallback(f"aten::{name}")  # the fallback's key: it runs there
        return fn(x.cpu(), *args, **kwargs).to(x.device)

    return kernel


impl(_lib, "histc", _on_host("histc", histc))
