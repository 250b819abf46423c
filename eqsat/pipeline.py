"""The compiler core, as one pipeline of named steps.

graph --saturate--> e-graph --analyse--> types, placement --extract--> choices
      --lower--> Program (host steps, crossings, views, kernel descriptions)
"""

from __future__ import annotations

from dataclasses import dataclass

from .costs import MACHINES
from .egraph import Bounds, EGraphView, Saturation, SaturationReport
from .extract import CostModel, extract_shared, infer_placement, infer_types, program_cost
from .graph import Graph
from .ownership import OutputOwnership, output_ownership
from .program import (
    Program,
    fuse_row_takes,
    fuse_rows,
    inline_row_producers,
    lower,
    merge_concats,
    reuse_written,
)
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


def compile_graph(
    graph: Graph,
    rules: list | None = None,
    rewrites: list[str] | None = None,
    bounds: Bounds | None = None,
    machine: str = "cpu-reference",
    io_on_device: bool = False,
) -> Compiled:
    # 1. saturate: the graph's terms plus every enabled ruleset, under explicit bounds
    facts = half_facts() if MACHINES[machine].halves else ""
    sat = Saturation(graph, rules, rewrites, bounds, facts)
    report = sat.run()
    # 2. analyse: types and placement per e-class; every e-node of a class must agree
    view = sat.snapshot()
    types = infer_types(view, graph)
    place = infer_placement(view)
    # 3. extract: cheapest acyclic program, shared values paid once
    model = CostModel(MACHINES[machine], types, place, io_on_device)
    roots = [device_twin(view, r, place) if io_on_device else r for r in view.outputs]
    best = extract_shared(view, model, roots)
    # 4. lower: kernel descriptions, host steps and crossings, validated
    program = lower(graph, view, best, types, place, roots, io_on_device)
    if machine == "gpu":  # the CUDA emitter's rows kernels (the CPU emitter has none)
        program = fuse_row_takes(inline_row_producers(fuse_rows(reuse_written(program))))
        program = merge_concats(program)
    # 5. ownership: outputs the program would hand out sharing memory eager keeps apart
    ownership = output_ownership(graph, program)
    cost = program_cost(best, roots)
    return Compiled(graph, sat, report, view, model, program, cost, ownership)


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
