"""The table of timed cuBLASLt choices (codegen/gemm_tuning.py): a product's choice is
shared only by products cuBLASLt would see as the same (layouts, epilogue, alignments), and
kept on disk for the next process on the same GPU model and library version."""

from __future__ import annotations

import pytest

from saturn.codegen import gemm_tuning
from saturn.codegen.gemm import Layout
from saturn.codegen.gemm_tuning import Tunings, alignment

A = Layout("f32", (64, 256), (256, 1))
B = Layout("f32", (256, 256), (1, 256))


def test_a_choice_is_reused_for_the_same_product_only():
    t = Tunings()
    key = t.key((0x1000, 0x2000, 0x3000), "lt", (A, B), "bias")
    assert t.get(key) is None and t.stats()["gemm_tunings"] == t.stats()["gemm_tunings_reused"] == 0
    t.put(key, 3)
    assert t.get(t.key((0x9100, 0x4000, 0x5000), "lt", (A, B), "bias")) == 3  # moved
    # declines: another epilogue, other layouts, a less aligned operand (cuBLASLt's
    # candidates differ with each)
    assert t.get(t.key((0x1000, 0x2000, 0x3000), "lt", (A, B), "none")) is None
    assert t.get(t.key((0x1000, 0x2000, 0x3000), "lt", (B, A), "bias")) is None
    assert t.get(t.key((0x1010, 0x2000, 0x3000), "lt", (A, B), "bias")) is None
    assert t.stats() == {"gemm_tunings": 1, "gemm_tunings_reused": 1, "gemm_tunings_from_disk": 0}
    t.clear()
    assert t.get(key) is None


def test_alignment_is_capped_at_cublaslts_largest():
    assert [alignment(p) for p in (0, 0x1000, 0x1010, 0x1002, 7)] == [256, 256, 16, 2, 1]


@pytest.fixture
def on_disk(monkeypatch, tmp_path):
    """The disk store turned on in a folder of the test's own, on a GPU named by the test
    (ordinal 0; none other exists here)."""
    monkeypatch.setenv("SATURN_COMPILE_CACHE", "1")
    monkeypatch.setenv("SATURN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm_tuning, "gpu_name", lambda i: "Test GPU sm90" if i == 0 else "")
    return tmp_path


def _key(t: Tunings, epilogue: str = "bias") -> tuple:
    return (*t.key((0x1000, 0x2000, 0x3000), "lt", (A, B), epilogue)[:-1], 0)  # GPU 0


def test_a_choice_timed_in_one_process_is_taken_by_the_next_from_disk(on_disk):
    first = Tunings("gemm", lambda: "lib 1")
    first.put(_key(first), 3)
    first.put(_key(first, "none"), (0.25, 2, 4096))  # a convolution's form: ms, index, bytes
    later = Tunings("gemm", lambda: "lib 1")  # a new process: nothing in memory
    assert later.get(_key(later)) == 3 and later.get(_key(later, "none")) == (0.25, 2, 4096)
    assert later.stats() == {
        "gemm_tunings": 0,
        "gemm_tunings_reused": 2,
        "gemm_tunings_from_disk": 2,
    }


def test_a_stored_choice_declines_another_library_version_table_or_gpu(on_disk, monkeypatch):
    Tunings("gemm", lambda: "lib 1").put(_key(Tunings()), 3)
    assert Tunings("gemm", lambda: "lib 2").get(_key(Tunings())) is None
    assert Tunings("conv", lambda: "lib 1").get(_key(Tunings())) is None
    monkeypatch.setattr(gemm_tuning, "gpu_name", lambda i: "Other GPU sm80")
    assert Tunings("gemm", lambda: "lib 1").get(_key(Tunings())) is None


def test_nothing_is_stored_or_read_with_the_cache_off_or_an_unknown_gpu(on_disk, monkeypatch):
    monkeypatch.setenv("SATURN_COMPILE_CACHE", "0")
    Tunings("gemm", lambda: "lib 1").put(_key(Tunings()), 3)
    assert not list(on_disk.rglob("*.bin"))
    monkeypatch.setenv("SATURN_COMPILE_CACHE", "1")
    t = Tunings("gemm", lambda: "lib 1")
    t.put((*_key(t)[:-1], -1), 3)  # a pointer of no known GPU
    assert not list(on_disk.rglob("*.bin"))


def test_an_unreadable_stored_choice_is_timed_again(on_disk):
    t = Tunings("gemm", lambda: "lib 1")
    t.put(_key(t), 3)
    (stored,) = on_disk.rglob("*.bin")
    stored.write_bytes(b"algo:short")  # a truncated cuBLASLt struct
    assert Tunings("gemm", lambda: "lib 1").get(_key(t)) is None
    stored.write_bytes(b"garbage")
    assert Tunings("gemm", lambda: "lib 1").get(_key(t)) is None


def test_a_cublaslt_algorithm_is_stored_as_its_struct():
    """nvmath's Algorithm round-trips through the bytes a file holds (no GPU needed)."""
    from nvmath.bindings import cublasLt as lt  # noqa: N813
    from nvmath.linalg.advanced import Algorithm

    buf = lt.MatmulHeuristicResult(1)
    buf[0]._data["algo"]["data_"][0][:] = range(8)
    buf[0]._data["workspace_size"] = 4096
    back = gemm_tuning._decode(gemm_tuning._encode(Algorithm(buf[0])))
    assert isinstance(back, Algorithm)
    assert back.algorithm._data.tobytes() == buf[0]._data.tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("tune", ["back_to_back", "nvmath"])
def test_a_float32_plan_times_its_candidates_and_keeps_one(tune, monkeypatch):
    """Either way of timing cuBLASLt's candidates (``gemm.TUNE``) stores one choice, the plan
    then holds that one algorithm, and the product is eager's CPU result (float32, 1e-5)."""
    import torch

    from saturn.codegen import gemm

    monkeypatch.setattr(gemm, "TUNE", tune)
    fresh = Tunings("gemm")  # no library version: neither read from nor written to disk
    monkeypatch.setattr(gemm, "TUNINGS", fresh)
    timed, real = [], gemm.time_on_stream

    def counted(fn, stream, reps=5):
        timed.append(reps)
        return real(fn, stream, reps)

    monkeypatch.setattr(gemm, "time_on_stream", counted)
    torch.manual_seed(0)
    a, b = torch.randn(256, 192), torch.randn(192, 320) / 14
    da, db = a.to("saturn:1"), b.to("saturn:1")
    out = torch.empty(256, 320, device="saturn:1")
    ptrs = (da.data_ptr(), db.data_ptr(), out.data_ptr())

    def lay(t):
        return Layout("f32", tuple(t.shape), tuple(t.stride()))

    with torch.saturn.device(1):
        p = gemm.GemmPlan(lay(da), lay(db), lay(out), "none", None, ptrs,
                          torch.saturn.stream_handle(1))  # fmt: skip
        p.run(ptrs)
    torch.saturn.synchronize(1)
    assert fresh.timed == 1
    (key,) = fresh._choices
    chosen = fresh._choices[key].algorithm._data.tobytes()
    assert tune in key
    if tune == "back_to_back":  # several candidates timed, then planned with the fastest alone
        assert len(timed) >= 2, timed
        assert [x.algorithm._data.tobytes() for x in p.mm.algorithms] == [chosen]
    else:  # nvmath's autotune ordered the candidates, the fastest first; none timed queued
        assert timed == [] and len(p.mm.algorithms) >= 2
        assert p.mm.algorithms[0].algorithm._data.tobytes() == chosen
    torch.testing.assert_close(out.cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_an_unknown_way_of_timing_candidates_is_refused_at_import():
    """``SATURN_GEMM_TUNE`` names one of two ways; anything else stops the import with a
    message naming both, rather than timing some third way silently."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SATURN_GEMM_TUNE": "fastest"}
    done = subprocess.run(
        [sys.executable, "-c", "import saturn.codegen.gemm"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "SATURN_GEMM_TUNE='fastest'" in done.stderr, done.stderr[-2000:]
    assert "'nvmath', 'back_to_back'" in done.stderr


def test_back_to_back_keeps_the_candidate_fastest_when_queued(monkeypatch):
    """``gemm.fastest`` with ``TUNE="back_to_back"`` times every candidate on the stream as
    a replay runs it (``time_on_stream``) and keeps the fastest, whatever the heuristic's
    order; a single candidate is kept untimed. A fake plan stands in for nvmath's."""
    from saturn.codegen import gemm

    times = {"first": 3.0, "second": 1.0, "third": 2.0}

    class FakeMatmul:
        def __init__(self, names):
            self.algorithms, self.ran = list(names), []

        def execute(self, algorithm=None, stream=None):
            self.ran.append(algorithm)

    def time_on_stream(fn, stream, reps=5):
        fn()
        return times[mm.ran[-1]]

    monkeypatch.setattr(gemm, "TUNE", "back_to_back")
    monkeypatch.setattr(gemm, "time_on_stream", time_on_stream)
    monkeypatch.setattr(gemm, "_kept", lambda a: f"kept {a}")
    mm = FakeMatmul(["first", "second", "third"])
    assert gemm.fastest(mm, 0) == "kept second"
    assert mm.ran == ["first", "second", "third"]
    mm = FakeMatmul(["only"])
    assert gemm.fastest(mm, 0) == "kept only" and mm.ran == []
