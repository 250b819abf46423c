"""Loading rule files: errors name the file and line; user rules join the schedule; every
rule has a name, a ruleset and a comment; saturation bounds are honoured and reported."""

from __future__ import annotations

import math
import os
import re

import pytest

from saturn.eqsat.egraph import Bounds, Saturation
from saturn.eqsat.errors import EqsatError, RuleError
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph
from saturn.eqsat.rules import DEFAULT_FILES, RULES_DIR

CHAIN = "(input x f32 [4 8])\n(let r (Exp (Neg x)))\n(output r)\n"


def test_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "broken.egg"
    bad.write_text(";; ok\n(ruleset mine)\n(rewrite (Exp x)\n")
    with pytest.raises(RuleError) as info:
        Saturation(parse_graph(CHAIN), rules=[bad])
    assert info.value.loc.file.endswith("broken.egg")
    assert info.value.loc.line == 3 or "end of file" in info.value.message


def test_type_error_names_file_and_line(tmp_path):
    bad = tmp_path / "typo.egg"
    bad.write_text("(ruleset mine)\n\n(rewrite (Exp x) (Expp x) :ruleset mine)\n")
    with pytest.raises(RuleError) as info:
        Saturation(parse_graph(CHAIN), rules=[bad])
    assert info.value.loc.line == 3 and "Expp" in info.value.message


def test_user_rules_from_a_folder_run_and_include_resolves_from_any_cwd(tmp_path, monkeypatch):
    folder = tmp_path / "myrules"
    folder.mkdir()
    (folder / "sub").mkdir()
    (folder / "sub" / "helper.egg").write_text(
        ";; -(-x) stays; here exp(-x) becomes a named rewrite for the test\n"
        '(rewrite (Exp (Neg x)) (Reciprocal (Exp x)) :ruleset mine :name "exp-neg")\n'
    )
    (folder / "main.egg").write_text('(ruleset mine)\n(include "sub/helper.egg")\n')
    monkeypatch.chdir(tmp_path.parent)  # include must not depend on the working directory
    sat = Saturation(parse_graph(CHAIN), rules=[folder])
    assert "mine" in sat.rulesets
    report = sat.run()
    assert report.rule_totals().get("exp-neg", 0) >= 1


def test_conflicting_facts_are_an_error(tmp_path):
    wrong = tmp_path / "wrong.egg"
    # Equates a rank-2 value with a rank-1 one: the rank analysis refuses the merge.
    wrong.write_text("(ruleset mine)\n(rewrite (Exp x) (Sum x (vec-of 0) 0) :ruleset mine)\n")
    with pytest.raises(EqsatError):
        compile_graph(parse_graph(CHAIN), rules=[wrong])


def test_every_rule_is_named_in_a_ruleset_and_explained():
    for name in DEFAULT_FILES:
        text = (RULES_DIR / name).read_text()
        assert text.lstrip().startswith(";;"), f"{name} needs a header comment"
        for m in re.finditer(r"^\((rule|rewrite|birewrite)\b", text, re.M):
            form = text[m.start() : text.find("\n\n", m.start()) + 1 or len(text)]
            assert ":ruleset" in form and ":name" in form, f"{name}: {form[:80]}"
            if name not in ("schema.egg", "placement.egg"):
                before = text[: m.start()].rstrip().splitlines()[-1]
                assert before.startswith(";;") or "rule" in before, f"{name}: {form[:60]}"


def test_bounds_stop_and_say_which():
    g = parse_graph("(input x f32 [8])\n(let r (Relu (Exp (Neg (Abs x)))))\n(output r)\n")
    sat = Saturation(g, bounds=Bounds(iterations=1))
    report = sat.run()
    assert report.stop_reason == "iteration bound (1)" and len(report.iterations) == 1
    sat = Saturation(g, bounds=Bounds(max_enodes=5))
    assert sat.run().stop_reason.startswith("size bound")
    full = Saturation(g).run()
    assert full.saturated and "saturated" in full.summary()


def test_unknown_rewrite_is_rejected():
    with pytest.raises(EqsatError, match="opt-in rulesets"):
        Saturation(parse_graph(CHAIN), rewrites=["nonsense"])


def test_rules_folder_holds_no_stray_files():
    names = {p.name for p in RULES_DIR.glob("*.egg")}
    assert names == set(DEFAULT_FILES), names - set(DEFAULT_FILES)
    assert os.path.exists(RULES_DIR / "__init__.py")


@pytest.mark.parametrize(
    "literal,value",
    [
        ("0.5", 0.5),
        ("-0.0", -0.0),
        ("0.0", 0.0),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("nan", math.nan),
        ("1e-5", 1e-5),
        ("-2.5e+3", -2500.0),
        ("5e-324", 5e-324),  # the smallest subnormal
        ("1.7976931348623157e308", 1.7976931348623157e308),
        ("0.7978845608028654", 0.7978845608028654),
    ],
)
def test_scalar_literals_in_rules_are_the_bits_graph_files_store(literal, value):
    from saturn.eqsat.graph import bits_float, float_bits
    from saturn.eqsat.rules import scalar_literals

    out = scalar_literals(f"(rule ((= e (Mul x (Scalar {literal} d)))) ())")
    bits = int(out.split("(Scalar ")[1].split()[0])
    assert bits == float_bits(value)
    got = bits_float(bits)
    assert (math.isnan(got) and math.isnan(value)) or (
        got == value and math.copysign(1, got) == math.copysign(1, value)
    )


def test_scalar_literals_leave_bit_patterns_and_names_alone():
    from saturn.eqsat.rules import scalar_literals

    text = "(Scalar 4607182418800017408 d) (Scalar eps d) (Scalar 0 d) (Scalarx 1.0)"
    assert scalar_literals(text) == text


def test_a_rule_written_with_a_literal_fires(tmp_path):
    rule = tmp_path / "half.egg"
    rule.write_text(
        "(ruleset mine)\n"
        "(rule ((= e (Mul x (Scalar 0.5 d))) (= d (dtype x)) (float-dtype d))\n"
        '      ((union e (Div x (Scalar 2.0 d)))) :ruleset mine :name "half-as-div")\n'
    )
    g = parse_graph("(input x f32 [3])\n(let y (Mul x (Scalar 0.5 f32)))\n(output y)\n")
    c = compile_graph(g, rules=[rule])
    assert c.report.rule_totals().get("half-as-div", 0) >= 1
