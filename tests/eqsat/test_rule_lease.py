"""Rules loaded once per process (decision 0093): a saturation borrows an e-graph holding
the rules and gives it back as loaded; a lent or changed set loads afresh; what a lent
e-graph gives equals what a fresh one gives."""

from __future__ import annotations

import gc
import os

import pytest

from saturn.eqsat import rules
from saturn.eqsat.egraph import Saturation
from saturn.eqsat.errors import EqsatError
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

GRAPH = (
    "(input x f32 [8 64])\n(input w f32 [64 32])\n"
    "(let r (Softmax (Relu (MatMul (Neg x) w)) 1))\n(output r)\n"
)


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts from an empty pool: earlier tests of the worker may have used up a
    load's lends (it is then retired) or left a saturation open that holds it."""
    rules._POOL.clear()
    yield


def _classes(view) -> list:
    return sorted((c, sorted(map(str, ens))) for c, ens in view.classes.items())


def _pooled(files) -> rules._Loaded | None:
    return rules._POOL.get(tuple(p.resolve() for p in files))


def test_a_lent_e_graph_reads_back_what_a_fresh_one_does():
    files = rules.rule_files(None)
    compile_graph(parse_graph(GRAPH))  # the rules loaded and pooled
    holder = Saturation(parse_graph(GRAPH))  # holds the pooled e-graph open
    with Saturation(parse_graph(GRAPH)) as fresh:  # so this one loads its own
        assert fresh.egraph is not holder.egraph
        fresh.run()
        want = _classes(fresh.snapshot())
    holder.close()
    for _ in range(3):  # the pooled e-graph, lent and given back each time
        with Saturation(parse_graph(GRAPH)) as lent:
            assert lent.egraph is _pooled(files).egraph
            lent.run()
            assert _classes(lent.snapshot()) == want


def test_compiles_share_one_load_and_an_open_saturation_does_not_block_others():
    files = rules.rule_files(None)
    compile_graph(parse_graph(GRAPH))
    pooled = _pooled(files)
    assert pooled is not None and not pooled.lent
    first = compile_graph(parse_graph(GRAPH)).program.to_text()
    assert _pooled(files) is pooled and not pooled.lent  # the same load, given back
    held = Saturation(parse_graph(GRAPH))  # left open: holds the pooled e-graph
    assert held.egraph is pooled.egraph and pooled.lent
    # another compile meanwhile loads its own, with the same result
    assert compile_graph(parse_graph(GRAPH)).program.to_text() == first
    del held
    gc.collect()  # a collected saturation gives back what it borrowed
    assert not pooled.lent
    assert compile_graph(parse_graph(GRAPH)).program.to_text() == first


def test_a_changed_rule_file_is_loaded_again(tmp_path):
    mine = tmp_path / "mine.egg"
    mine.write_text("(ruleset mine)\n(rewrite (Exp (Neg x)) (Exp (Neg x)) :ruleset mine)\n")
    text = "(input x f32 [4 8])\n(let r (Exp (Neg x)))\n(output r)\n"
    compile_graph(parse_graph(text), rules=[mine])
    files = rules.rule_files([mine])
    before = _pooled(files)
    assert before is not None
    # a second version of the file (a new size and time) declares another ruleset
    mine.write_text("(ruleset theirs)\n(rewrite (Exp (Neg x)) (Exp (Neg x)) :ruleset theirs)\n")
    st = mine.stat()
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with Saturation(parse_graph(text), rules=[mine]) as sat:
        assert "theirs" in sat.rulesets and "mine" not in sat.rulesets
    assert _pooled(files) is not before


def test_a_closed_saturation_says_so_and_keeps_its_report():
    sat = Saturation(parse_graph(GRAPH))
    report = sat.run()
    view = sat.snapshot()
    sat.close()
    sat.close()  # twice is harmless
    assert sat.report is report and view.outputs
    with pytest.raises(EqsatError, match="closed"):
        sat.snapshot()


def test_checkpoints_pushed_during_a_pass_are_popped_when_given_back():
    """A saturation near its size bound pushes checkpoints of its own; giving back pops
    them all, so the next borrower starts from the rules alone."""
    from saturn.eqsat.egraph import Bounds

    files = rules.rule_files(None)
    big = Saturation(parse_graph(GRAPH), bounds=Bounds(max_enodes=60))
    assert big.egraph is _pooled(files).egraph
    big.run()
    assert big._lease._pushes[0] >= 2  # the lease's own push and a checkpoint
    big.close()
    with Saturation(parse_graph("(input y f32 [3])\n(let r (Exp y))\n(output r)\n")) as sat:
        assert sat.egraph is _pooled(files).egraph
        ops = {en.op for ens in sat.snapshot().classes.values() for en in ens}
        assert not ops & {"MatMul", "Softmax", "Relu"}, ops  # nothing of the graph before


def test_an_e_graph_that_cannot_be_restored_leaves_the_pool():
    """A give-back whose pops egglog refuses (here: more pops than pushes) drops the load
    from the pool instead of lending a wrong e-graph; the next borrower loads afresh."""
    files = rules.rule_files(None)
    lease = rules.borrow(files)
    pooled = _pooled(files)
    assert lease.egraph is pooled.egraph
    lease._pushes[0] += 3  # pops past what was pushed
    lease.give_back()
    assert _pooled(files) is None and not pooled.lent
    with Saturation(parse_graph(GRAPH)) as sat:
        assert sat.egraph is not pooled.egraph and sat.egraph is _pooled(files).egraph
