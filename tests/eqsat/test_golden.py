"""Golden files: each graph under golden/ saturated and extracted, compared with its
.expected program. Set SATURN_UPDATE_GOLDEN=1 to rewrite the expectations (then read the
diff: a changed rule or cost shows up there)."""

from __future__ import annotations

import os

import pytest

from .golden_runner import GOLDEN, extracted

CASES = sorted(GOLDEN.glob("*.graph"))


def test_enough_cases_and_declines():
    declines = [c for c in CASES if c.stem.startswith("decline_")]
    assert len(CASES) >= 40
    assert len(declines) * 3 >= len(CASES), "at least a third of the cases show a rule declining"


@pytest.mark.parametrize("graph", CASES, ids=lambda p: p.stem)
def test_golden(graph):
    got = extracted(graph)
    expected = graph.with_suffix(".expected")
    if os.environ.get("SATURN_UPDATE_GOLDEN") == "1":
        expected.write_text(got)
    assert expected.exists(), f"no {expected.name}; run with SATURN_UPDATE_GOLDEN=1"
    assert got == expected.read_text()
