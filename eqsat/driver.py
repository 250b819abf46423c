"""Run the compiler core on a text graph and print what it made.

    python -m saturn.eqsat [--rules PATH ...] [--rewrites NAME ...] [--machine NAME]
                           [--emit extracted|kernels|source|plan|stats|dot] GRAPH
    python -m saturn.eqsat --list-rules [--rules PATH ...]
    python -m saturn.eqsat check RULES.egg|FOLDER ...   (fuzz each rule's two sides)

Exit status 2, with the file and line, for a malformed graph or rule file.
"""

from __future__ import annotations

import argparse
import sys

from .costs import MACHINES
from .egraph import Bounds
from .errors import EqsatError
from .graph import load_graph
from .kinds import Kind, is_body, spec
from .pipeline import Compiled, compile_graph
from .program import format_expr
from .rules import OPT_IN_RULESETS, rule_files, rule_index


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
    """The saturated e-graph as graphviz: a cluster per class, the e-nodes extraction chose
    drawn bold and filled (the program is made of them)."""
    lines = ["digraph egraph {", "  compound=true; rankdir=BT; node [shape=box, fontsize=10];"]
    chosen = {cid: ch.enode for cid, ch in c.choices.items()}
    used = _used_classes(c)
    for cid, enodes in sorted(c.view.classes.items()):
        lines.append(f'  subgraph cluster_{cid} {{ label="{cid}"; style=dashed;')
        for i, en in enumerate(enodes):
            label = en.op + ("" if not en.attrs else " " + " ".join(map(str, en.attrs)))
            mark = ""
            if cid in used and chosen.get(cid) == en:
                mark = ', style="bold,filled", fillcolor=lightblue'
            lines.append(f'    n{cid}_{i} [label="{label}"{mark}];')
        lines.append("  }")
    for cid, enodes in sorted(c.view.classes.items()):
        for i, en in enumerate(enodes):
            for k in en.kids:
                # an e-node reading its own class (a cycle the e-graph holds) has no cluster
                # edge to draw: graphviz cannot clip an edge to the cluster it starts in
                head = "" if k == cid else f" [lhead=cluster_{k}]"
                lines.append(f"  n{cid}_{i} -> n{k}_0{head};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _used_classes(c: Compiled) -> set[int]:
    """The classes the extracted program reads, from its roots down its chosen e-nodes."""
    used: set[int] = set()
    stack = list(c.roots)
    while stack:
        k = stack.pop()
        if k in used or k not in c.choices:
            continue
        used.add(k)
        stack.extend(c.choices[k].enode.kids)
    return used


def emit_source(c: Compiled) -> str:
    """The generated source of every loop, reduction and rows kernel (the GPU machine's
    CUDA kernels in Numba's dialect, main variant for compute capability 9.0; the CPU
    reference's Numba functions); library steps named by what runs them."""
    # codegen sits beside eqsat (it reads Program); imported here, where a CLI user asks
    from saturn.codegen import cpu
    from saturn.codegen import cuda as cg

    gpu = c.model.machine.name == "gpu"
    out = []
    for k in c.program.kernels:
        head = f"# ---- kernel {k.output}: {k.kind} -> {k.dtype}{list(k.shape)}"
        if is_body(k.kind) and (gpu or k.kind != Kind.ROWS):
            src = cg.generate(k).source if gpu else cpu.kernel_source(k)[0]
            out += [head, src.rstrip(), ""]
        else:
            out += [
                f"{head} (a library call or a fixed kernel: {spec(k.kind).describe or k.kind})",
                "",
            ]
    return "\n".join(out) + "\n" if out else "# no generated kernels\n"


def emit_plan(c: Compiled) -> str:
    """The memory plan: every kernel output's place in the one arena a call uses, and the
    steps between which it is live."""
    from .memory import plan_memory

    plan = plan_memory(c.program)
    lines = [f"arena: {plan.size} bytes, {len(plan.slots)} buffers"]
    width = max((len(v) for v in plan.slots), default=0)
    for v, slot in sorted(plan.slots.items(), key=lambda kv: (kv[1].offset, kv[1].first)):
        lines.append(
            f"  {v:{width}s}  offset {slot.offset:>10d}  {slot.nbytes:>10d} bytes  "
            f"live steps {slot.first}..{slot.last}"
        )
    return "\n".join(lines) + "\n"


def list_rules(extra: list[str]) -> str:
    """Every named rule: its ruleset, name, file and line."""
    rows = rule_index(rule_files(extra))
    width = max((len(n) for _, n, _, _ in rows), default=0)
    return "".join(f"{rs:10s} {n:{width}s}  {f.name}:{line}\n" for rs, n, f, line in rows)


EMITTERS = {
    "extracted": lambda c: c.program.to_text(),
    "kernels": emit_kernels,
    "source": emit_source,
    "plan": emit_plan,
    "stats": emit_stats,
    "dot": emit_dot,
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m saturn.eqsat", description="Saturate, extract and print a text graph."
    )
    ap.add_argument("graph", nargs="?", help="a .graph file in the term language")
    ap.add_argument(
        "--list-rules",
        action="store_true",
        help="list every rule (ruleset, name, file:line), with --rules' too, and exit",
    )
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
    ap.add_argument(
        "--max-enodes",
        type=int,
        default=Bounds.max_enodes,
        help="e-node bound (default: 50,000 or 25 per graph op, whichever is more)",
    )
    ap.add_argument("--seconds", type=float, default=Bounds.seconds)
    return ap


def run(argv: list[str]) -> str:
    ap = parser()
    args = ap.parse_args(argv)
    if args.list_rules:
        return list_rules(args.rules)
    if args.graph is None:
        ap.error("a graph file is needed (or --list-rules)")
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


def check_main(argv: list[str]) -> int:
    """``check RULES.egg|FOLDER ...``: exit 1 on a counterexample, 2 on a broken file."""
    from .check import check_files

    if not argv:
        print("usage: python -m saturn.eqsat check RULES.egg|FOLDER ...", file=sys.stderr)
        return 2
    try:
        report = check_files(argv)
    except EqsatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report)
    return 1 if report.counterexamples else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        return check_main(argv[1:])
    try:
        sys.stdout.write(run(argv))
    except EqsatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
