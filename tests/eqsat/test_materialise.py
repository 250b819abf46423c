"""Materialisation trials (``eqsat/materialise.py``): the program's cost counted where
choices change must equal a fresh count, in any order of the changes, and undo exactly;
every candidate is tried, however deep the model."""

from __future__ import annotations

import random

import pytest

from saturn.eqsat import extract as ex
from saturn.eqsat import materialise as mt
from saturn.eqsat.costs import GPU
from saturn.eqsat.egraph import Saturation
from saturn.eqsat.extract import CostModel, infer_placement, infer_types, program_cost
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph, device_twin

from .test_extraction import _norm_stream


def _extracted(text: str):
    graph = parse_graph(text)
    sat = Saturation(graph)
    sat.run()
    view = sat.snapshot()
    types = infer_types(view, graph)
    place = infer_placement(view)
    model = CostModel(GPU, types, place, io_on_device=True)
    roots = [device_twin(view, r, place) for r in view.outputs]
    return view, model, roots


def _fresh(best, roots) -> tuple[dict[int, int], float]:
    return mt._references(best, roots), program_cost(best, roots)


def _two_programs(n: int):
    """Greedy choices, and the choices with every shared stream body written out."""
    view, model, roots = _extracted(_norm_stream(n))
    x = ex._Extractor(view, model)
    greedy = x.run({}, list(x.ids), {})
    shared = [c for c, k in mt._references(greedy, roots).items() if k >= 2]
    forced = {c: "Ld" for c in shared if greedy[c].enode.op == "Inline"}
    assert forced, "the stream's bodies are read by several kernels"
    y = ex._Extractor(view, model)
    written = y.run({}, list(y.ids), forced)
    return greedy, written, roots


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_switches_in_any_order_count_as_a_fresh_walk(seed):
    greedy, written, roots = _two_programs(6)
    differ = [c for c in set(greedy) | set(written) if greedy.get(c) is not written.get(c)]
    assert len(differ) > 10
    random.Random(seed).shuffle(differ)
    live = mt._LiveProgram(dict(greedy), roots)
    for c in differ:
        live.switch(c, written.get(c))
    refs, cost = _fresh(written, roots)
    assert live.refs == refs
    assert live.members == set(refs) | set(roots)
    assert live.cost == pytest.approx(cost, rel=1e-12)
    assert cost != pytest.approx(program_cost(greedy, roots), rel=1e-6)  # not vacuous
    assert live.feasible
    for c in reversed(differ):  # undone in reverse: the first program again
        live.switch(c, greedy.get(c))
    refs, cost = _fresh(greedy, roots)
    assert live.refs == refs and live.cost == pytest.approx(cost, rel=1e-12)


def test_a_member_left_without_a_choice_is_not_feasible():
    greedy, _, roots = _two_programs(3)
    live = mt._LiveProgram(dict(greedy), roots)
    member = next(c for c in live.refs if not greedy[c].expr and greedy[c].enode.kids)
    live.switch(member, None)
    assert not live.feasible
    live.switch(member, greedy[member])
    assert live.feasible
    assert live.cost == pytest.approx(program_cost(greedy, roots), rel=1e-12)


def test_every_layer_is_tried_past_the_old_trial_cap(monkeypatch):
    """The stream's bodies nest through every layer, so no two share a group: 80 layers
    need more than the 64 trials extraction once stopped at, and each layer's stream
    is written once all the same."""
    tried = []
    trial_pop = mt._Candidates.pop

    def pop(self):
        got = trial_pop(self)
        if got is not None:
            tried.append(got)
        return got

    monkeypatch.setattr(mt._Candidates, "pop", pop)
    n = 80
    c = compile_graph(parse_graph(_norm_stream(n)), machine="gpu", io_on_device=True)
    assert len(tried) > 64
    assert len(c.program.kernels) >= 2 * n, c.program.to_text()
