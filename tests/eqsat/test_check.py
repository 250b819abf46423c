"""The rule checker (``python -m saturn.eqsat check``): planted unsound rules are found with
their name, file and line; saturn's own rules pass; rules it cannot evaluate are listed
with the reason."""

from __future__ import annotations

import pytest

from saturn.eqsat.check import check_files
from saturn.eqsat.driver import main
from saturn.eqsat.rules import RULES_DIR

PLANTED = """(ruleset mine)
;; x - x = 0: wrong for NaN and both infinities
(rule ((= e (Sub x x)) (= d (dtype x)) (float-dtype d))
      ((union e (Scalar 0.0 d))) :ruleset mine :name "sub-self")
;; x + 0.0 = x over floats: wrong for -0.0 (-0.0 + 0.0 = +0.0)
(rule ((= e (Add x (Scalar 0.0 d))) (= d (dtype x)) (float-dtype d))
      ((union e x)) :ruleset mine :name "add-zero-float")
;; sound: x * 1 = x
(rule ((= e (Mul x (Scalar 1.0 d))) (= d (dtype x)))
      ((union e x)) :ruleset mine :name "mul-one-again")
"""


def test_planted_unsound_rules_are_found_with_file_and_line(tmp_path, capsys):
    f = tmp_path / "planted.egg"
    f.write_text(PLANTED)
    report = check_files([f])
    assert sorted(report.checked) == ["add-zero-float", "mul-one-again", "sub-self"]
    found = "\n".join(report.counterexamples)
    assert f"sub-self ({f}:3) f32" in found and "nan" in found
    assert f"add-zero-float ({f}:6)" in found and "x=array(-0." in found
    assert "mul-one-again" not in found
    # the integer dtypes: the guard (float-dtype d) declines them, so none is reported
    assert not [c for c in report.counterexamples if " i32:" in c or " i64:" in c]
    assert main(["check", str(f)]) == 1
    assert "COUNTEREXAMPLE sub-self" in capsys.readouterr().out


@pytest.mark.slow
def test_saturns_rules_pass_and_the_unchecked_say_why(capsys):
    report = check_files([RULES_DIR])
    assert report.counterexamples == []
    assert {"mul-one-right", "add-negzero-float", "sub-zero", "neg-neg", "div-one"} <= set(
        report.checked
    )
    assert all("): " in s for s in report.skipped)  # each with its reason
    assert main(["check", str(RULES_DIR / "simplify.egg")]) == 0


def test_a_broken_rule_file_exits_2(tmp_path, capsys):
    f = tmp_path / "broken.egg"
    f.write_text("(rule ((= e (Mul x y))\n")
    assert main(["check", str(f)]) == 2
    assert str(f) in capsys.readouterr().err
