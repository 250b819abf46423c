"""Scaled dot-product attention, ``softmax(scale * q @ k^T) @ v`` over [B, H, S, D] operands,
as one fused cuDNN kernel (the vendor's Python frontend), planned once per layout.

The fused kernel never writes the [S, S] scores: it keeps a running row maximum and sum
(flash attention), computes in float32 and rounds the probabilities to the operands' type
before the second product, as PyTorch's fused attention kernels do. It takes float16 and
bfloat16 operands with a head dimension that is a multiple of 8 and at most 256, and any
strides whose last axis is contiguous (the heads of a packed projection are read in place).
Anything else is refused with a reason (``AttentionError``) and the caller computes the
unfused product instead. ``run`` takes the pointers of each call and runs on saturn's stream.
"""

from __future__ import annotations

from .conv import _handle, _Ptr
from .gemm import Layout

HEAD_DIM_MAX = 256


class AttentionError(RuntimeError):
    """Operands the fused attention plan cannot take."""


def check_operands(q: Layout, k: Layout, v: Layout, out: Layout) -> None:
    """Raise ``AttentionError`` naming what the fused kernel does not take."""
    if q.dtype not in ("f16", "bf16"):
        raise AttentionError(f"fused attention takes float16 and bfloat16, not {q.dtype}")
    if {k.dtype, v.dtype, out.dtype} != {q.dtype}:
        raise AttentionError("q, k, v and the output must have one dtype")
    if any(len(t.shape) != 4 for t in (q, k, v, out)):
        raise AttentionError("fused attention takes [batch, heads, sequence, head] operands")
    b, h, sq, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:2] != (b, h):
        raise AttentionError(
            f"q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} differ in batch or heads"
        )
    if k.shape[3] != d or v.shape[2] != k.shape[2]:
        raise AttentionError(
            f"k {list(k.shape)} does not pair with q {list(q.shape)} and v {list(v.shape)}"
        )
    if out.shape != (b, h, sq, v.shape[3]):
        raise AttentionError(f"output {list(out.shape)} for q {list(q.shape)}, v {list(v.shape)}")
    for name, dd in (("q and k", d), ("v", v.shape[3])):
        if dd % 8 or dd > HEAD_DIM_MAX:
            raise AttentionError(f"head dimension {dd} of {name}: a multiple of 8 up to 256")
    for name, t in (("q", q), ("k", k), ("v", v), ("output", out)):
        if t.strides[3] != 1:
            raise AttentionError(f"{name}'s head dimension is not contiguous")


class AttentionPlan:
    """``out = softmax(scale * q @ k^T) @ v`` for fixed layouts; ``run`` takes pointers."""

    def __init__(self, q: Layout, k: Layout, v: Layout, out: Layout, scale: float, stream: int):
        check_operands(q, k, v, out)
        import cudnn

        t = {"f16": cudnn.data_type.HALF, "bf16": cudnn.data_type.BFLOAT16}[q.dtype]
        self.stream = stream
        self.handle = _handle(stream)
        try:
            g = cudnn.pygraph(
                io_data_type=t,
                intermediate_data_type=cudnn.data_type.FLOAT,
                compute_data_type=cudnn.data_type.FLOAT,
                handle=self.handle,
            )
            ins = [
                g.tensor(name=n, dim=list(x.shape), stride=list(x.strides), data_type=t)
                for n, x in (("q", q), ("k", k), ("v", v))
            ]
            o, _ = g.sdpa(
                name="attention",
                q=ins[0],
                k=ins[1],
                v=ins[2],
                attn_scale=float(scale),
                generate_stats=False,
            )
            o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.strides))
            o.set_data_type(t)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except Exception as e:
            raise AttentionError(f"cuDNN could not plan this attention: {e}") from e
        self.graph = g
        self.uids = tuple(x.get_uid() for x in (*ins, o))
        self.workspace_size = int(g.get_workspace_size())

    def run(self, ptrs: tuple[int, int, int, int], workspace: int) -> None:
        """``ptrs``: q, k, v, out."""
        self.graph.execute(
            tuple(_Ptr(p) for p in ptrs), _Ptr(workspace), handle=self.handle, tensor_uids=self.uids
        )
