"""Which outputs of a program a call must hand out as memory of their own.

Eager PyTorch returns a tensor that shares memory with an input only where the graph
reaches that output from the input through views (the op table's movement ops), and two
outputs share memory only where both are views of one value. A program can do otherwise:
rules delete a same-dtype cast (``clone``, ``contiguous``), equal values are one e-class
(``x + 1`` and ``(x + 1).clone()`` are one buffer), and a constant is made once per recipe.
Handing such a value out as it is would let a caller's write to the output reach an input,
another output or the next call. ``output_ownership`` finds those positions from the
graph and the program alone; the executor copies them (``copy``) or compares their strides
with eager's and copies on a mismatch (``layout``).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import optable as ot
from .graph import Graph
from .program import Program, StepKind

Root = tuple[str, str]  # ("input", graph input) | ("value", node or program value) | ("const", ...)


@dataclass(frozen=True)
class OutputOwnership:
    # positions to copy at every call: the program value is a view of an input, or the
    # buffer of an earlier output that eager keeps apart
    copy: tuple[int, ...] = ()
    # positions that view a constant the recipe makes once (a GPU runner's hand-out already
    # copies memory it does not rewrite each call; the host executor must copy them)
    constants: tuple[int, ...] = ()
    # positions that are views in the program of memory the output owns: their strides
    # may differ from eager's (a permute of a packed kernel output where eager's op wrote
    # a packed tensor), which the executor compares
    layout: tuple[int, ...] = ()
    # the program root each copied position was found on (for explain and the tests)
    why: tuple[str, ...] = ()
    # positions whose eager output owns its memory (no view of an input): the executor
    # may give them eager's layout where the program's differs (a kernel that writes a
    # permuted layout, a reshape copied in another order, a device copy of a view)
    owned: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.copy or self.constants or self.layout)


def graph_root(graph: Graph, name: str) -> Root:
    """What an output's memory is in eager: the input it views, or the node that made it."""
    node = graph.nodes[name]
    while node.row is not None and node.row.category == ot.MOVEMENT:
        node = graph.nodes[node.args[0]]
    if node.op in ("Input", "Param"):
        return ("input", node.name)
    return ("value", node.name)


def program_root(prog: Program, value: str) -> tuple[str, str]:
    """The step whose memory a program value is: through view steps to an input, a
    constant, or a step that writes memory of its own (a kernel, a host op, a crossing)."""
    steps = {s.output: s for s in prog.steps}
    s = steps[value]
    while s.kind == StepKind.VIEW:
        s = steps[s.args[0]]
    return (s.kind, s.output)


def output_ownership(graph: Graph, prog: Program) -> OutputOwnership:
    if len(graph.outputs) != len(prog.outputs):
        raise ValueError(
            f"{len(graph.outputs)} graph outputs against {len(prog.outputs)} program outputs"
        )
    steps = {s.output: s for s in prog.steps}
    input_of = {v: n for n, v in prog.inputs.items()}
    copy, constants, layout, why, owned = [], [], [], [], []
    owner: dict[tuple[str, str], Root] = {}  # program root -> the eager memory it serves
    for k, (name, value) in enumerate(zip(graph.outputs, prog.outputs, strict=True)):
        eager = graph_root(graph, name)
        kind, root = program_root(prog, value)
        if eager[0] == "input":
            continue  # eager's output views an input: so may ours
        owned.append(k)
        if kind in (StepKind.INPUT, StepKind.CONST):
            (copy if kind == StepKind.INPUT else constants).append(k)
            what = (
                f"input {input_of.get(root, root)}"
                if kind == StepKind.INPUT
                else f"constant {root}"
            )
            why.append(f"output {k} ({name}) is a view of {what}")
            continue
        served = owner.setdefault((kind, root), eager)
        if served != eager:
            copy.append(k)
            why.append(f"output {k} ({name}) shares {root} with an output eager keeps apart")
            continue
        if steps[value].kind == StepKind.VIEW:
            layout.append(k)
    return OutputOwnership(tuple(copy), tuple(constants), tuple(layout), tuple(why), tuple(owned))
