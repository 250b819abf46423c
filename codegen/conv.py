"""2-D convolutions through cuDNN's graph API (the vendor's Python frontend), planned once.

A plan is built at compile time for one set of layouts: cross-correlation (as PyTorch), with
stride, padding, dilation and groups (cuDNN reads the group count from the weight's channel
extent), the bias added in the same graph. cuDNN infers the output extents; the plan is
refused when they differ from PyTorch's. float32 engines that use tensor cores (TF32) are
deselected unless TF32 is allowed, so float32 convolutions compute in float32. ``run`` takes
the pointers of each call and runs on saturn's stream through the plan's cuDNN handle.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gemm import Layout


class ConvError(RuntimeError):
    """A convolution the cuDNN plan cannot take (the graph then runs uncompiled)."""


_HANDLES: dict[int, object] = {}


def _handle(stream: int):
    import cudnn

    h = _HANDLES.get(stream)
    if h is None:
        h = _HANDLES[stream] = cudnn.create_handle()
        cudnn.set_stream(handle=h, stream=stream)
    return h


def torch_output_extent(n: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (n + 2 * pad - dil * (k - 1) - 1) // stride + 1


@dataclass
class ConvParams:
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


class ConvPlan:
    """``out = conv2d(x, w) [+ bias]`` for fixed layouts; ``run`` takes pointers."""

    def __init__(
        self,
        x: Layout,
        w: Layout,
        bias: Layout | None,
        out: Layout,
        p: ConvParams,
        stream: int,
        tf32: bool = False,
    ):
        import cudnn

        types = {"f32": cudnn.data_type.FLOAT, "f64": cudnn.data_type.DOUBLE}
        if x.dtype not in types:
            raise ConvError(f"no cuDNN convolution plan for dtype {x.dtype}")
        if len(x.shape) != 4 or len(w.shape) != 4:
            raise ConvError("cuDNN plans here are 2-D convolutions (rank-4 operands)")
        if x.shape[1] != w.shape[1] * p.groups:
            raise ConvError(
                f"{x.shape[1]} input channels do not match weight {list(w.shape)} "
                f"with {p.groups} groups"
            )
        want = (
            x.shape[0],
            w.shape[0],
            *(
                torch_output_extent(
                    x.shape[2 + i], w.shape[2 + i], p.stride[i], p.padding[i], p.dilation[i]
                )
                for i in range(2)
            ),
        )
        if tuple(out.shape) != want:
            raise ConvError(f"output {list(out.shape)} is not PyTorch's {list(want)}")
        t = types[x.dtype]
        self.stream = stream
        self.handle = _handle(stream)
        try:
            g = cudnn.pygraph(
                io_data_type=t, intermediate_data_type=t, compute_data_type=t, handle=self.handle
            )
            gx = g.tensor(name="x", dim=list(x.shape), stride=list(x.strides), data_type=t)
            gw = g.tensor(name="w", dim=list(w.shape), stride=list(w.strides), data_type=t)
            gy = g.conv_fprop(
                image=gx,
                weight=gw,
                padding=list(p.padding),
                stride=list(p.stride),
                dilation=list(p.dilation),
                compute_data_type=t,
            )
            tensors = [gx, gw]
            if bias is not None:
                gb = g.tensor(
                    name="b", dim=[1, w.shape[0], 1, 1], stride=[w.shape[0], 1, 1, 1], data_type=t
                )
                gy = g.add(a=gy, b=gb, compute_data_type=t)
                tensors.append(gb)
            gy.set_output(True).set_data_type(t)
            inferred = tuple(gy.get_dim()) if gy.get_dim() else want
            if inferred != want:
                raise ConvError(f"cuDNN's output {list(inferred)} is not PyTorch's {list(want)}")
            gy.set_dim(list(out.shape)).set_stride(list(out.strides))
            tensors.append(gy)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            if x.dtype == "f32" and not tf32:
                g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
            g.check_support()
            g.build_plans()
        except ConvError:
            raise
        except Exception as e:
            raise ConvError(f"cuDNN could not plan this convolution: {e}") from e
        self.graph = g
        self.uids = tuple(tt.get_uid() for tt in tensors)
        self.workspace_size = int(g.get_workspace_size())
        self.tuned: tuple[float, int, int] | None = None  # (ms for 3 runs, plan index, workspace)

    def autotune(self, ptrs: tuple[int, ...], workspace_for, candidates: int = 8) -> None:
        """Time the first ``candidates`` ranked plans on this call's own buffers (the output
        is overwritten by the real run that follows) and keep the fastest.
        ``workspace_for(nbytes)`` returns a device address with that many bytes."""
        from cuda.bindings import driver as drv

        g = self.graph
        start, stop = drv.cuEventCreate(0)[1], drv.cuEventCreate(0)[1]
        best: tuple[float, int, int] | None = None
        try:
            for i in range(min(candidates, g.get_execution_plan_count())):
                try:
                    g.build_plan_at_index(i)
                    need = int(g.get_workspace_size_plan_at_index(i))
                    pack = tuple(_Ptr(p) for p in ptrs)
                    ws = _Ptr(workspace_for(need))

                    def once(i=i, pack=pack, ws=ws):
                        g.execute_plan_at_index(
                            pack, ws, index=i, handle=self.handle, tensor_uids=self.uids
                        )

                    once()  # warm
                except Exception:  # a plan that declines these operands is not a candidate
                    continue
                drv.cuEventRecord(start, self.stream)
                for _ in range(3):
                    once()
                drv.cuEventRecord(stop, self.stream)
                drv.cuEventSynchronize(stop)
                ms = drv.cuEventElapsedTime(start, stop)[1]
                if best is None or ms < best[0]:
                    best = (ms, i, need)
        finally:
            drv.cuEventDestroy(start)
            drv.cuEventDestroy(stop)
        if best is not None:
            g.select_plan(best[1])
            g.build_plans()
            self.workspace_size = best[2]
            self.tuned = best

    def run(self, ptrs: tuple[int, ...], workspace: int) -> None:
        """``ptrs``: x, w, [bias,] out, in the plan's order."""
        self.graph.execute(
            tuple(_Ptr(p) for p in ptrs), _Ptr(workspace), handle=self.handle, tensor_uids=self.uids
        )


class _Ptr:
    """A device address for the frontend, which asks buffers for ``data_ptr()``."""

    __slots__ = ("p",)

    def __init__(self, p: int):
        self.p = p

    def data_ptr(self) -> int:
        return self.p
