"""Saturation bounds hold whatever the rules do: a rule set that grows the e-graph without
bound (commutativity, associativity, distributivity on a 12-term sum of products) and an
analysis rule that never stops, each stopped by the bound it meets, within 10% of it.

The time bound is the behaviour under test here, not a performance claim: saturation
checks the clock after every ruleset run, the back-off scheduler keeps each run short,
and a run expected to end more than 5% past the bound (its ruleset's last run, scaled by
the growth since) is not started. Runs on a loaded machine are slower and so is the
estimate, so the wall time stays within 10% of the bound there too."""

from __future__ import annotations

import time

import pytest

from saturn.eqsat.egraph import Bounds, Saturation
from saturn.eqsat.errors import EqsatError
from saturn.eqsat.graph import parse_graph

EXPLODE = """;; commutativity, associativity and distributivity: no end to a long sum's forms
(ruleset explode)
(rewrite (Add a b) (Add b a) :ruleset explode :name "add-comm")
(rewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset explode :name "add-assoc")
(rewrite (Add (Add a b) c) (Add a (Add b c)) :ruleset explode :name "add-assoc-r")
(rewrite (Mul a b) (Mul b a) :ruleset explode :name "mul-comm")
(rewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)) :ruleset explode :name "distribute")
(rewrite (Add (Mul a b) (Mul a c)) (Mul a (Add b c)) :ruleset explode :name "factor")
"""
GROW = """;; an analysis rule that never stops: every Exp gets an Exp above it
(rule ((= e (Exp x))) ((let y (Exp e))) :ruleset analysis :name "grow")
"""
HUGE = 10**9


def sum_of_products(n: int = 12) -> str:
    lines = [f"(input x{i} f32 [4])\n(input y{i} f32 [4])" for i in range(n)]
    term = "(Mul x0 y0)"
    for i in range(1, n):
        term = f"(Add {term} (Mul x{i} y{i}))"
    return "\n".join(lines) + f"\n(let r {term})\n(output r)\n"


@pytest.fixture
def explode(tmp_path):
    path = tmp_path / "explode.egg"
    path.write_text(EXPLODE)
    return path


def saturate(text: str, rules, bounds: Bounds) -> tuple[Saturation, float]:
    sat = Saturation(parse_graph(text), rules=rules, bounds=bounds)
    t0 = time.perf_counter()
    sat.run()
    return sat, time.perf_counter() - t0


@pytest.mark.parametrize("seconds", [0.5, 1.0, 2.0])
def test_the_time_bound_holds_on_an_exploding_rule_set(explode, seconds):
    sat, wall = saturate(sum_of_products(), [explode], Bounds(10_000, HUGE, seconds))
    assert sat.report.stop_reason == f"time bound ({seconds} s)"
    # within 10% of it; a stop before it (a run that would have crossed it) is allowed, but
    # not long before: runs are a fraction of the bound
    assert 0.5 * seconds <= wall <= 1.1 * seconds, (wall, sat.report.longest_run)
    assert len(sat.report.iterations) > 3  # it kept going until the clock stopped it


def test_the_size_bound_holds_on_an_exploding_rule_set(explode):
    for limit in (2_000, 20_000):
        sat, _ = saturate(sum_of_products(), [explode], Bounds(10_000, limit, 600.0))
        assert sat.report.stop_reason == f"size bound ({limit} e-nodes)"
        assert sat.enodes() <= 1.1 * limit, (limit, sat.enodes())
        assert sat.snapshot().enode_count() > limit / 10  # it did grow


def test_the_iteration_bound_is_exact_on_an_exploding_rule_set(explode):
    sat, _ = saturate(sum_of_products(), [explode], Bounds(3, HUGE, 600.0))
    assert sat.report.stop_reason == "iteration bound (3)"
    assert len(sat.report.iterations) == 3


def test_a_growing_analysis_rule_is_stopped_by_the_time_bound(tmp_path):
    grow = tmp_path / "grow.egg"
    grow.write_text(GROW)
    text = "(input x f32 [4])\n(let r (Exp x))\n(output r)\n"
    sat, wall = saturate(text, [grow], Bounds(12, HUGE, 1.0))
    assert sat.report.stop_reason == "time bound (1.0 s)"
    assert 0.5 <= wall <= 1.1, (wall, sat.report.longest_run)
    sat, _ = saturate(text, [grow], Bounds(12, 3_000, 600.0))
    assert sat.report.stop_reason.startswith("size bound") and sat.enodes() <= 3_300


def test_a_bounded_rule_set_still_saturates(explode):
    """The scheduler holds back only rules that match more than their limit: the default
    rules on the same graph saturate, as before."""
    sat, _ = saturate(sum_of_products(), None, Bounds())
    assert sat.report.saturated, sat.report.summary()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"iterations": 0}, "iterations must be a whole number >= 1"),
        ({"iterations": 2.5}, "iterations must be a whole number >= 1"),
        ({"iterations": True}, "iterations must be a whole number >= 1"),
        ({"max_enodes": -1}, "max_enodes must be a whole number >= 1"),
        ({"seconds": float("nan")}, "seconds must be a finite number > 0"),
        ({"seconds": float("inf")}, "seconds must be a finite number > 0"),
        ({"seconds": "10"}, "seconds must be a finite number > 0"),
        ({"seconds": -1.0}, "seconds must be a finite number > 0"),
    ],
)
def test_bounds_refuse_values_that_bound_nothing(kwargs, message):
    with pytest.raises(EqsatError, match=message):
        Bounds(**kwargs)
