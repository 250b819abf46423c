"""The GPU runner's CUDA-graph replay (a mixin of ``GpuRunner``): capture of a whole call on
saturn's stream, the replayed call's one launch (``cuGraphLaunch`` through ctypes), inputs
staged where they arrive at new addresses, and the capture's checks.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from .eager_kernels import cuda_driver as _driver
from .profiling import recording

log = logging.getLogger("saturn")


class Replay:
    def replay_fast(self, args: list) -> list | None:
        """A replayed call's outputs when every input is the packed device tensor the graph
        was captured with: its dtype, shape and address (what ``Recipe._input`` and
        ``_replayed`` check, in one pass, and the launch through ctypes). None: the call
        goes the checked way, which raises on a wrong input or captures again."""
        if self._fast is None:
            return None
        with self.lock:
            want = self._fast  # read again under the lock: another thread may recapture
            if want is None or len(args) != len(want):
                return None
            # outputs of earlier calls still held move first (an input may be one)
            self._reclaim()
            dev = self.device
            for t, (ptr, dtype, shape, w) in zip(args, want, strict=True):
                if not (
                    isinstance(t, torch.Tensor)
                    and t.dtype is dtype
                    and t.shape == shape
                    and t.device == dev
                    and (
                        t.data_ptr() == ptr and t.is_contiguous()
                        if w is None
                        else t.data_ptr() - w.rel * t.element_size() == ptr and w.fits(t)
                    )
                ):
                    return None
            self.calls += 1
            err = self._launch_graph(_graph_launch(), self._exec_handle)
            if err != 0:
                self._check((err,), "cuGraphLaunch")
            self.replays += 1
            self.fast_replays += 1
            results = self._hand_out(self.captured_outs, self._captured_plan, args, args)
            self._check_indices()
            return results

    def _replayed(self, prepared: list[torch.Tensor], stats) -> tuple[list, dict | None]:
        """The replayed call's outputs (the captured ones) and None, or, where the call
        could not be captured, the outputs of a step-by-step run and its values."""
        drv = _driver()
        # size inputs (symbolic graphs) are fixed for this recipe: only tensors can move
        ptrs = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else None for t in prepared)
        if self.exec_ is not None and self.captured_ptrs != ptrs:
            moved = [
                i
                for i, (a, b) in enumerate(zip(self.captured_ptrs, ptrs, strict=True))
                if a != b and i not in self.staged
            ]
            if moved:
                for i in moved:  # an input the call writes is captured again where it lies
                    if i not in self.wrote:
                        self.staged[i] = torch.empty_like(prepared[i])
                self._release()  # capture again, reading the staged copies
        for i, buf in self.staged.items():
            buf.copy_(prepared[i])
        if self.exec_ is None:
            if not self._capture(prepared, stats):
                self.replay = False
                env = self._steps(prepared, stats)
                return [env[v] for v in self.r.program.outputs], env
            self.captured_ptrs = ptrs
            self._fast = self._fast_check(ptrs)
        (err,) = self._launch_graph(drv.cuGraphLaunch, self.exec_)
        if err != self._ok:
            self._check((err,), "cuGraphLaunch")
        self.replays += 1
        stats.launches += 1
        return self.captured_outs, None

    def _launch_graph(self, launch, graph):
        """``launch(graph, stream)``, inside one profiler range while a profiler records."""
        if not recording():
            return launch(graph, self.stream)
        with torch.profiler.record_function(
            f"saturn replay of {len(self.r.program.kernels)} kernels"
        ):
            return launch(graph, self.stream)

    def _fast_check(self, ptrs: tuple) -> list[tuple] | None:
        """(address, dtype, shape, window) of each input for ``replay_fast`` (the region an
        input is read through, ``InputSpec.window``): only where every input is a tensor
        read in place on the device (no size inputs, none staged, outputs handed out on
        the device, none a view of an input read through a window, whose view the hand-out
        would take from the caller's tensor instead of the region)."""
        if not self.r.io_on_device or self.staged or any(p is None for p in ptrs):
            return None
        if any(spec.dtype is None for spec in self.r.inputs):
            return None
        _, views = self._captured_plan
        if any(self.r.inputs[i].window is not None for i, *_ in views.values()):
            return None
        self._exec_handle = _handle_of(self.exec_)
        return [
            (p, spec.dtype, torch.Size(spec.shape), spec.window)
            for p, spec in zip(ptrs, self.r.inputs, strict=True)
        ]

    def _release(self) -> None:
        drv = _driver()
        if self.exec_ is not None:
            drv.cuGraphExecDestroy(self.exec_)
        self.exec_, self.captured_outs, self.captured_ptrs = None, [], ()
        self._captured_plan = None
        self._fast = None

    def _capture(self, prepared, stats) -> bool:
        """Capture one call's device work as a graph; False when it is not safe to replay."""
        drv = _driver()

        before = torch.saturn.memory_stats(self.device)
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check(drv.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            env = self._steps(prepared, stats)
        except Exception as e:
            # a step that waits for the device while capturing (a host function's fallback
            # reading a value back) invalidates the capture; the call runs step by step
            err, graph = drv.cuStreamEndCapture(self.stream)
            if graph is not None and err == self._ok:
                drv.cuGraphDestroy(graph)
            log.warning(
                "saturn: CUDA-graph replay off for this graph: a step failed captured: %s", e
            )
            return False
        err, graph = drv.cuStreamEndCapture(self.stream)
        self._check((err,), "cuStreamEndCapture")
        after = torch.saturn.memory_stats(self.device)
        allocated = (after["hits"] + after["misses"]) - (before["hits"] + before["misses"])
        if allocated:
            log.warning(
                "saturn: CUDA-graph replay off for this graph: %d allocation(s) during capture",
                allocated,
            )
            drv.cuGraphDestroy(graph)
            return False
        err, exec_ = drv.cuGraphInstantiate(graph, 0)
        self._check((err,), "cuGraphInstantiate")
        drv.cuGraphDestroy(graph)
        self.captures += 1
        self.exec_ = exec_
        self.captured_outs = [env[v] for v in self.r.program.outputs]
        self._captured_plan = self._out_plan(self.captured_outs, env)
        return True

    @staticmethod
    def _check(res, what: str) -> None:
        drv = _driver()
        err = res[0] if isinstance(res, tuple) else res
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"saturn: {what} failed: {err}")


@functools.cache
def _graph_launch():
    """libcuda's cuGraphLaunch through ctypes: a replayed call's one launch, at a fraction
    of the binding's per-call cost (measured on the H200: ~2.8 us through cuda-python)."""
    fn = ctypes.CDLL("libcuda.so.1").cuGraphLaunch
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def _handle_of(obj) -> int:
    """The raw handle a cuda-python driver object wraps."""
    from cuda.bindings.utils import get_cuda_native_handle

    return int(get_cuda_native_handle(obj))


class WordCheck:
    """The error word's copy in pinned host memory, made on the stream right after the
    last step that may set the word, and an event recorded after the copy (an external
    event node when captured, so every replay records it again; a plain record in a call
    run step by step). Waiting for that event
    waits for the steps up to there, not for the whole call."""

    def __init__(self, stream: int):
        drv = _driver()
        self.stream = stream
        err, self.host = drv.cuMemHostAlloc(4, drv.CU_MEMHOSTALLOC_PORTABLE)
        Replay._check((err,), "cuMemHostAlloc")
        self.value = (ctypes.c_int32 * 1).from_address(int(self.host))
        self.value[0] = 0
        flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        err, self.event = drv.cuEventCreate(flags)
        Replay._check((err,), "cuEventCreate")
        self.recorded = False

    def post(self, word: int) -> None:
        drv = _driver()
        Replay._check(
            drv.cuMemcpyDtoHAsync(int(self.host), word, 4, self.stream), "cuMemcpyDtoHAsync"
        )
        err, status = drv.cuStreamIsCapturing(self.stream)
        Replay._check((err,), "cuStreamIsCapturing")
        if status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            # a node of the graph, recorded again at every replay (the flag is refused
            # outside a capture: CUDA_ERROR_ILLEGAL_STATE)
            external = drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL
            done = drv.cuEventRecordWithFlags(self.event, self.stream, external)
        else:  # a call run step by step (the first, or one that cannot be captured)
            done = drv.cuEventRecord(self.event, self.stream)
        Replay._check(done, "cuEventRecord")
        self.recorded = True

    def wait(self) -> bool:
        """Whether the word was set in the call just launched (then read as clear again)."""
        if not self.recorded:  # no step reached it (a call that failed before)
            return False
        Replay._check(_driver().cuEventSynchronize(self.event), "cuEventSynchronize")
        if not self.value[0]:
            return False
        self.value[0] = 0
        return True

    def __del__(self) -> None:
        try:
            drv = _driver()
            drv.cuEventDestroy(self.event)
            drv.cuMemFreeHost(self.host)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass
