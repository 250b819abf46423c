"""Streams, events and device properties of saturn devices, as ``torch.cuda``'s: event
timing on saturn:0 (host clock readings, its work runs as issued) and (gpu) on a GPU (CUDA
events on saturn's stream)."""

from __future__ import annotations

import time

import pytest
import torch

import saturn  # noqa: F401


def test_event_timing_on_saturn0():
    a = torch.saturn.Event(enable_timing=True, device=0)
    b = torch.Event(device="saturn:0", enable_timing=True)
    a.record()
    time.sleep(0.05)
    b.record()
    b.synchronize()
    assert a.query() and b.query()
    assert 45 <= a.elapsed_time(b) < 5000
    a.wait()  # ordering on the one stream: nothing to wait for, and no error


def test_events_without_timing_or_record_raise_clearly():
    a = torch.Event(device="saturn:0")
    b = torch.Event(device="saturn:0", enable_timing=True)
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)
    c = torch.Event(device="saturn:0", enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        b.elapsed_time(c)


def test_streams_and_device_properties_of_saturn0():
    s = torch.saturn.current_stream(0)
    assert isinstance(s, torch.saturn.Stream) and s.device == torch.device("saturn:0")
    assert s.query() and torch.saturn.default_stream(0) == s
    s.synchronize()
    p = torch.saturn.get_device_properties(0)
    assert not p.is_gpu and p.total_memory > 2**20 and p.name == torch.saturn.get_device_name(0)
    x = torch.ones(1000, device="saturn:0")
    summary = torch.saturn.memory_summary(0)
    assert summary.startswith("saturn:0") and "allocated" in summary and "MiB" in summary
    del x


@pytest.mark.gpu
def test_event_timing_on_a_gpu():
    gpu = torch.device("saturn:1")
    x = torch.randn(2048, 2048, device=gpu)
    with pytest.raises(ValueError, match="current device"):  # saturn:0 is current
        torch.saturn.Event(True, device=gpu)
    with torch.saturn.device(gpu):
        a, b = torch.saturn.Event(True, device=gpu), torch.saturn.Event(True)
        a.record()
        for _ in range(10):
            x = x @ x / 2048
        b.record()
    b.synchronize()
    assert b.query() and torch.saturn.current_stream(gpu).query()
    ms = a.elapsed_time(b)
    assert 0 < ms < 10_000
    # Recorded on a named stream, the event is that stream's device's, whichever is current.
    c, d = (torch.Event("saturn", enable_timing=True) for _ in range(2))
    c.record(torch.saturn.current_stream(gpu))
    x = x @ x / 2048
    d.record(torch.saturn.current_stream(gpu))
    d.synchronize()
    assert c.device == gpu and torch.saturn.current_stream(gpu).query()
    assert 0 < c.elapsed_time(d) < 10_000
    p = torch.saturn.get_device_properties(gpu)
    assert p.is_gpu and p.major >= 7 and p.total_memory > 2**30
