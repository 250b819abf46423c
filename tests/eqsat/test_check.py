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
    # the command line on one of them (a small file: the check above covered simplify.egg's
    # 43 rules, 13 s of CPU, that a second pass would only repeat)
    assert main(["check", str(RULES_DIR / "gemm.egg")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("checked ") and "gemm.egg" in out, out


def test_a_broken_rule_file_exits_2(tmp_path, capsys):
    f = tmp_path / "broken.egg"
    f.write_text("(rule ((= e (Mul x y))\n")
    assert main(["check", str(f)]) == 2
    assert str(f) in capsys.readouterr().err


ATTRIBUTES = """(ruleset mine)
;; unsound: a flat view of a transposed matrix reads its elements in another order
(rewrite (View (Permute x p) s) (View x s) :ruleset mine :name "view-forgets-permute")
;; sound: negation is elementwise, a slice only picks elements
(rewrite (Slice (Neg x) d a b k) (Neg (Slice x d a b k)) :ruleset mine :name "neg-slice-again")
"""


def test_rules_with_attribute_variables_are_checked_on_shaped_inputs(tmp_path):
    """Variables where the op table puts attributes (a shape, a permutation, slice bounds)
    are bound to values that fit inputs of shape SHAPED; the counterexample names them."""
    f = tmp_path / "attrs.egg"
    f.write_text(ATTRIBUTES)
    report = check_files([f])
    assert sorted(report.checked) == ["neg-slice-again", "view-forgets-permute"]
    assert report.skipped == []
    found = report.counterexamples
    assert len(found) == 5  # one per dtype, the first binding that shows it
    assert all(c.startswith(f"view-forgets-permute ({f}:3) ") for c in found)
    assert "p=[1 0]" in found[0] and "x=[[" in found[0]


def test_an_attribute_rule_that_never_fits_says_so(tmp_path):
    f = tmp_path / "never.egg"
    # a slice of dim 7 fits no input of rank 2, whatever the bounds
    f.write_text(
        "(ruleset mine)\n"
        '(rewrite (Slice (Neg x) 7 a b k) (Neg (Slice x 7 a b k)) :ruleset mine :name "far")\n'
    )
    report = check_files([f])
    assert report.checked == [] and len(report.skipped) == 1
    assert "not graph terms" in report.skipped[0] and "dim 7" in report.skipped[0]
