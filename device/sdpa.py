"""``F.scaled_dot_product_attention`` on saturn tensors: one fused kernel where it can be.

aten's ``scaled_dot_product_attention`` asks the device which kernel to call. saturn's answer
(``csrc/attention.cpp``) is aten's math (two batched products and a softmax over the whole
[Sq, Skv] score matrix, in float32) for dropout, gradients, odd head sizes and float32 on
saturn:0; and for half types, and float32 on a GPU,
``_scaled_dot_product_fused_attention_overrideable``, implemented here:

* eager calls: one fused kernel on a GPU (cuDNN's for half types, ``codegen/attention.py``;
  saturn's own for float32, ``codegen/flash_attention.py``; with the row log-sum-exp the op
  returns), the math everywhere else (saturn:0, layouts a kernel refuses);
* compiled graphs (``decomposition``, in saturn's decomposition table): a ``saturn::sdpa``
  or ``saturn::sdpa_bias`` custom op where the fused kernel takes the operands (placed on
  the device as one ``Custom`` step), aten's math written out otherwise, so the e-graph sees
  exactly what it saw before this op was chosen.

Both write the result with the sequence axis outside the heads ([B, Sq, H, D] memory viewed
as [B, H, Sq, D], as PyTorch's fused CUDA kernels allocate it): models transpose it back
and merge the heads, which is then a view, not a copy. The custom ops therefore take q as
that transposed view ([B, Sq, H, D]) and return [B, Sq, H, D] (a custom op's result is typed
like its first operand).

Grouped-query heads (fewer key/value heads than query heads, which aten passes unexpanded)
are expanded before the fused kernel, as ``enable_gqa`` expands them (``repeat_interleave``).
The fused kernel computes in float32 and rounds the probabilities to the half type before
the second product, as PyTorch's own fused CUDA kernels do; the math rounds only the result.
A row whose every score is -inf (every key masked) is 0 in the math (``_safe_softmax``)
and not defined by the fused kernel, as with PyTorch's fused CUDA kernels.
"""

from __future__ import annotations

import math

import torch

from saturn.codegen.attention import AttentionError
from saturn.codegen.gemm import Layout

from .custom_ops import count_fallback, custom_op
from .dtypes import DTYPES
from .eager_registry import impl
from .fused_attention import (
    _PLANS,  # noqa: F401 (tests read _PLANS)
    KERNEL_DTYPES,
    _layout,
    bias_shape,
    kernel,
    missing,
)
from .fused_attention import run_fused as _run_fused

aten = torch.ops.aten


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def expand_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Key or value heads repeated to q's head count (``enable_gqa``'s repeat_interleave:
    query head h reads key/value head h // (Hq / Hkv))."""
    hq, hk = q.shape[1], kv.shape[1]
    if hq == hk:
        return kv
    b, _, s, d = kv.shape
    return kv[:, :, None].expand(b, hk, hq // hk, s, d).reshape(b, hq, s, d)


def bias4(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A mask broadcast to [1 or B, 1 or H, Sq, Skv], packed (what the kernel reads):
    leading unit axes added; query and key axes that broadcast are written out."""
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    shape = bias_shape(q, k, bias)
    if tuple(bias.shape) != shape or not bias.is_contiguous():
        bias = bias.expand(shape).contiguous()
    return bias


def _scores(q, k, bias, scale: float, causal: bool) -> torch.Tensor:
    """The scaled, masked scores in float32 (causal: nothing right of the diagonal)."""
    k = expand_heads(q, k)
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if bias is not None:
        s = s + bias.float()
    return s


def reference(q, k, v, bias=None, scale: float = 1.0, causal: bool = False):
    """Attention as aten's math computes it on a device: float32 throughout, the result
    rounded once to the operands' type."""
    p = aten._safe_softmax(_scores(q, k, bias, scale, causal), -1)
    return (p @ expand_heads(q, v).float()).to(q.dtype)


def log_sum_exp(q, k, bias, scale: float, causal: bool) -> torch.Tensor:
    """Each row's log-sum-exp of its scaled (masked) scores, float32 [B, H, Sq]."""
    return torch.logsumexp(_scores(q, k, bias, scale, causal), -1)


def layouts_take(q, k, v, bias=None) -> bool:
    """Whether the fused kernel takes these operands' dtypes and layouts (real or fake
    tensors, k and v with q's heads): a half type, what ``check_operands`` and
    ``check_bias`` accept."""
    if q.dtype not in KERNEL_DTYPES:
        return False
    if q.dim() != 4 or v.dim() != 4 or v.shape[-1] != q.shape[-1]:
        return False
    out = Layout(DTYPES[q.dtype], tuple(q.shape), _out_strides(tuple(q.shape)))
    fused = kernel(q.dtype)
    try:
        fused.check_operands(_layout(q), _layout(k), _layout(v), out)
        if bias is not None:
            fused.check_bias(_layout(q), _layout(k), _layout(bias))
    except AttentionError:
        return False
    return True


def _out_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The result's strides: [B, Sq, H, D] memory viewed as [B, H, Sq, D]."""
    _, h, sq, d = shape
    return (sq * h * d, d, h * d, 1)


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    b, h, sq, d = q.shape
    return torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)


def on_fused_device(*ts: torch.Tensor) -> bool:
    """Where a fused kernel can run: saturn GPU tensors, cuDNN present for half types
    (float32 runs saturn's own kernel)."""
    on_gpu = all(t.device.type == "saturn" and t.device.index >= 1 for t in ts)
    return on_gpu and missing(ts[0].dtype) is None


def fused_takes(q, k, v, bias=None) -> bool:
    """Whether the fused kernel runs for these operands: on its device, layouts it takes."""
    ts = [q, k, v] + ([bias] if bias is not None else [])
    return on_fused_device(*ts) and layouts_take(q, k, v, bias)


def _split(rest: tuple) -> tuple:
    """(bias, scale, causal) from what follows q, k, v: ``saturn::sdpa`` passes
    (scale, causal), ``saturn::sdpa_bias`` (bias, scale)."""
    if isinstance(rest[0], torch.Tensor):
        return rest[0], rest[1], False
    return None, rest[0], rest[1]


def _host(name: str):
    def run(out, qt, k, v, *rest) -> None:
        bias, scale, causal = _split(rest)
        q, o = qt.transpose(1, 2), out.transpose(1, 2)
        if not _run_fused(o, q, k, v, bias, float(scale), bool(causal)):
            count_fallback(name)  # the math on the device's eager ops
            with torch.saturn.device(out.device.index):
                o.copy_(reference(q, k, v, bias, float(scale), bool(causal)))

    return run


def _sdpa_ref(qt, k, v, scale: float, causal: bool):
    return reference(qt.transpose(1, 2), k, v, None, scale, causal).transpose(1, 2).contiguous()


def _sdpa_bias_ref(qt, k, v, bias, scale: float):
    return reference(qt.transpose(1, 2), k, v, bias, scale, False).transpose(1, 2).contiguous()


def _takes(qt, k, v, *rest) -> bool:
    return fused_takes(qt.transpose(1, 2), k, v, _split(rest)[0])


# q is passed as its [B, Sq, H, D] view and the result is [B, Sq, H, D] (module docstring)
sdpa = custom_op(
    "saturn::sdpa",
    "(Tensor qt, Tensor k, Tensor v, float scale, bool causal) -> Tensor",
    reference=_sdpa_ref,
    dtypes=KERNEL_DTYPES,
    host=_host("saturn::sdpa"),
    when=_takes,
)
sdpa_bias = custom_op(
    "saturn::sdpa_bias",
    "(Tensor qt, Tensor k, Tensor v, Tensor bias, float scale) -> Tensor",
    reference=_sdpa_bias_ref,
    dtypes=KERNEL_DTYPES,
    host=_host("saturn::sdpa_bias"),
    when=_takes,
    packed=("bias",),  # a mask broadcast by a zero stride, which the kernel does not read
)


def _results(q, k, out, lse):
    """The op's nine results: cumulative sequence lengths and the debug mask are not
    produced (no nested tensors, no dropout), the RNG seed and offset are zeros."""
    zero = torch.zeros((), dtype=torch.long, device=q.device)
    return (out, lse, None, None, q.shape[-2], k.shape[-2], zero, zero.clone(), None)


def _batched(*ts: torch.Tensor) -> list[torch.Tensor]:
    """[B, H, S, D] operands: a 3-D call is one batch."""
    return [t.unsqueeze(0) if t.dim() == 3 else t for t in ts]


def _fused_operands(query, key, value, attn_bias, dropout_p: float):
    """(q, k, v, bias) as the fused kernel reads them (key and value heads expanded, the
    mask broadcast and packed in its own dtype: aten turned a boolean one into 0 and
    -inf), or None where it does not run. Nothing is copied where it cannot run."""
    if dropout_p != 0.0 or not on_fused_device(query, key, value):
        return None
    q, k, v = _batched(query, key, value)
    k, v = expand_heads(q, k), expand_heads(q, v)
    bias = bias4(q, k, attn_bias) if attn_bias is not None else None
    return (q, k, v, bias) if fused_takes(q, k, v, bias) else None


def _math(query, key, value, attn_bias, dropout_p: float, is_causal: bool, scale):
    """aten's math for the op's operands (grouped-query heads where they differ)."""
    out, _ = aten._scaled_dot_product_attention_math(
        query,
        key,
        value,
        attn_bias,
        dropout_p,
        is_causal,
        None,
        scale=scale,
        enable_gqa=query.shape[-3] != key.shape[-3],
    )
    return out


def overrideable(
    query,
    key,
    value,
    attn_bias=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
):
    """The eager kernel: fused on a GPU where it takes the call, the math otherwise."""
    s = _scale(query, scale)
    fused = _fused_operands(query, key, value, attn_bias, dropout_p)
    if fused is not None:
        q, k, v, bias = fused
        out = _empty_out(q)
        b, h, sq, _ = q.shape
        stats = torch.empty((b, h, sq, 1), dtype=torch.float32, device=q.device)
        if _run_fused(out, q, k, v, bias, s, is_causal, stats):
            if query.dim() == 3:
                out = out.squeeze(0)
            return _results(query, key, out, stats.view(b, h, sq))
        count_fallback("aten::_scaled_dot_product_fused_attention_overrideable")
    out = _math(query, key, value, attn_bias, dropout_p, is_causal, scale)
    lse = log_sum_exp(*_batched(query, key), attn_bias, s, is_causal)
    return _results(query, key, out, lse)


def decomposition(
    query,
    key,
    value,
    attn_bias=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
):
    """The op in a compiled graph: the fused custom op where it takes the operands, aten's
    math otherwise; the log-sum-exp written out beside it (unused in inference graphs,
    where it is dropped with the other unused results)."""
    s = _scale(query, scale)
    fused = _fused_operands(query, key, value, attn_bias, dropout_p)
    if fused is not None:
        q, k, v, bias = fused
        qt = q.transpose(1, 2)
        if bias is None:
            out = torch.ops.saturn.sdpa(qt, k, v, s, is_causal).transpose(1, 2)
        else:
            out = torch.ops.saturn.sdpa_bias(qt, k, v, bias, s).transpose(1, 2)
        if query.dim() == 3:
            out = out.squeeze(0)
    else:
        out = _math(query, key, value, attn_bias, dropout_p, is_causal, scale)
    lse = log_sum_exp(*_batched(query, key), attn_bias, s, is_causal)
    return _results(query, key, out, lse)


_lib = torch.library.Library("aten", "IMPL")  # kept: a dropped Library unregisters
impl(_lib, "_scaled_dot_product_fused_attention_overrideable", overrideable)
