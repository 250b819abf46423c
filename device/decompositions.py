"""saturn's decomposition table for AOTAutograd, built fresh for each compile.

Core ATen's decompositions, minus every op saturn has a row for (those reach the e-graph
whole, where rules decompose them only as far as the device needs). Never into prims.
"""

from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions

from saturn.eqsat import optable as ot

from . import sdpa, sdpa_grad
from .fused_attention import fused_attention_takes, unfused


def kept_whole() -> set[str]:
    """ATen overloads saturn imports as one op (e.g. ``aten.gelu.default``)."""
    names = {a.split(":")[0] for op in ot.OPS for a in op.aten}
    return names | {
        "aten.t.default",
        "aten.transpose.int",
        "aten.unsqueeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.clone.default",
        "aten.roll.default",  # one roll kernel (import_movement._h_roll)
    }


def transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    """PyTorch's fused encoder-layer fast path (taken in eval mode under no_grad), written in
    the ops it fuses, so the e-graph sees linear layers, attention and layer norms."""
    if mask is not None or src.dim() != 3 or src.is_nested:
        return NotImplemented
    f = torch.nn.functional
    b, s, e = src.shape
    h = num_heads
    d = e // h

    def attention(x):
        qkv = f.linear(x, qkv_weight, qkv_bias)
        q, k, v = (
            qkv[..., i * e : (i + 1) * e].reshape(b, s, h, d).transpose(1, 2) for i in range(3)
        )
        scale = 1.0 / d**0.5  # q is scaled before the product, as the fused kernels do
        if fused_attention_takes(q, k, v):  # one cuDNN kernel (half types on a GPU)
            o = torch.ops.saturn.attention(q, k, v, scale)
        else:
            o = unfused(q, k, v, scale)
        o = o.transpose(1, 2).reshape(b, s, e)
        return f.linear(o, proj_weight, proj_bias)

    def feed_forward(x):
        y = f.linear(x, ffn_weight_1, ffn_bias_1)
        y = f.gelu(y) if use_gelu else f.relu(y)
        return f.linear(y, ffn_weight_2, ffn_bias_2)

    def ln1(x):
        return f.layer_norm(x, (e,), norm_weight_1, norm_bias_1, eps)

    def ln2(x):
        return f.layer_norm(x, (e,), norm_weight_2, norm_bias_2, eps)

    x = src
    if norm_first:
        x = x + attention(ln1(x))
        return x + feed_forward(ln2(x))
    x = ln1(x + attention(x))
    return ln2(x + feed_forward(x))


def embedding_dense_backward(
    grad_output, indices, num_weights: int, padding_idx: int, scale_grad_by_freq: bool
):
    """An embedding's weight gradient with the token ids clamped into the table and the
    rows of ids outside it (and of ``padding_idx``) zeroed, as newer PyTorch releases
    decompose it (older ones add rows at the raw ids): every index of the row add then
    provably lies in the table, so a compiled backward needs no bounds check read back
    after the call (eqsat/ranges.py). The values are the same wherever every id is in
    range, which the forward's take has checked for the same ids."""
    if scale_grad_by_freq:
        return NotImplemented
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    compute, result = elementwise_dtypes(
        grad_output, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    grad_output = grad_output.to(compute)
    indices = indices.long()
    keep = (indices >= 0) & (indices < num_weights) & (indices != padding_idx)
    keep = keep.reshape(*keep.shape, *([1] * (grad_output.dim() - keep.dim())))
    rows = indices.clamp(-num_weights, num_weights - 1)
    grad_weight = grad_output.new_zeros((num_weights, *grad_output.shape[indices.dim() :]))
    values = grad_output.masked_fill(~keep, 0)
    out = torch.ops.aten._unsafe_index_put(grad_weight, [rows], values, accumulate=True)
    return out.to(result)


def _flat_positions(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """The row-major position in ``x`` of each element ``gather`` and ``scatter`` address:
    ``index`` along ``dim``, the element's own coordinate along every other axis. An index
    outside [0, x.shape[dim]) gets ``x.numel()``, a position outside every table, so the
    take or row add reading it raises instead of reading another row's element (PyTorch
    does not wrap negative indices here)."""
    strides = [1] * x.dim()
    for k in range(x.dim() - 2, -1, -1):
        strides[k] = strides[k + 1] * x.shape[k + 1]
    flat = index * strides[dim]
    for k in range(x.dim()):
        if k != dim and index.shape[k] > 1:
            shape = [index.shape[k] if j == k else 1 for j in range(x.dim())]
            pos = torch.arange(index.shape[k], device=index.device).view(shape)
            flat = flat + pos * strides[k]
    inside = (index >= 0) & (index < x.shape[dim])
    return flat.masked_fill(~inside, x.numel()).reshape(-1)


def _addressable(x: torch.Tensor, dim: int, index: torch.Tensor) -> bool:
    """Whether ``_flat_positions`` covers this call: an int64 index of x's rank, no wider
    than x off ``dim``, not empty (PyTorch's own op raises on the rest, or has nothing to
    do)."""
    return (
        x.dim() > 0
        and index.dim() == x.dim()
        and index.dtype == torch.int64
        and index.numel() > 0
        and all(index.shape[k] <= x.shape[k] for k in range(x.dim()) if k != dim % x.dim())
    )


def gather(x, dim: int, index, sparse_grad: bool = False):
    """``gather`` as a row take of x's elements at their flat positions (cross-entropy's
    pick of the target's log-probability): an index loop and a take kernel on a GPU, where
    the op had no kernel and its operand crossed to the host. Moves bits: every value,
    both zeros, infinities and NaN payloads, arrives unchanged. An index out of range
    raises IndexError (PyTorch: RuntimeError)."""
    if sparse_grad or not _addressable(x, dim, index):
        return NotImplemented
    flat = _flat_positions(x, dim % x.dim(), index)
    return torch.index_select(x.reshape(-1), 0, flat).view(index.shape)


def _hits(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """Whether each element of x is addressed by ``index`` (``scatter``), as counts added
    at the flat positions (a row add on a GPU, which raises on an index out of range)."""
    flat = _flat_positions(x, dim, index)
    counts = torch.zeros(x.numel(), dtype=torch.int32, device=x.device)
    ones = torch.ones(flat.shape, dtype=torch.int32, device=x.device)
    return torch.index_put(counts, (flat,), ones, accumulate=True).view(x.shape) > 0


def scatter_value(x, dim: int, index, value):
    """``scatter`` of one value (cross-entropy's backward writes -1 at each target): x
    with ``value`` where ``index`` addresses it. Exact: the result selects, element by
    element, x's bits or the value's (converted to x's dtype as PyTorch converts it),
    and repeated positions receive the same value either way."""
    if not _addressable(x, dim, index):
        return NotImplemented
    return x.masked_fill(_hits(x, dim % x.dim(), index), value)


def scatter_add(x, dim: int, index, src):
    """``scatter_add`` (``gather``'s gradient): src's elements added into x at their flat
    positions, as a row add on a GPU (atomic adds: repeated positions add up in another
    order than PyTorch's CPU loop, as ``index_put`` with accumulate does)."""
    if not _addressable(x, dim, index) or src.dim() != x.dim() or src.dtype != x.dtype:
        return NotImplemented
    if any(index.shape[k] > src.shape[k] for k in range(x.dim())):
        return NotImplemented
    flat = _flat_positions(x, dim % x.dim(), index)
    picked = src[tuple(slice(0, n) for n in index.shape)].reshape(-1)
    return torch.index_put(x.reshape(-1), (flat,), picked, accumulate=True).view(x.shape)


def _no_wrap(core):
    """PyTorch's ``core`` decomposition (``index_add``, ``index_copy``: an ``index_put``)
    with the index's negatives sent past the indexed axis. Those ops raise on a negative
    index where ``index_put`` wraps it, so without this a compiled ``index_add`` of -1
    would add into the last row: now the row add (or PyTorch's ``index_put`` on the host)
    raises, and the call reruns uncompiled to raise PyTorch's own error (decision 0050).
    In-range indices are untouched, so results are the same bits."""

    def decomposition(x, dim: int, index, source, *args, **kwargs):
        size = x.shape[dim] if x.dim() else 1
        return core(x, dim, index.masked_fill(index < 0, size), source, *args, **kwargs)

    return decomposition


def table() -> dict:
    """The decompositions AOTAutograd applies before import: PyTorch's core ATen table less
    the ops saturn imports whole, and saturn's own. Built once per set of registered
    CompositeImplicitAutograd kernels (PyTorch's table lists those ops, and building it
    walks the dispatcher: 0.1 s, which every compile paid); a library loaded later that
    registers more builds it again."""
    key = len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
    if _TABLE.get("key") != key:
        _TABLE.update(key=key, table=_build_table())
    return dict(_TABLE["table"])  # a copy: a caller's change stays its own


_TABLE: dict = {}


def _build_table() -> dict:
    keep = kept_whole()
    core = core_aten_decompositions()
    out = {
        op: fn
        for op, fn in core.items()
        if isinstance(op, torch._ops.OpOverload) and str(op) not in keep
    }
    for op in (torch.ops.aten.index_add.default, torch.ops.aten.index_copy.default):
        out[op] = _no_wrap(core[op])
    out[torch.ops.aten._transformer_encoder_layer_fwd.default] = transformer_encoder_layer_fwd
    out[torch.ops.aten.embedding_dense_backward.default] = embedding_dense_backward
    out[torch.ops.aten.gather.default] = gather
    out[torch.ops.aten.scatter.value] = scatter_value
    out[torch.ops.aten.scatter_add.default] = scatter_add
    out[torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default] = (
        sdpa.decomposition
    )
    out[torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default] = (
        sdpa_grad.decomposition
    )
    return out
