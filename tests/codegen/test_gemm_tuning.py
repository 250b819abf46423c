"""The table of timed cuBLASLt choices (codegen/gemm_tuning.py): a product's choice is
shared only by products cuBLASLt would see as the same (layouts, epilogue, alignments)."""

from __future__ import annotations

from saturn.codegen.gemm import Layout
from saturn.codegen.gemm_tuning import Tunings, alignment

A = Layout("f32", (64, 256), (256, 1))
B = Layout("f32", (256, 256), (1, 256))


def test_a_choice_is_reused_for_the_same_product_only():
    t = Tunings()
    key = t.key((0x1000, 0x2000, 0x3000), "lt", (A, B), "bias")
    assert t.get(key) is None and t.stats() == {"gemm_tunings": 0, "gemm_tunings_reused": 0}
    t.put(key, 3)
    assert t.get(t.key((0x9100, 0x4000, 0x5000), "lt", (A, B), "bias")) == 3  # moved
    # declines: another epilogue, other layouts, a less aligned operand (cuBLASLt's
    # candidates differ with each)
    assert t.get(t.key((0x1000, 0x2000, 0x3000), "lt", (A, B), "none")) is None
    assert t.get(t.key((0x1000, 0x2000, 0x3000), "lt", (B, A), "bias")) is None
    assert t.get(t.key((0x1010, 0x2000, 0x3000), "lt", (A, B), "bias")) is None
    assert t.stats() == {"gemm_tunings": 1, "gemm_tunings_reused": 1}
    t.clear()
    assert t.get(key) is None


def test_alignment_is_capped_at_cublaslts_largest():
    assert [alignment(p) for p in (0, 0x1000, 0x1010, 0x1002, 7)] == [256, 256, 16, 2, 1]
