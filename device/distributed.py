"""torch.distributed on saturn tensors: a process-group backend named ``saturn``.

``torch.distributed.init_process_group("saturn")`` (or ``"cpu:gloo,saturn:saturn"``, or no
backend at all once saturn is imported) gives a group whose collectives take saturn
tensors. On ``saturn:0`` (host memory) they run through gloo over the tensors' own memory:
each tensor is handed to gloo as a CPU tensor aliasing it (``recipe.torch_view``), so
nothing is staged, except a strided tensor, which gloo cannot take: it is packed into a
buffer and, for the collectives that write it, copied back. CPU tensors go to gloo as
they are, so one group serves a model's CPU and saturn:0 state alike.

On a saturn GPU (``saturn:N`` is CUDA device N-1, in the same primary context) they run
through PyTorch's own NCCL group, made on first use over the same store: each tensor is
handed to NCCL as a CUDA tensor aliasing its device memory (through the CUDA array
interface; nothing goes through the host), with saturn's stream made the current CUDA
stream for the call, so that NCCL starts after the saturn work that wrote its inputs, and
saturn's stream waits for NCCL before anything later reads its outputs. Strided tensors
are packed on the device and copied back, as for gloo. One collective takes tensors of one
device: a mix raises, naming the devices.

Every call is ordered before it returns: gloo is waited on (host memory has no stream to
order later work after it), NCCL's completion is waited for on saturn's stream (the one
stream every later saturn operation runs on). The work object PyTorch expects is returned
already done, with the tensors as its future's value.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

NAME = "saturn"


class _Mover:
    """What an inner group is handed for a collective's tensors (``one``, per tensor), and
    the packed buffers copied back into the tensors the collective writes after it ran."""

    def __init__(self) -> None:
        self.back: list[tuple[torch.Tensor, torch.Tensor]] = []  # (packed buffer, tensor)

    def one(self, t: torch.Tensor, written: bool) -> torch.Tensor:
        raise NotImplementedError

    def many(self, ts: Sequence[torch.Tensor], written: bool) -> list[torch.Tensor]:
        return [self.one(t, written) for t in ts]

    def nested(self, tss: Sequence[Sequence[torch.Tensor]], written: bool) -> list:
        return [self.many(ts, written) for ts in tss]

    def finish(self, work) -> None:
        """Wait for the collective (gloo: the host; NCCL: the current stream, saturn's),
        then copy the packed results back."""
        if work is not None:
            work.wait()
        for packed, t in self.back:
            t.copy_(packed)


class _Host(_Mover):
    """gloo's side: CPU tensors, and saturn:0 tensors as CPU tensors aliasing them."""

    def one(self, t: torch.Tensor, written: bool) -> torch.Tensor:
        if t.device.type == "cpu":
            alias = t
        elif t.device.type == NAME and t.device.index == 0:
            from .recipe import torch_view  # the compiler's runtime: imported on first use

            alias = torch_view(t)
        else:
            raise ValueError(f"gloo's side of saturn's group was handed a tensor on {t.device}")
        if alias.is_contiguous():
            return alias
        packed = alias.contiguous()  # gloo takes dense tensors only
        if written:
            self.back.append((packed, alias))
        return packed


class _Interface:
    """An object exposing a CUDA array interface dict, for ``torch.as_tensor``."""

    def __init__(self, interface: dict) -> None:
        self.__cuda_array_interface__ = interface


def cuda_alias(t: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over the device memory of the dense saturn GPU tensor ``t`` (no copy):
    its bytes, viewed as ``t``'s dtype and shape, so that every dtype (bfloat16 included,
    which the array interface has no type string for) passes through."""
    from .gpu_runner import take_back_lent  # the compiler's runtime: imported on first use

    assert t.is_contiguous()
    take_back_lent(t)  # a compiled call's output must not keep pointing into its arena
    nbytes = t.numel() * t.element_size()
    interface = {
        "shape": (nbytes,),
        "typestr": "|u1",
        "data": (t.data_ptr() if nbytes else 0, False),
        "version": 3,
        "strides": None,
        "stream": None,  # the caller orders the work: saturn's stream is the current one
    }
    cuda = torch.device("cuda", t.device.index - 1)
    alias = torch.as_tensor(_Interface(interface), device=cuda)
    if nbytes and alias.data_ptr() != t.data_ptr():
        raise RuntimeError(f"the CUDA view of a tensor on {t.device} is a copy, not an alias")
    return alias.view(t.dtype).view(t.shape)


class _Gpu(_Mover):
    """NCCL's side: tensors on one saturn GPU, as CUDA tensors aliasing them. Every saturn
    operation here (packing, copying back) runs on saturn's stream, in order with the
    collective."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.keep: list[torch.Tensor] = []  # saturn tensors the aliases read, kept alive

    def one(self, t: torch.Tensor, written: bool) -> torch.Tensor:
        if t.device != torch.device(NAME, self.index):
            raise ValueError(f"a GPU collective on saturn:{self.index} was handed {t.device}")
        dense = t if t.is_contiguous() else t.contiguous()  # NCCL takes dense tensors only
        if dense is not t and written:
            self.back.append((dense, t))
        self.keep.append(dense)
        return cuda_alias(dense)


def _tensors(value) -> list[torch.Tensor]:
    """Every tensor in a collective's (nested) tensor arguments, in order."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
    return out


def _gpu_of(tensors: Sequence[torch.Tensor]) -> int | None:
    """The saturn GPU a collective's tensors are on, None for host tensors (CPU and
    saturn:0); raises for a mix."""
    devices = {t.device for t in tensors}
    gpus = {d for d in devices if d.type == NAME and (d.index or 0) >= 1}
    if not gpus:
        return None
    if len(devices) > 1:
        raise ValueError(
            "one collective takes tensors of one device: got "
            + ", ".join(sorted(str(d) for d in devices))
        )
    return gpus.pop().index


def _done(result) -> dist.Work:
    # c10d's own completed work (imported here: a torch built without distributed has none)
    from torch._C._distributed_c10d import _create_work_from_future

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


# Groups not yet destroyed: released before the interpreter's teardown (``_release_live``).
_LIVE: weakref.WeakSet = weakref.WeakSet()


class SaturnProcessGroup(dist.ProcessGroup):
    """The ``saturn`` backend's group: collectives on saturn:0 and CPU tensors through an
    inner gloo group over the same store, ranks and size."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, name: str = "") -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._name = rank, size, name
        self._store, self._timeout = store, timeout
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._nccl_group = None  # made at the first collective on a saturn GPU
        self._streams: dict[int, torch.cuda.ExternalStream] = {}  # saturn's, per GPU
        _LIVE.add(self)

    def _nccl(self):
        """PyTorch's NCCL group over the same store (its own key prefix), ranks and size."""
        if self._nccl_group is None:
            if not dist.is_nccl_available():
                raise RuntimeError(
                    "a collective on saturn GPU tensors runs through NCCL, which this build "
                    "of torch lacks"
                )
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self._timeout
            store = dist.PrefixStore("saturn/nccl/", self._store)
            self._nccl_group = dist.ProcessGroupNCCL(store, self._rank, self._size, opts)
        return self._nccl_group

    def shutdown(self) -> None:
        """``destroy_process_group``'s call: the inner groups are released now, so their
        destructors join gloo's worker threads while the interpreter runs. gloo's own
        ``shutdown`` leaves the threads running (torch 2.11-2.14); one that drops a tensor
        during the interpreter's teardown takes the GIL there and aborts the process
        ("terminate called without an active exception")."""
        gloo, nccl = self._gloo, self._nccl_group
        self._gloo = self._nccl_group = None
        self._streams.clear()
        if gloo is not None:
            gloo.shutdown()
        if nccl is not None:
            nccl.shutdown()
        _LIVE.discard(self)

    def getBackendName(self) -> str:  # noqa: N802 (c10d's names, here and below)
        return NAME

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    @property
    def group_name(self) -> str:
        """The name c10d registered the group under (DeviceMesh looks groups up by it)."""
        return self._name

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def _run(self, result, call: Callable, tensors=()) -> dist.Work:
        """Run ``call(mover, inner group)`` on gloo for host tensors, on NCCL on saturn's
        stream for saturn GPU tensors; ``tensors``: every tensor the collective takes."""
        if self._gloo is None:
            raise RuntimeError(f"saturn's process group {self._name!r} was destroyed")
        index = _gpu_of(_tensors(tensors))
        if index is None:
            host = _Host()
            host.finish(call(host, self._gloo))
            return _done(result)
        cuda = torch.device("cuda", index - 1)
        stream = self._streams.get(index)
        if stream is None:  # saturn's stream of the device, as torch.cuda names streams
            handle = torch.saturn.stream_handle(index)
            stream = self._streams[index] = torch.cuda.ExternalStream(handle, device=cuda)
        gpu = _Gpu(index)
        with torch.cuda.device(cuda), torch.cuda.stream(stream):
            gpu.finish(call(gpu, self._nccl()))
        return _done(result)

    # --- collectives (c10d's names; older and newer spellings of the same call) --------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        return self._run(tensors, lambda m, g: g.allreduce(m.many(tensors, True), opts), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self._run(
            tensors, lambda m, g: g.allreduce_coalesced(m.many(tensors, True), opts), tensors
        )

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        return self._run(tensors, lambda m, g: g.broadcast(m.many(tensors, True), opts), tensors)

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._run(
            output_lists,
            lambda m, g: g.allgather(m.nested(output_lists, True), m.many(inputs, False), opts),
            (output_lists, inputs),
        )

    def all_gather_single(self, output, input, opts=None):
        """``all_gather_into_tensor``: the ranks' inputs, in rank order, along dim 0."""
        return self.allgather([list(output.chunk(self._size))], [input], opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            self.all_gather_single(o, i, opts)
        return _done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._run(
            outputs,
            lambda m, g: g.reduce_scatter(
                m.many(outputs, True), m.nested(input_lists, False), opts
            ),
            (outputs, input_lists),
        )

    def reduce_scatter_single(self, output, input, opts=None):
        """``reduce_scatter_tensor``: rank r gets the reduction of every rank's r-th chunk."""
        return self.reduce_scatter([output], [list(input.chunk(self._size))], opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(o, i, opts)
        return _done(outputs)

    def barrier(self, opts=None):
        return self._run(None, lambda m, g: g.barrier(opts or dist.BarrierOptions()))

    def send(self, tensors, dst: int, tag: int = 0):
        return self._run(tensors, lambda m, g: g.send(m.many(tensors, False), dst, tag), tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._run(tensors, lambda m, g: g.recv(m.many(tensors, True), src, tag), tensors)


# A collective is opaque to tracing: Dynamo, compiling a DDP model's forward, would otherwise
# trace into these methods (a buffer broadcast) and fail on the inner gloo group.
for _name in (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "allgather",
    "all_gather_single",
    "all_gather_single_coalesced",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "barrier",
    "send",
    "recv",
):
    setattr(SaturnProcessGroup, _name, torch._dynamo.disable(getattr(SaturnProcessGroup, _name)))
for _old, _new in (
    ("_allgather_base", "all_gather_single"),
    ("allgather_into_tensor_coalesced", "all_gather_single_coalesced"),
    ("_reduce_scatter_base", "reduce_scatter_single"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"),
):
    setattr(SaturnProcessGroup, _old, getattr(SaturnProcessGroup, _new))


def _create(opts, _backend_options) -> SaturnProcessGroup:
    return SaturnProcessGroup(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, opts.group_id
    )


@atexit.register
def _release_live() -> None:
    """A program that never calls ``destroy_process_group`` still has its inner groups'
    threads joined before the teardown, where they could abort the process on exit."""
    for group in list(_LIVE):
        group.shutdown()


def register() -> None:
    """Register the backend for the saturn device (once; saturn's import does it)."""
    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=[NAME])
