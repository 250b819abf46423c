"""torch.distributed on saturn tensors: a process-group backend named ``saturn``.

``torch.distributed.init_process_group("saturn")`` (or ``"cpu:gloo,saturn:saturn"``, or no
backend at all once saturn is imported) gives a group whose collectives take saturn
tensors. On ``saturn:0`` (host memory) they run through gloo over the tensors' own memory:
each tensor is handed to gloo as a CPU tensor aliasing it (``recipe.torch_view``), so
nothing is staged, except a strided tensor, which gloo cannot take: it is packed into a
buffer and, for the collectives that write it, copied back. CPU tensors go to gloo as
they are, so one group serves a model's CPU and saturn:0 state alike.

A collective on a saturn GPU tensor raises ``NotImplementedError`` naming the tensor's
device (the NCCL path is not built); nothing is copied to the host behind the user's back.

Every call completes before it returns (gloo is waited on: host memory has no stream to
order later work after it); the work object PyTorch expects is returned already done, with
the tensors as its future's value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

NAME = "saturn"


class _Host:
    """What gloo is handed for a list of tensors, and the copies back after it ran."""

    def __init__(self) -> None:
        self.back: list[tuple[torch.Tensor, torch.Tensor]] = []  # (packed buffer, alias)

    def one(self, t: torch.Tensor, written: bool) -> torch.Tensor:
        if t.device.type == "cpu":
            alias = t
        elif t.device.type == NAME and t.device.index == 0:
            from .recipe import torch_view  # the compiler's runtime: imported on first use

            alias = torch_view(t)
        else:
            raise NotImplementedError(
                f"torch.distributed on a tensor on {t.device}: saturn's process group runs "
                "collectives on saturn:0 and CPU tensors (through gloo); the NCCL path for "
                "saturn's GPUs is not built"
            )
        if alias.is_contiguous():
            return alias
        packed = alias.contiguous()  # gloo takes dense tensors only
        if written:
            self.back.append((packed, alias))
        return packed

    def many(self, ts: Sequence[torch.Tensor], written: bool) -> list[torch.Tensor]:
        return [self.one(t, written) for t in ts]

    def nested(self, tss: Sequence[Sequence[torch.Tensor]], written: bool) -> list:
        return [self.many(ts, written) for ts in tss]

    def finish(self, work) -> None:
        if work is not None:
            work.wait()
        for packed, alias in self.back:
            alias.copy_(packed)


def _done(result) -> dist.Work:
    # c10d's own completed work (imported here: a torch built without distributed has none)
    from torch._C._distributed_c10d import _create_work_from_future

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class SaturnProcessGroup(dist.ProcessGroup):
    """The ``saturn`` backend's group: collectives on saturn:0 and CPU tensors through an
    inner gloo group over the same store, ranks and size."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, name: str = "") -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._name = rank, size, name
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

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

    def _run(self, result, call: Callable[[_Host], object]) -> dist.Work:
        host = _Host()
        host.finish(call(host))
        return _done(result)

    # --- collectives (c10d's names; older and newer spellings of the same call) --------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        return self._run(tensors, lambda h: self._gloo.allreduce(h.many(tensors, True), opts))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self._run(
            tensors, lambda h: self._gloo.allreduce_coalesced(h.many(tensors, True), opts)
        )

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        return self._run(tensors, lambda h: self._gloo.broadcast(h.many(tensors, True), opts))

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._run(
            output_lists,
            lambda h: self._gloo.allgather(
                h.nested(output_lists, True), h.many(inputs, False), opts
            ),
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
            lambda h: self._gloo.reduce_scatter(
                h.many(outputs, True), h.nested(input_lists, False), opts
            ),
        )

    def reduce_scatter_single(self, output, input, opts=None):
        """``reduce_scatter_tensor``: rank r gets the reduction of every rank's r-th chunk."""
        return self.reduce_scatter([output], [list(input.chunk(self._size))], opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(o, i, opts)
        return _done(outputs)

    def barrier(self, opts=None):
        return self._run(None, lambda h: self._gloo.barrier(opts or dist.BarrierOptions()))

    def send(self, tensors, dst: int, tag: int = 0):
        return self._run(tensors, lambda h: self._gloo.send(h.many(tensors, False), dst, tag))

    def recv(self, tensors, src: int, tag: int = 0):
        return self._run(tensors, lambda h: self._gloo.recv(h.many(tensors, True), src, tag))


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


def register() -> None:
    """Register the backend for the saturn device (once; saturn's import does it)."""
    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=[NAME])
