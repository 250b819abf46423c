"""``bench/rule_effect.py``: a zoo model compiled with and without an extra rule file, on
saturn:0: the rule's matches and both programs' kernels are reported, both variants agree
with eager float32, and a rule file that matches nothing leaves the kernels as they were."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the zoo extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rule_effect", ROOT / "bench" / "rule_effect.py")
effect = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = effect
_spec.loader.exec_module(effect)


@pytest.mark.slow
def test_the_notebooks_rule_removes_the_rotary_tables_kernels(tmp_path):
    rule = ROOT / "notebooks" / "trig_below_view.egg"
    row = effect.run_one("Qwen2Model", [str(rule)], "saturn:0", "float32", "tiny", rounds=1)
    assert row["matches"] == {"cos-below-view": 1, "sin-below-view": 1}
    assert row["with_kernels"] == row["without_kernels"] - 2
    assert row["without_error"] < 1e-5 and row["with_error"] < 1e-5
    assert row["with_s"] > 0 and row["without_s"] > 0
    assert row["recompiles"] == 0  # both variants timed as compiled, neither traced again
    idle = tmp_path / "idle.egg"
    idle.write_text(
        '(ruleset idle)\n(rewrite (View (Erf x) s) (Erf (View x s)) :ruleset idle :name "erf")\n'
    )
    row = effect.run_one("Qwen2Model", [str(idle)], "saturn:0", "float32", "tiny", rounds=1)
    assert row["matches"] == {} and row["with_kernels"] == row["without_kernels"]
