"""Loading rule files: errors name the file and line; user rules join the schedule; every
rule has a name, a ruleset and a comment; saturation bounds are honoured and reported."""

from __future__ import annotations

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
