"""Run the compiler core on a text graph and print what it made.

    python -m saturn.eqsat [--rules PATH ...] [--rewrites NAME ...] [--machine NAME]
                           [--emit extracted|kernels|stats|dot] GRAPH

Exit status 2, with the file and line, for a malformed graph or rule file.
"""

from __future__ import annotations

import argparse
import sys

from .costs import MACHINES
from .egraph import Bounds
from .errors import EqsatError
from .graph import load_graph
from .pipeline import Compiled, compile_graph
from .program import format_expr
from .rules import OPT_IN_RULESETS


def emit_stats(c: Compiled) -> str:
    p = c.program
    lines = [c.report.summary(), "rules fired (matches):"]
    lines += [f"  {rule}: {n}" for rule, n in c.report.rule_totals().items() if n]
    lines.append(f"e-graph: {c.view.enode_count()} e-nodes in {len(c.view.classes)} classes")
    lines.append(
        f"program: {len(p.steps)} steps, {len(p.kernels)} kernels, "
        f"{p.count('crossing')} crossings, {p.count('host')} host ops; "
        f"cost {c.cost:.2f} us ({c.model.machine.name})"
    )
    lines.append(f"stages: {c.stages}")
    return "\n".join(lines) + "\n"


def emit_kernels(c: Compiled) -> str:
    out = []
    for k in c.program.kernels:
        out.append(f"kernel {k.output}: {k.kind} -> {k.dtype}{list(k.shape)}")
        for i, o in enumerate(k.inputs):
            out.append(f"  in{i}: {o.value} {o.dtype}{list(o.shape)} indexing={o.indexing}")
        if k.body is not None:
            out.append(f"  domain: {list(k.domain)}")
            out.append(f"  body: {format_expr(k.body)}")
        for a, v in sorted(k.attrs.items()):
            out.append(f"  {a}: {v}")
        out.append(f"  writes: {', '.join(k.covers) or '-'}")
        if k.fused:
            out.append(f"  computes inside: {', '.join(k.fused)}")
    return "\n".join(out) + "\n"


def emit_dot(c: Compiled) -> str:
    """The saturated e-graph as graphviz: a cluster per class, chosen e-nodes bold."""
    lines = ["digraph egraph {", "  compound=true; rankdir=BT; node [shape=box, fontsize=10];"]
    for cid, enodes in sorted(c.view.classes.items()):
        lines.append(f'  subgraph cluster_{cid} {{ label="{cid}"; style=dashed;')
        for i, en in enumerate(enodes):
            label = en.op + ("" if not en.attrs else " " + " ".join(map(str, en.attrs)))
            lines.append(f'    n{cid}_{i} [label="{label}"];')
        lines.append("  }")
    for cid, enodes in sorted(c.view.classes.items()):
        for i, en in enumerate(enodes):
            for k in en.kids:
                lines.append(f"  n{cid}_{i} -> n{k}_0 [lhead=cluster_{k}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


EMITTERS = {
    "extracted": lambda c: c.program.to_text(),
    "kernels": emit_kernels,
    "stats": emit_stats,
    "dot": emit_dot,
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m saturn.eqsat", description="Saturate, extract and print a text graph."
    )
    ap.add_argument("graph", help="a .graph file in the term language")
    ap.add_argument(
        "--rules",
        action="append",
        default=[],
        help="extra .egg file or folder of them (repeatable)",
    )
    ap.add_argument(
        "--rewrites",
        action="append",
        default=[],
        choices=OPT_IN_RULESETS,
        help="opt-in ruleset to run (repeatable)",
    )
    ap.add_argument("--machine", default="cpu-reference", choices=sorted(MACHINES))
    ap.add_argument("--emit", default="extracted", choices=sorted(EMITTERS))
    ap.add_argument(
        "--io",
        default="host",
        choices=("host", "device"),
        help="where inputs arrive and outputs leave (device: as in a compiled call)",
    )
    ap.add_argument("--iterations", type=int, default=Bounds.iterations)
    ap.add_argument("--max-enodes", type=int, default=Bounds.max_enodes)
    ap.add_argument("--seconds", type=float, default=Bounds.seconds)
    return ap


def run(argv: list[str]) -> str:
    args = parser().parse_args(argv)
    graph = load_graph(args.graph)
    compiled = compile_graph(
        graph,
        rules=args.rules,
        rewrites=args.rewrites,
        bounds=Bounds(args.iterations, args.max_enodes, args.seconds),
        machine=args.machine,
        io_on_device=args.io == "device",
    )
    return EMITTERS[args.emit](compiled)


def main(argv: list[str] | None = None) -> int:
    try:
        sys.stdout.write(run(sys.argv[1:] if argv is None else argv))
    except EqsatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
