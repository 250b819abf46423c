"""cuDNN convolution plans share their timed choice (codegen/conv.py, ``CONV_TUNINGS``): a
plan of a problem timed before in the process selects the same plan index without timing
candidates again; another problem, other flags or a less aligned operand time their own.
A fake operation graph stands in for cuDNN's (CPU: no cuDNN), with a device time per
candidate plan."""

from __future__ import annotations

import pytest

from saturn.codegen import conv
from saturn.codegen.gemm import Layout
from saturn.codegen.gemm_tuning import CONV_TUNINGS

X = Layout("bf16", (8, 64, 56, 56), (200704, 3136, 56, 1))
W = Layout("bf16", (64, 64, 3, 3), (576, 9, 3, 1))
Y = Layout("bf16", (8, 64, 56, 56), (200704, 3136, 56, 1))
PTRS = (0x10000, 0x20000, 0x30000)


class FakeGraph:
    """Plans 0..3 with these device times; records what ran and what was selected."""

    def __init__(self, times=(3.0, 1.0, 2.0, 4.0)):
        self.times, self.executed, self.selected, self.current = times, [], None, None

    def get_execution_plan_count(self):
        return len(self.times)

    def build_plan_at_index(self, i):
        pass

    def get_workspace_size_plan_at_index(self, i):
        return 1024 * i

    def execute_plan_at_index(self, pack, ws, index, handle, tensor_uids):
        self.executed.append(index)
        self.current = index

    def select_plan(self, i):
        self.selected = i

    def build_plans(self):
        pass


def plan(problem_tail=(False, False, False), graph=None) -> conv.ConvPlan:
    p = conv.ConvPlan.__new__(conv.ConvPlan)
    p.graph, p.stream, p.handle, p.uids = graph or FakeGraph(), 0, None, ()
    p.workspace_size, p.tuned, p.candidates, p.timings = 0, None, 0, {}
    p.problem = ("cudnn", X, W, None, Y, ((1, 1), (1, 1), (1, 1), 1), *problem_tail)
    return p


@pytest.fixture(autouse=True)
def fake_timing(monkeypatch):
    def time_on_stream(fn, stream, reps=3):
        fn()  # runs one candidate on the graph under test (``tuned`` names it)
        g = _GRAPH[0]
        return g.times[g.current]

    monkeypatch.setattr(conv, "time_on_stream", time_on_stream)
    CONV_TUNINGS.clear()
    yield
    CONV_TUNINGS.clear()


_GRAPH: list[FakeGraph] = []


def tuned(p: conv.ConvPlan, ptrs=PTRS) -> None:
    _GRAPH[:] = [p.graph]
    p.autotune(ptrs, lambda n: 0x40000)


def test_a_problem_timed_before_takes_its_choice_without_timing():
    first = plan()
    tuned(first)
    assert first.graph.selected == 1 and first.tuned == (1.0, 1, 1024) and first.candidates == 4
    second = plan()
    tuned(second, (0x50000, 0x60000, 0x70000))  # other buffers, as aligned
    assert second.graph.executed == [] and second.graph.selected == 1
    assert second.tuned == first.tuned and second.workspace_size == 1024
    assert CONV_TUNINGS.stats() == {
        "conv_tunings": 1,
        "conv_tunings_reused": 1,
        "conv_tunings_from_disk": 0,
    }


def test_other_flags_or_alignments_time_their_own():
    tuned(plan())
    tf32 = plan((True, False, False))
    tuned(tf32)
    misaligned = plan()
    tuned(misaligned, (0x10010, 0x20000, 0x30000))
    for p in (tf32, misaligned):
        assert p.graph.executed and p.graph.selected == 1
    assert CONV_TUNINGS.stats() == {
        "conv_tunings": 3,
        "conv_tunings_reused": 0,
        "conv_tunings_from_disk": 0,
    }


def test_a_shared_choice_that_does_not_build_is_timed_again():
    tuned(plan())

    class Refusing(FakeGraph):
        def select_plan(self, i):
            if self.executed == []:  # the shared index, before any timing
                raise RuntimeError("plan 1 does not build")
            super().select_plan(i)

    other = plan(graph=Refusing())
    tuned(other)
    assert other.graph.executed and other.graph.selected == 1 and other.candidates == 4


def test_built_plans_are_shared_by_equal_keys_only():
    """``BuiltPlans``: a key asked before gets the plan built for it (counted), another key
    builds its own, a plan whose build raises is not kept, and past the limit the least
    recently asked plan is dropped."""
    from saturn.codegen.gemm_tuning import BuiltPlans

    table, made = BuiltPlans("conv", limit=2), []

    def make(name):
        def build():
            made.append(name)
            return name

        return build

    assert table.get_or_make(("a", 16), make("a")) == "a"
    assert table.get_or_make(("a", 16), make("a again")) == "a"  # shared, not built
    assert table.get_or_make(("a", 4), make("a, less aligned")) == "a, less aligned"
    assert made == ["a", "a, less aligned"] and table.stats() == {"conv_plans_shared": 1}

    def refuses():
        raise conv.ConvError("cuDNN could not plan this convolution")

    with pytest.raises(conv.ConvError):
        table.get_or_make(("b", 16), refuses)
    assert table.get_or_make(("b", 16), make("b")) == "b"  # the failure was not kept
    # limit 2: ("a", 16) was asked least recently and is dropped
    assert table.get_or_make(("a", 16), make("a rebuilt")) == "a rebuilt"
    assert made[-1] == "a rebuilt" and table.stats() == {"conv_plans_shared": 1}
