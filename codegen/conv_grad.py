"""A 2-D convolution's gradients through cuDNN's graph API: backward-data (the input's)
and backward-filter (the weight's), planned once for one set of layouts and tuned as the
forward convolution's plans are (``codegen/conv.py``), on the runner's stream and shared
convolution workspace."""

from __future__ import annotations

from .conv import ConvError, ConvParams, ConvPlan, depthwise, output_extents
from .gemm import Layout


class ConvGradPlan(ConvPlan):
    """A 2-D convolution's gradient for fixed layouts: the input's (``of="input"``: cuDNN's
    backward-data, from the output's gradient and the weight) or the weight's
    (``of="weight"``: backward-filter, from the output's gradient and the input), as eager
    CUDA's ``convolution_backward`` computes them. ``run`` takes the pointers of the
    output's gradient, the other operand and the result, in that order; ``autotune`` as
    the convolution's. Half types accumulate in float32 and round once; float32 keeps
    float32 engines unless ``tf32``."""

    def __init__(
        self,
        of: str,
        grad: Layout,
        other: Layout,
        out: Layout,
        p: ConvParams,
        stream: int,
        tf32: bool = False,
    ):
        if of not in ("input", "weight"):
            raise ConvError(f"a convolution has no gradient of its {of!r}")
        if any(len(t.shape) != 4 for t in (grad, other, out)):
            raise ConvError("cuDNN plans here are 2-D convolutions (rank-4 operands)")
        if other.dtype != grad.dtype or out.dtype != grad.dtype:
            raise ConvError(f"operand dtypes {grad.dtype}, {other.dtype}, {out.dtype} differ")
        x, w = (out, other) if of == "input" else (other, out)
        want = output_extents(x, w, p)
        if tuple(grad.shape) != want:
            raise ConvError(f"output gradient {list(grad.shape)} is not PyTorch's {list(want)}")
        self._plan(
            lambda t, acc: self._grad_graph(of, grad, other, out, p, t, acc),
            grad.dtype,
            depthwise(w.shape, p.groups),
            tf32,
            False,
            None,
            stream,
        )
        self.problem = self._problem(f"cudnn-{of}-grad", grad, other, None, out, p, tf32, False)

    def _grad_graph(self, of: str, grad: Layout, other: Layout, out: Layout, p, t, acc):
        import cudnn

        g = cudnn.pygraph(
            io_data_type=t, intermediate_data_type=acc, compute_data_type=acc, handle=self.handle
        )
        dy = g.tensor(name="dy", dim=list(grad.shape), stride=list(grad.strides), data_type=t)
        o = g.tensor(name="o", dim=list(other.shape), stride=list(other.strides), data_type=t)
        conv = {"padding": list(p.padding), "stride": list(p.stride), "dilation": list(p.dilation)}
        if of == "input":
            r = g.conv_dgrad(loss=dy, filter=o, compute_data_type=acc, **conv)
        else:
            r = g.conv_wgrad(image=o, loss=dy, compute_data_type=acc, **conv)
        r.set_output(True).set_data_type(t)
        r.set_dim(list(out.shape)).set_stride(list(out.strides))
        g.validate()
        g.build_operation_graph()
        return g, [dy, o, r]
