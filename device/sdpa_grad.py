"""The gradient of ``F.scaled_dot_product_attention`` on a GPU: saturn's own float32 kernel
(``codegen/flash_grad.py``) and cuDNN's fused backward for half types
(``codegen/attention.py``'s ``AttentionGradPlan``), eager and compiled.

Where a gradient is needed, the device's ``_fused_sdp_choice`` (``csrc/attention.cpp``)
answers *overrideable* on saturn:1.. as it does without one (no dropout, a mask that needs
no gradient; saturn:0 keeps the math), by default only for float32 rows whose length is
not a multiple of 4 (``MODE``, decision 0132); aten's autograd formula for
``_scaled_dot_product_fused_attention_overrideable`` then calls
``_scaled_dot_product_fused_attention_overrideable_backward``, implemented here:

* eager calls: the gradient kernel, with the log-sum-exp the forward returned; aten's math
  where it does not take the operands (counted as a fallback);
* compiled graphs (``decomposition``, in saturn's decomposition table): ``saturn::sdpa_grad``
  or ``saturn::sdpa_grad_bias``, host custom ops placed on the device as one ``Custom``
  step, where the kernel takes the operands; the math written out otherwise. The compiled
  forward does not keep its log-sum-exp (``sdpa.decomposition`` writes it out beside the
  fused op, and nothing reads it), so the plan recomputes it (the forward kernel once more,
  before the gradient kernel).

A custom op's result is typed like its first operand, and the three gradients are one
result: the ops take a ``like`` of q's dtype and ``numel(dq) + numel(dk) + numel(dv)``
elements first, read for its type only, and return dq, dk and dv one after another, each
as [B, S, H, D] memory (the layout of the forward's output, which the model's transposes
and head merges then read as views). Grouped-query heads are expanded before the kernel
and their gradients summed after it, as the forward expands them.
"""

from __future__ import annotations

import torch

from saturn.codegen.attention import AttentionError
from saturn.codegen.flash_grad import check, config

from .custom_ops import count_fallback, custom_op
from .eager_registry import impl
from .fused_attention import KERNEL_DTYPES, _layout, cached_plan, kernel, missing
from .sdpa import _batched, _scale, _scores, bias4, expand_heads, on_fused_device

aten = torch.ops.aten

# How attention with a gradient runs on a GPU (``set_kernels``): "math" is aten's math,
# forward and backward, as before decision 0128; "fused" the fused kernels wherever they
# take the operands; "auto" (the default, decision 0132) the fused kernels only for
# float32 attention whose query or key length is not a multiple of 4, where the H100's
# training rows were faster with them (DeiT-tiny, 197 tokens: 13.60 against 14.79 ms), and
# the math elsewhere (512 tokens: DistilBERT 35.04 against 34.97, GPT-NeoX 72.36 against
# 69.93). The device's choice (``csrc/attention.cpp``) applies the rule; this module's
# backward runs a kernel, once the forward took the fused op, unless the mode is "math".
MODES = ("math", "fused", "auto")  # their indices are the device's grad_mode
MODE = "auto"
_PLANS: dict[tuple, tuple | str] = {}  # gradient plans and workspaces (cached_plan)


def math_grads(dout, q, k, v, bias, scale: float, causal: bool):
    """dq, dk, dv as aten's math computes them (float32, probabilities by
    ``_safe_softmax``), in the operands' dtype; key and value gradients summed over the
    query heads that share them (grouped-query heads)."""
    ke, ve = expand_heads(q, k).float(), expand_heads(q, v).float()
    p = aten._safe_softmax(_scores(q, k, bias, scale, causal), -1)
    g = dout.float()
    dv = p.transpose(-2, -1) @ g
    dp = g @ ve.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = (ds @ ke) * scale
    dk = (ds.transpose(-2, -1) @ q.float()) * scale
    return dq.to(q.dtype), _fold(dk, k).to(k.dtype), _fold(dv, v).to(v.dtype)


def _fold(grad: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """A gradient over expanded heads summed back onto ``kv``'s (``expand_heads``' order:
    query head h reads key/value head h // G)."""
    b, h, s, d = grad.shape
    hk = kv.shape[1]
    return grad if h == hk else grad.view(b, hk, h // hk, s, d).sum(2)


def set_kernels(mode: str | bool) -> None:
    """How attention with a gradient runs on a GPU (one of ``MODES``; True is "fused",
    False "math"): the device's choice (``csrc/attention.cpp``) and this module's
    ``MODE`` together."""
    global MODE
    if isinstance(mode, bool):
        mode = "fused" if mode else "math"
    if mode not in MODES:
        raise ValueError(f"unknown attention gradient mode {mode!r}; one of {MODES}")
    MODE = mode
    torch.ops.saturn_rt.set_attention_grad_mode(MODES.index(mode))


def grad_takes(q, k, v, out, dout, bias=None) -> bool:
    """Whether the gradient kernel takes these operands (real or fake tensors; k and v
    with q's heads): saturn GPU tensors of a kernel's dtype (cuDNN present for half
    types) in layouts it reads."""
    if q.dtype not in KERNEL_DTYPES or missing(q.dtype) is not None:
        return False
    if not on_fused_device(q, k, v, out, dout) or q.dim() != 4 or k.shape[1] != q.shape[1]:
        return False
    checks = kernel(q.dtype)  # saturn's float32 kernel, cuDNN's for half types
    try:
        checks.check_operands(_layout(q), _layout(k), _layout(v), _layout(out))
        checks.check_operands(_layout(q), _layout(k), _layout(v), _layout(dout))
        if q.dtype == torch.float32:
            check(q.shape[-1], config(q.shape[-1]))
        if bias is not None:
            checks.check_bias(_layout(q), _layout(k), _layout(bias))
    except AttentionError:
        return False
    return True


def run_grad(dq, dk, dv, q, k, v, out, dout, bias, scale: float, causal: bool, lse=None) -> bool:
    """The gradient kernel into dq, dk, dv (the row log-sum-exp ``lse`` [B, H, Sq] packed,
    or None: recomputed); False where it refused these layouts (logged once, remembered)."""
    lays = [_layout(t) for t in (q, k, v, out, dout, dq, dk, dv)]
    blay = _layout(bias) if bias is not None else None
    key = (q.device.index, *lays, blay, scale, causal, lse is not None)

    def build(stream: int):
        return kernel(q.dtype).grad_plan(
            *lays[:5],
            tuple(lays[5:]),
            scale,
            stream,
            bias=blay,
            causal=causal,
            lse=lse is not None,
        )

    have = cached_plan(
        _PLANS,
        key,
        build,
        q.device,
        lambda: f"the gradient of attention {list(q.shape)} is the math",
    )
    if have is None:
        return False
    plan, ws = have
    ptrs = [t.data_ptr() for t in (q, k, v, out, dout, dq, dk, dv)]
    ptrs += [t.data_ptr() for t in (bias, lse) if t is not None]
    with torch.saturn.device(q.device.index):
        plan.run(tuple(ptrs), ws.data_ptr())
    return True


def _pieces(flat: torch.Tensor, q, k, v):
    """dq, dk, dv as [B, H, S, D] views of [B, S, H, D] pieces of ``flat``, one after another."""
    views, at = [], 0
    for t in (q, k, v):
        b, h, s, d = t.shape
        n = b * h * s * d
        views.append(flat[at : at + n].view(b, s, h, d).transpose(1, 2))
        at += n
    return views


def _total(q, k, v) -> int:
    return q.numel() + k.numel() + v.numel()


def _flat(dq, dk, dv) -> torch.Tensor:
    return torch.cat([g.transpose(1, 2).reshape(-1) for g in (dq, dk, dv)])


def _split(rest: tuple) -> tuple:
    """(bias, scale, causal) from what follows out: ``sdpa_grad`` passes (scale, causal),
    ``sdpa_grad_bias`` (bias, scale)."""
    if isinstance(rest[0], torch.Tensor):
        return rest[0], rest[1], False
    return None, rest[0], rest[1]


def _reference(like, dout_t, qt, k, v, out_t, *rest):
    bias, scale, causal = _split(rest)
    q = qt.transpose(1, 2)
    return _flat(*math_grads(dout_t.transpose(1, 2), q, k, v, bias, float(scale), bool(causal)))


def _grad_ref(like, dout_t, qt, k, v, out_t, scale: float, causal: bool):
    return _reference(like, dout_t, qt, k, v, out_t, scale, causal)


def _grad_bias_ref(like, dout_t, qt, k, v, out_t, bias, scale: float):
    return _reference(like, dout_t, qt, k, v, out_t, bias, scale)


def _host(name: str):
    def run(flat, like, dout_t, qt, k, v, out_t, *rest) -> None:
        bias, scale, causal = _split(rest)
        q, dout, out = qt.transpose(1, 2), dout_t.transpose(1, 2), out_t.transpose(1, 2)
        dq, dk, dv = _pieces(flat, q, k, v)
        if not run_grad(dq, dk, dv, q, k, v, out, dout, bias, float(scale), bool(causal)):
            count_fallback(name)  # the math on the device's eager ops
            with torch.saturn.device(flat.device.index):
                flat.copy_(_reference(like, dout_t, qt, k, v, out_t, *rest))

    return run


def _takes(like, dout_t, qt, k, v, out_t, *rest) -> bool:
    q = qt.transpose(1, 2)
    return grad_takes(q, k, v, out_t.transpose(1, 2), dout_t.transpose(1, 2), _split(rest)[0])


sdpa_grad = custom_op(
    "saturn::sdpa_grad",
    "(Tensor like, Tensor dout_t, Tensor qt, Tensor k, Tensor v, Tensor out_t, float scale, "
    "bool causal) -> Tensor",
    reference=_grad_ref,
    dtypes=KERNEL_DTYPES,
    host=_host("saturn::sdpa_grad"),
    when=_takes,
)
sdpa_grad_bias = custom_op(
    "saturn::sdpa_grad_bias",
    "(Tensor like, Tensor dout_t, Tensor qt, Tensor k, Tensor v, Tensor out_t, Tensor bias, "
    "float scale) -> Tensor",
    reference=_grad_bias_ref,
    dtypes=KERNEL_DTYPES,
    host=_host("saturn::sdpa_grad_bias"),
    when=_takes,
)


def _grad_operands(query, key, value, out, grad_out, attn_bias, dropout_p: float):
    """(q, k, v, out, dO, bias) as the gradient kernel reads them (key and value heads
    expanded, the mask broadcast and packed), or None where it does not run."""
    if MODE == "math" or dropout_p != 0.0 or query.dtype not in KERNEL_DTYPES:
        return None
    if not on_fused_device(query, key, value, out, grad_out):
        return None
    q, k, v, o, g = _batched(query, key, value, out, grad_out)
    k, v = expand_heads(q, k), expand_heads(q, v)
    bias = bias4(q, k, attn_bias) if attn_bias is not None else None
    return (q, k, v, o, g, bias) if grad_takes(q, k, v, o, g, bias) else None


def _results(query, key, value, grads):
    """(dq, dk, dv) for the op's operands (3-D: one batch), and no bias gradient."""
    if query.dim() == 3:
        grads = [g.squeeze(0) for g in grads]
    return (*grads, None)


def _math_results(grad_out, query, key, value, attn_bias, scale: float, causal: bool):
    q, k, v, g = _batched(query, key, value, grad_out)
    return _results(query, key, value, math_grads(g, q, k, v, attn_bias, scale, causal))


def _check(dropout_p: float, grad_input_mask) -> None:
    # the forward chose this op only without dropout, for a mask that needs no gradient
    if dropout_p != 0.0:
        raise NotImplementedError("saturn: attention's fused gradient with dropout")
    if len(grad_input_mask) > 3 and grad_input_mask[3]:
        raise NotImplementedError("saturn: the gradient of an attention mask")


def _backward(
    compiled: bool,
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    """The op's arguments (aten's schema) to (dq, dk, dv, None): the gradient kernel where
    it takes them (eager: run with the forward's log-sum-exp; compiled: the custom op),
    aten's math otherwise (eager: computed; compiled: written out)."""
    _check(dropout_p, grad_input_mask)
    s = _scale(query, scale)
    fused = _grad_operands(query, key, value, out, grad_out, attn_bias, dropout_p)
    if fused is None:
        return _math_results(grad_out, query, key, value, attn_bias, s, is_causal)
    q, k, v, o, g, bias = fused
    kb, vb = _batched(key, value)
    if compiled:
        like = torch.zeros(_total(q, k, v), dtype=q.dtype, device=q.device)
        ts = (like, g.transpose(1, 2), q.transpose(1, 2), k, v, o.transpose(1, 2))
        if bias is None:
            flat = torch.ops.saturn.sdpa_grad(*ts, s, is_causal)
        else:
            flat = torch.ops.saturn.sdpa_grad_bias(*ts, bias, s)
        dq, dk, dv = _pieces(flat, q, k, v)
        return _results(query, key, value, (dq, _fold(dk, kb), _fold(dv, vb)))
    dq, dk, dv = _pieces(torch.empty(_total(q, k, v), dtype=q.dtype, device=q.device), q, k, v)
    lse = logsumexp.reshape(q.shape[:3]).contiguous()
    if run_grad(dq, dk, dv, q, k, v, o, g, bias, s, is_causal, lse):
        return _results(query, key, value, (dq, _fold(dk, kb), _fold(dv, vb)))
    count_fallback("aten::_scaled_dot_product_fused_attention_overrideable_backward")
    return _math_results(grad_out, query, key, value, attn_bias, s, is_causal)


def overrideable_backward(*args, scale=None):
    """The eager kernel (PrivateUse1): saturn's gradient kernel on a GPU where it takes the
    call, the math otherwise."""
    return _backward(False, *args, scale=scale)


def decomposition(*args, scale=None):
    """The op in a compiled graph: ``saturn::sdpa_grad`` (``_bias``) where the kernel takes
    the operands, aten's math written out otherwise."""
    return _backward(True, *args, scale=scale)


_lib = torch.library.Library("aten", "IMPL")  # kept: a dropped Library unregisters
impl(_lib, "_scaled_dot_product_fused_attention_overrideable_backward", overrideable_backward)
