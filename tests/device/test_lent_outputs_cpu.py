"""The GPU runner's output lending on host memory (no GPU): a runner whose arena is a
saturn:0 tensor and whose device copy is a host memcpy hands out, takes back and copies
outputs exactly as on a GPU (tests/device/test_lent_outputs.py runs the real thing)."""

from __future__ import annotations

import ctypes
import gc
import threading
from types import SimpleNamespace

import pytest
import torch

import saturn  # noqa: F401 - registers the device
from saturn import gpu_runner as gr
from saturn import runner_lending

DEV = torch.device("saturn:0")


class HostDriver:
    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self):
        self.copies = 0

    def cuMemcpyDtoDAsync(self, dst: int, src: int, nbytes: int, stream: int):  # noqa: N802
        self.copies += 1
        ctypes.memmove(dst, src, nbytes)
        return (0,)


@pytest.fixture
def driver(monkeypatch):
    d = HostDriver()
    for module in (gr, runner_lending):  # where the runner and its lending read the driver
        monkeypatch.setattr(module, "_driver", lambda: d)
    return d


def host_runner(nbytes: int = 4096, out_inputs=None, positions=None) -> gr.GpuRunner:
    """A runner with only what handing out outputs needs: an arena on saturn:0."""
    r = gr.GpuRunner.__new__(gr.GpuRunner)
    r.device, r.stream, r._ok = DEV, 0, 0
    r.arena = torch.zeros(nbytes, dtype=torch.uint8, device=DEV)
    r._owned, r.lent, r.copied_out = {}, [], 0
    r.out_inputs = out_inputs or {}
    r.buffers = {}
    r.r = SimpleNamespace(_position=positions or {}, program=SimpleNamespace(steps=[], outputs=[]))
    r.lock = threading.RLock()
    r._own(r.arena)
    gr._RUNNERS.add(r)
    return r


def slot(r: gr.GpuRunner, offset: int, shape, dtype=torch.float32) -> torch.Tensor:
    n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return r.arena[offset : offset + n].view(dtype).view(shape)


def in_arena(r: gr.GpuRunner, t: torch.Tensor) -> bool:
    base = r.arena.data_ptr()
    return base <= t.data_ptr() < base + r.arena.numel()


def hand_out(r: gr.GpuRunner, outs: list, env=None, prepared=None, given=None) -> list:
    if len(r.r.program.outputs) != len(outs):
        r.r.program.outputs = [f"out{i}" for i in range(len(outs))]
    return r._hand_out(outs, r._out_plan(outs, env or {}), prepared or [], given)


def test_outputs_are_lent_without_a_copy(driver):
    r = host_runner()
    a, b = slot(r, 0, (4, 8)), slot(r, 512, (16,), torch.int64)
    a.copy_(torch.arange(32.0).view(4, 8))
    b.copy_(torch.arange(16))
    x, y = hand_out(r, [a, b])
    assert in_arena(r, x) and in_arena(r, y) and driver.copies == 0
    storage = x.untyped_storage()  # a storage of its own over the output's bytes
    assert storage._cdata != r.arena.untyped_storage()._cdata and storage.nbytes() == 128
    assert torch.equal(x.cpu(), torch.arange(32.0).view(4, 8))
    assert torch.equal(y.cpu(), torch.arange(16))
    assert len(r.lent) == 2


def test_overlapping_outputs_share_one_storage(driver):
    r = host_runner()
    a = slot(r, 64, (4, 8))
    a.copy_(torch.randn(4, 8))
    x, xt = hand_out(r, [a, a.t()])  # a value and its transpose: views of each other
    assert x.untyped_storage()._cdata == xt.untyped_storage()._cdata
    x.mul_(2)
    assert torch.equal(xt.cpu(), x.cpu().t())
    assert len(r.lent) == 1


def test_held_outputs_are_copied_out_before_the_arena_is_rewritten(driver):
    r = host_runner()
    a = slot(r, 0, (8,))
    a.copy_(torch.arange(8.0))
    held, view = hand_out(r, [a])[0], None
    view = held[2:5]
    dropped = hand_out(r, [slot(r, 256, (4,))])[0]
    del dropped
    r._reclaim()
    assert driver.copies == 1 and r.copied_out == 1, "only the held storage was copied"
    assert not in_arena(r, held) and view.data_ptr() == held.data_ptr() + 2 * 4
    r.arena.fill_(0)  # the next call writes the arena
    assert torch.equal(held.cpu(), torch.arange(8.0))
    assert torch.equal(view.cpu(), torch.arange(2.0, 5.0))
    assert r.lent == []


def test_a_view_alone_keeps_the_storage_alive(driver):
    r = host_runner()
    a = slot(r, 128, (3, 4))
    a.copy_(torch.arange(12.0).view(3, 4))
    view = hand_out(r, [a])[0][1].t()  # the output itself is dropped at once
    r._reclaim()
    r.arena.fill_(0)
    assert driver.copies == 1 and torch.equal(view.cpu(), torch.arange(4.0, 8.0))


def test_taking_back_on_export_leaves_a_later_reclaim_nothing_to_do(driver):
    r = host_runner()
    a = slot(r, 0, (5,))
    a.copy_(torch.arange(5.0))
    y = hand_out(r, [a])[0]
    gr.take_back_lent(y)  # what the CUDA array interface does before exporting
    ptr = y.data_ptr()
    assert not in_arena(r, y) and driver.copies == 1
    r._reclaim()
    assert driver.copies == 1 and y.data_ptr() == ptr
    gr.take_back_lent(torch.zeros(3, device=DEV))  # not lent by anyone: untouched
    assert driver.copies == 1


def test_outputs_viewing_inputs_are_views_of_the_callers_tensors(driver):
    r = host_runner(out_inputs={0: "x"}, positions={"x": 0})
    x = torch.randn(6, 4, device=DEV)
    got = hand_out(r, [x.t()], env={"x": x}, prepared=[x], given=[x])[0]
    assert got.data_ptr() == x.data_ptr() and got.stride() == (1, 4) and driver.copies == 0
    packed = x.t().contiguous()  # an input the recipe had to pack: memory it reuses
    got = hand_out(r, [packed], env={"x": packed}, prepared=[packed], given=[x.t()])[0]
    assert got.data_ptr() != packed.data_ptr() and driver.copies == 1
    assert torch.equal(got.cpu(), x.t().cpu())


def test_a_freed_runner_takes_back_what_it_lent(driver):
    gc.collect()  # runners other tests left for the collector
    driver.copies = 0
    r = host_runner()
    a = slot(r, 0, (6,))
    a.copy_(torch.arange(6.0))
    y = hand_out(r, [a])[0]
    del r, a
    gc.collect()
    assert driver.copies == 1
    torch.zeros(4096, dtype=torch.uint8, device=DEV).fill_(7)  # memory reused
    assert torch.equal(y.cpu(), torch.arange(6.0))


def test_a_view_not_packed_is_lent_with_its_buffer_as_its_storage(driver):
    """A slice of a buffer (attention's k out of a fused projection) is lent over the
    whole buffer it views, found through the program's view steps, as eager's view keeps
    its base's storage: the window a later graph reads it through (decision 0130) then
    fits in place. A packed output keeps a storage of its own bytes."""
    from saturn.eqsat.program import StepKind
    from saturn.input_windows import window_of

    r = host_runner()
    qkv = slot(r, 256, (2, 5, 3, 4))  # [B, S, 3, D] at an offset that is no multiple of 3*D
    qkv.copy_(torch.randn(2, 5, 3, 4))
    r.buffers = {"qkv": qkv}
    view = SimpleNamespace(kind=StepKind.VIEW, output="k", args=["qkv"])
    r.r.program = SimpleNamespace(steps=[view], outputs=["k", "own"])
    k = qkv[:, :, 1]
    own = slot(r, 2048, (4,))
    lent_k, lent_own = hand_out(r, [k, own])
    assert lent_k.untyped_storage().nbytes() == qkv.numel() * 4
    assert lent_k.storage_offset() == 4 and torch.equal(lent_k.cpu(), k.cpu())
    assert lent_own.untyped_storage().nbytes() == 16
    window = window_of(torch.randn(2, 5, 3, 4)[:, :, 1])  # as eager's trace saw k
    assert window.fits(lent_k)
    region = window.read(lent_k)
    assert torch.equal(region.cpu(), qkv.cpu())
