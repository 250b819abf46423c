"""The index check's host copy and event (``runner_replay.WordCheck``) against a recording
stand-in for the CUDA driver, without a GPU: CUDA refuses an external event record outside
a stream capture (``CUDA_ERROR_ILLEGAL_STATE``, seen on the H100), so a call run step by
step records the event plainly, and only a captured call records it as a graph node."""

from __future__ import annotations

import ctypes
import enum
import types

import pytest

from saturn import runner_replay


class _Status(enum.IntEnum):
    CU_STREAM_CAPTURE_STATUS_NONE = 0
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1


class _Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_ILLEGAL_STATE = 401


def fake_driver(capturing: bool, calls: list):
    """What ``WordCheck`` calls, recorded; an external record outside a capture fails as
    CUDA fails it."""
    host = (ctypes.c_int32 * 1)()
    ok = _Result.CUDA_SUCCESS
    external = 1

    def record_with_flags(event, stream, flags):
        calls.append(("record external", flags))
        illegal = flags == external and not capturing
        return (_Result.CUDA_ERROR_ILLEGAL_STATE if illegal else ok,)

    return types.SimpleNamespace(
        CUresult=_Result,
        CUstreamCaptureStatus=_Status,
        CUevent_record_flags=types.SimpleNamespace(CU_EVENT_RECORD_EXTERNAL=external),
        CUevent_flags=types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2),
        CU_MEMHOSTALLOC_PORTABLE=1,
        cuMemHostAlloc=lambda n, flags: (ok, ctypes.addressof(host)),
        cuEventCreate=lambda flags: (ok, "event"),
        cuMemcpyDtoHAsync=lambda dst, src, n, stream: calls.append(("copy", src)) or (ok,),
        cuStreamIsCapturing=lambda stream: (
            ok,
            _Status.CU_STREAM_CAPTURE_STATUS_ACTIVE if capturing else _Status(0),
        ),
        cuEventRecordWithFlags=record_with_flags,
        cuEventRecord=lambda event, stream: calls.append(("record", None)) or (ok,),
        cuEventSynchronize=lambda event: calls.append(("wait", None)) or (ok,),
        cuEventDestroy=lambda event: (ok,),
        cuMemFreeHost=lambda p: (ok,),
        host=host,
    )


@pytest.mark.parametrize(("capturing", "record"), [(False, "record"), (True, "record external")])
def test_the_check_records_its_event_as_a_capture_allows(monkeypatch, capturing, record):
    calls: list = []
    drv = fake_driver(capturing, calls)
    monkeypatch.setattr(runner_replay, "_driver", lambda: drv)
    check = runner_replay.WordCheck(stream=7)
    assert not check.wait()  # nothing posted yet: no wait
    check.post(word=1234)
    assert [c[0] for c in calls] == ["copy", record]
    assert not check.wait()  # the word was clear
    drv.host[0] = 1  # the copy found an index out of range
    assert check.wait() and drv.host[0] == 0  # read as clear again
    assert [c[0] for c in calls][-2:] == ["wait", "wait"]


def test_an_external_record_outside_a_capture_is_what_fails(monkeypatch):
    """The stand-in fails the flag outside a capture as CUDA did, so the test above would
    catch the check asking for it there."""
    drv = fake_driver(False, [])
    monkeypatch.setattr(runner_replay, "_driver", lambda: drv)
    res = drv.cuEventRecordWithFlags("event", 7, drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL)
    with pytest.raises(RuntimeError, match=r"cuEventRecordWithFlags failed: .*401"):
        runner_replay.Replay._check(res, "cuEventRecordWithFlags")
