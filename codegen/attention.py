"""Scaled dot-product attention, ``softmax(scale * q @ k^T + bias) @ v`` over [B, H, S, D]
operands, optionally causal (query i sees keys 0..i, PyTorch's top-left alignment), as one
fused cuDNN kernel (the vendor's Python frontend), planned once per layout.

The fused kernel never writes the [S, S] scores: it keeps a running row maximum and sum
(flash attention), computes in float32 and rounds the probabilities to the operands' type
before the second product, as PyTorch's fused attention kernels do. It takes float16 and
bfloat16 operands with a head dimension that is a multiple of 8 and at most 256, and any
strides whose last axis is contiguous (the heads of a packed projection are read in place).
Anything else is refused with a reason (``AttentionError``) and the caller computes the
unfused product instead. ``run`` takes the pointers of each call and runs on saturn's stream.
"""

from __future__ import annotations

from saturn.eqsat.program import packed_strides

from .conv import _handle, _Ptr
from .gemm import Layout

HEAD_DIM_MAX = 256


class AttentionError(RuntimeError):
    """Operands the fused attention plan cannot take."""


def check_bias(q: Layout, k: Layout, bias: Layout) -> None:
    """An additive bias (a mask) the kernel takes: q's dtype, [1 or B, 1 or H, Sq, Skv],
    packed (batch and head axes broadcast by being 1, never by a zero stride)."""
    b, h, sq, _ = q.shape
    if bias.dtype != q.dtype:
        raise AttentionError(f"the bias is {bias.dtype}; q is {q.dtype}")
    if len(bias.shape) != 4:
        raise AttentionError("the bias must be [batch or 1, heads or 1, Sq, Skv]")
    bb, bh, bq, bk = bias.shape
    if bb not in (1, b) or bh not in (1, h) or (bq, bk) != (sq, k.shape[2]):
        raise AttentionError(f"bias {list(bias.shape)} for q {list(q.shape)}, k {list(k.shape)}")
    packed, acc = [], 1
    for n in reversed(bias.shape):
        packed.append(acc)
        acc *= n
    dims = zip(bias.shape, bias.strides, packed[::-1], strict=True)
    if any(n > 1 and st != want for n, st, want in dims):
        raise AttentionError(f"the bias is not packed (strides {list(bias.strides)})")


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


def _graph(dtype: str, handle):
    """A cuDNN graph with ``dtype`` (f16 or bf16) operands, float32 inside, and that type."""
    import cudnn

    t = {"f16": cudnn.data_type.HALF, "bf16": cudnn.data_type.BFLOAT16}[dtype]
    g = cudnn.pygraph(
        io_data_type=t,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    return g, t


def _causal(causal: bool) -> dict:
    """PyTorch's is_causal as cuDNN's options: top-left aligned, nothing right of the
    diagonal."""
    if not causal:
        return {}
    import cudnn

    return {"diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT, "diagonal_band_right_bound": 0}


class AttentionPlan:
    """``out = softmax(scale * q @ k^T + bias) @ v`` (causal if asked) for fixed layouts;
    ``run`` takes pointers: q, k, v, out, then the bias's and the statistics' if planned.
    ``stats`` ([B, H, Sq, 1] float32, packed) asks for each row's log-sum-exp of its
    scaled, biased scores (natural log), which aten's fused attention ops return."""

    def __init__(
        self,
        q: Layout,
        k: Layout,
        v: Layout,
        out: Layout,
        scale: float,
        stream: int,
        bias: Layout | None = None,
        causal: bool = False,
        stats: bool = False,
    ):
        check_operands(q, k, v, out)
        if bias is not None:
            check_bias(q, k, bias)
        import cudnn

        self.stream = stream
        self.handle = _handle(stream)
        try:
            g, t = _graph(q.dtype, self.handle)
            ins = [
                g.tensor(name=n, dim=list(x.shape), stride=list(x.strides), data_type=t)
                for n, x in (("q", q), ("k", k), ("v", v))
            ]
            extra = {}
            if bias is not None:
                ins.append(
                    g.tensor(
                        name="bias", dim=list(bias.shape), stride=list(bias.strides), data_type=t
                    )
                )
                extra["bias"] = ins[-1]
            extra |= _causal(causal)
            o, st = g.sdpa(
                name="attention",
                q=ins[0],
                k=ins[1],
                v=ins[2],
                attn_scale=float(scale),
                generate_stats=stats,
                **extra,
            )
            o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.strides))
            o.set_data_type(t)
            outs = [o]
            if stats:
                b, h, sq, _ = q.shape
                st.set_output(True).set_dim([b, h, sq, 1]).set_stride([h * sq, sq, 1, 1])
                st.set_data_type(cudnn.data_type.FLOAT)
                outs.append(st)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except Exception as e:
            raise AttentionError(f"cuDNN could not plan this attention: {e}") from e
        self.graph = g
        # pointers come as q, k, v, out, [bias], [stats]
        order = [*ins[:3], o, *ins[3:], *outs[1:]]
        self.uids = tuple(x.get_uid() for x in order)
        self.workspace_size = int(g.get_workspace_size())

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        """``ptrs``: q, k, v, out, then the bias and the statistics where planned."""
        self.graph.execute(
            tuple(_Ptr(p) for p in ptrs), _Ptr(workspace), handle=self.handle, tensor_uids=self.uids
        )


def check_grads(q: Layout, k: Layout, v: Layout, grads: tuple[Layout, Layout, Layout]) -> None:
    """dq, dk and dv shaped and typed as q, k and v, each with its head axis contiguous."""
    for name, got, like in zip(("dq", "dk", "dv"), grads, (q, k, v), strict=True):
        if got.shape != like.shape or got.dtype != like.dtype or got.strides[3] != 1:
            raise AttentionError(f"{name} {got} does not pair with {like}")


class AttentionGradPlan:
    """dq, dk, dv of half-type attention (cuDNN's fused backward, flash attention 2) for
    fixed layouts. ``run(ptrs, workspace)``: q, k, v, out, dO, dq, dk, dv, then the bias
    where planned and the row log-sum-exp ([B, H, Sq] float32, packed) where ``lse`` was
    planned as given; otherwise the forward runs once more into the workspace for it (a
    compiled forward does not keep it). Key and value heads equal to q's (the caller
    expands grouped-query heads and sums their gradients)."""

    runs = 0

    def __init__(
        self,
        q: Layout,
        k: Layout,
        v: Layout,
        out: Layout,
        dout: Layout,
        grads: tuple[Layout, Layout, Layout],
        scale: float,
        stream: int,
        bias: Layout | None = None,
        causal: bool = False,
        lse: bool = False,
    ):
        check_operands(q, k, v, out)
        check_operands(q, k, v, dout)
        check_grads(q, k, v, grads)
        if bias is not None:
            check_bias(q, k, bias)
        import cudnn

        b, h, sq, d = q.shape
        self.rows, self.has_bias, self.lse_given = b * h * sq, bias is not None, lse
        self.forward = None
        if not lse:  # the forward once more: its statistics, and an output nobody reads
            scratch = Layout(q.dtype, q.shape, packed_strides(q.shape))
            self.forward = AttentionPlan(
                q, k, v, scratch, scale, stream, bias=bias, causal=causal, stats=True
            )
        self.handle = _handle(stream)
        try:
            g, t = _graph(q.dtype, self.handle)
            ins = [
                g.tensor(name=n, dim=list(x.shape), stride=list(x.strides), data_type=t)
                for n, x in (("q", q), ("k", k), ("v", v), ("o", out), ("dO", dout))
            ]
            stats = g.tensor(
                name="stats",
                dim=[b, h, sq, 1],
                stride=[h * sq, sq, 1, 1],
                data_type=cudnn.data_type.FLOAT,
            )
            extra = {}
            if bias is not None:
                extra["bias"] = g.tensor(
                    name="bias", dim=list(bias.shape), stride=list(bias.strides), data_type=t
                )
            extra |= _causal(causal)
            dq, dk, dv = g.sdpa_backward(
                name="attention_grad",
                q=ins[0],
                k=ins[1],
                v=ins[2],
                o=ins[3],
                dO=ins[4],
                stats=stats,
                attn_scale=float(scale),
                **extra,
            )
            for x, lay in zip((dq, dk, dv), grads, strict=True):
                x.set_output(True).set_dim(list(lay.shape)).set_stride(list(lay.strides))
                x.set_data_type(t)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except Exception as e:
            raise AttentionError(f"cuDNN could not plan this attention's gradient: {e}") from e
        self.graph = g
        order = [*ins, dq, dk, dv] + ([extra["bias"]] if bias is not None else []) + [stats]
        self.uids = tuple(x.get_uid() for x in order)
        own = int(g.get_workspace_size())
        self.stats_at = _round_up(own)  # the recomputed statistics, then the forward's
        extra_bytes = 0
        if self.forward is not None:
            self.out_at = _round_up(self.stats_at + 4 * self.rows)
            self.fwd_ws_at = _round_up(self.out_at + 2 * self.rows * d)
            extra_bytes = self.fwd_ws_at + self.forward.workspace_size - own
        self.workspace_size = own + extra_bytes

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        q, k, v, out, dout, dq, dk, dv, *rest = ptrs
        bias = [rest.pop(0)] if self.has_bias else []
        if self.lse_given:
            lse = rest.pop(0)
        else:
            lse = workspace + self.stats_at
            fwd = (q, k, v, workspace + self.out_at, *bias, lse)
            self.forward.run(fwd, workspace + self.fwd_ws_at)
        self.graph.execute(
            tuple(_Ptr(p) for p in (q, k, v, out, dout, dq, dk, dv, *bias, lse)),
            _Ptr(workspace),
            handle=self.handle,
            tensor_uids=self.uids,
        )
        self.runs += 1


def _round_up(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to
