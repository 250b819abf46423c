"""The compiler core, as one pipeline of named steps.

graph --saturate--> e-graph --analyse--> types, placement --extract--> choices
      --lower--> Program (host steps, crossings, views, kernel descriptions)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .channels_last import channels_last
from .copied_views import write_through_copies
from .costs import MACHINES
from .egraph import Bounds, EGraphView, Saturation, SaturationReport
from .extract import CostModel, infer_placement, infer_types, program_cost
from .graph import Graph
from .horizontal import group_loops, merge_siblings
from .kernel_fusion import fuse_row_takes, inline_row_producers, merge_concats, reuse_written
from .lowering import lower
from .materialise import extract_shared
from .ownership import OutputOwnership, output_ownership
from .program import Program
from .reshape_fusion import inline_through_reshapes
from .rows_fusion import fuse_rows
from .schema import half_facts


@dataclass
class Compiled:
    graph: Graph
    saturation: Saturation
    report: SaturationReport
    view: EGraphView
    model: CostModel
    program: Program
    cost: float  # the extracted program's cost, microseconds per call
    ownership: OutputOwnership  # outputs a call copies out (see saturn.eqsat.ownership)
    stages: Stages = field(default_factory=lambda: Stages())
    choices: dict = field(default_factory=dict)  # e-class -> the extracted Choice
    roots: list = field(default_factory=list)  # the classes of the program's outputs


class Stages:
    """Wall seconds per compile stage, in the order they ran (a stage run twice adds up),
    with what each produced where that has a size (e-nodes, kernels)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.sizes: dict[str, str] = {}
        self._t = time.perf_counter()

    def mark(self, name: str, size: str = "") -> None:
        """Close stage ``name``: the time since the last mark is its."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
        self._t = now
        if size:
            self.sizes[name] = size

    def restart(self) -> None:
        """Time from now on (what ran since the last mark is no stage's)."""
        self._t = time.perf_counter()

    def merge(self, other: Stages) -> None:
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        self.sizes.update(other.sizes)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def slowest(self) -> str:
        return max(self.seconds, key=self.seconds.get) if self.seconds else ""

    def __str__(self) -> str:
        parts = []
        for k, v in self.seconds.items():
            size = f" ({self.sizes[k]})" if k in self.sizes else ""
            parts.append(f"{k} {v:.2f} s{size}")
        return f"{self.total:.2f} s: " + ", ".join(parts)


def compile_graph(
    graph: Graph,
    rules: list | None = None,
    rewrites: list[str] | None = None,
    bounds: Bounds | None = None,
    machine: str = "cpu-reference",
    io_on_device: bool = False,
) -> Compiled:
    stages = Stages()
    # 1. saturate: the graph's terms plus every enabled ruleset, under explicit bounds
    facts = half_facts() if MACHINES[machine].halves else ""
    with Saturation(graph, rules, rewrites, bounds, facts) as sat:
        report = sat.run()
        stages.mark("saturate", f"{len(report.iterations)} iterations")
        # 2. analyse: types and placement per e-class; every e-node of a class must agree
        view = sat.snapshot()  # what follows reads this; the rules' e-graph goes back
    stages.mark("read back", f"{view.enode_count()} e-nodes")
    types = infer_types(view, graph)
    place = infer_placement(view)
    stages.mark("typing")
    # 3. extract: cheapest acyclic program, shared values paid once
    model = CostModel(MACHINES[machine], types, place, io_on_device)
    roots = [device_twin(view, r, place) if io_on_device else r for r in view.outputs]
    best = extract_shared(view, model, roots)
    stages.mark("extract")
    # 4. lower: kernel descriptions, host steps and crossings, validated
    program = lower(graph, view, best, types, place, roots, io_on_device)
    if machine == "gpu":  # the CUDA emitter's rows kernels (the CPU emitter has none)
        program = fuse_row_takes(inline_row_producers(fuse_rows(reuse_written(program))))
        program = inline_through_reshapes(channels_last(program))
        program = merge_concats(write_through_copies(program))
        program = group_loops(merge_siblings(program))
    # 5. ownership: outputs the program would hand out sharing memory eager keeps apart
    ownership = output_ownership(graph, program)
    cost = program_cost(best, roots)
    stages.mark("lower", f"{len(program.kernels)} kernels")
    return Compiled(graph, sat, report, view, model, program, cost, ownership, stages, best, roots)


def device_twin(view: EGraphView, cid: int, place: dict[int, str]) -> int:
    """The device class holding the same value as host class ``cid`` (cid if none)."""
    if place.get(cid) == "device":
        return cid
    for en in view.classes[cid]:
        if en.op == "ToHost":
            return en.kids[0]
    # a host value with no ToHost form (a view of an input): the class copying it over
    for c, enodes in view.classes.items():
        if any(en.op == "ToDev" and en.kids == (cid,) for en in enodes):
            return c
    return cid
