"""``saturn.explain(model_or_fn, *inputs)``: where every operation went.

A summary first (per graph: ops, kernels by kind, launches, crossings and host ops per
call, why saturation stopped; the graphs that ran uncompiled and why), then for each graph
saturn compiled: the imported graph, what each ruleset changed, the kernels,
and a schedule giving each op's fate (the kernel that computes it, fused or materialised;
a view on the device; a host op and whether its inputs crossed; or folded away by a
rewrite), with the number of crossings and kernel launches per call. The caller's own
compiled functions are left as they were: explain compiles through a backend object of its
own, which dynamo keeps apart from every other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from saturn.eqsat.driver import emit_kernels
from saturn.eqsat.kinds import facts
from saturn.eqsat.program import StepKind
from saturn.eqsat.rules import rule_files, rule_owners

from . import backend


@dataclass
class GraphReport:
    graph_text: str
    rulesets: dict[str, dict[str, int]]  # ruleset -> rule -> matches
    stop_reason: str
    kernels_text: str
    fates: dict[str, list[str]]  # FX node -> fates
    crossings: int
    launches: int
    host_ops: int
    program_text: str
    copied_outputs: tuple[str, ...] = ()  # outputs given memory of their own at every call
    kernel_kinds: tuple[str, ...] = ()  # each kernel's kind (loop, gemm, ...)
    stages: str = ""  # seconds per compile stage (saturn.eqsat.pipeline.Stages)

    def summary(self) -> str:
        by_kind = Counter(self.kernel_kinds)
        kernels = ", ".join(f"{n} {k}" for k, n in sorted(by_kind.items())) or "none"
        return (
            f"{len(self.fates)} ops; kernels: {kernels}; per call {self.launches} launches, "
            f"{self.crossings} crossings, {self.host_ops} host ops; saturation: "
            f"{self.stop_reason}; compiled in {self.stages}"
        )

    def __str__(self) -> str:
        lines = ["imported graph:", *("  " + ln for ln in self.graph_text.splitlines())]
        lines.append(f"saturation: {self.stop_reason}")
        for rs, rules in self.rulesets.items():
            fired = ", ".join(f"{r} x{n}" for r, n in sorted(rules.items()))
            lines.append(f"  {rs}: {fired}")
        lines.append("kernels:")
        lines += ["  " + ln for ln in self.kernels_text.splitlines()] or ["  (none)"]
        lines.append("schedule (each op's fate):")
        width = max((len(n) for n in self.fates), default=0)
        for n, f in self.fates.items():
            lines.append(f"  {n:{width}s}  {'; '.join(f)}")
        for why in self.copied_outputs:
            lines.append(f"  copied out at every call: {why}")
        lines.append(
            f"per call: {self.launches} kernel launches, {self.crossings} crossings, "
            f"{self.host_ops} host ops"
        )
        return "\n".join(lines)


@dataclass
class Explanation:
    graphs: list[GraphReport] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Per-graph totals and the graphs that ran uncompiled, one line each."""
        n, m = len(self.graphs), len(self.fallbacks)
        lines = [f"saturn compiled {n} graph(s), {m} ran uncompiled"]
        lines += [f"  graph {i}: {g.summary()}" for i, g in enumerate(self.graphs)]
        lines += [f"  uncompiled: {r}" for r in self.fallbacks]
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [self.summary()]
        for i, g in enumerate(self.graphs):
            parts.append(f"=== graph {i} ===\n{g}")
        for r in self.fallbacks:
            parts.append(f"=== graph ran uncompiled: {r}")
        return "\n\n".join(parts)


def report(cg: backend.CompiledGraph, rules: list[str] | None = None) -> GraphReport:
    prog = cg.compiled.program
    owners = rule_owners(rule_files(rules))
    rulesets: dict[str, dict[str, int]] = {}
    for rule, n in cg.compiled.report.rule_totals().items():
        if n and not rule.startswith("type-"):
            rulesets.setdefault(owners.get(rule, "?"), {})[rule] = n
    crossing_outputs = {s.output for s in prog.steps if s.kind == StepKind.CROSSING}
    graph = cg.imported.graph
    fates: dict[str, list[str]] = {}
    for name, node in graph.nodes.items():
        if node.op in ("Input", "Scalar") or name not in cg.imported.fx_names:
            continue
        fx = cg.imported.fx_names[name]
        fates.setdefault(fx, [])
    for s in prog.steps:
        fused = s.kernel.fused if s.kernel is not None else []
        for g in [*s.covers, *fused]:
            fx = cg.imported.fx_names.get(g)
            if fx is None or graph.nodes[g].op == "Input":
                continue
            if s.kind == StepKind.KERNEL:
                k = s.kernel
                how = "computed inside" if g in fused else "written by"
                fates[fx].append(f"{how} kernel {s.output} ({k.kind})")
            elif s.kind == StepKind.HOST:
                moved = any(a in crossing_outputs for a in s.args)
                fates[fx].append("host" + (" (its inputs crossed)" if moved else ""))
            elif s.kind == StepKind.VIEW:
                fates[fx].append(f"view on the {s.place}")
    for f in fates.values():
        if not f:
            f.append("folded away by a rewrite (merged with an equal value)")
    return GraphReport(
        graph_text=graph.to_text(),
        rulesets=rulesets,
        stop_reason=cg.compiled.report.stop_reason,
        kernels_text=emit_kernels(cg.compiled).rstrip(),
        fates=fates,
        crossings=prog.count("crossing"),
        launches=sum(not facts(k.kind).side for k in prog.kernels),  # a statistic: none
        host_ops=prog.count("host"),
        program_text=prog.to_text(),
        copied_outputs=cg.compiled.ownership.why,
        kernel_kinds=tuple(k.kind for k in prog.kernels),
        stages=str(cg.compiled.stages),
    )


class _Explaining:
    """saturn's backend under an object of explain's own: dynamo compiles the function
    again for it (its cache entries carry their backend) and leaves the caller's compiled
    frames alone; the recipes come from saturn's cache where it has them."""

    def __init__(self, options: dict | None):
        self.options = options

    def __call__(self, gm, example_inputs):
        return backend.saturn_backend(gm, example_inputs, options=self.options)


def explain(model_or_fn, *inputs, options: dict | None = None) -> Explanation:
    """Compile ``model_or_fn`` with saturn, run it once on ``inputs``, and say where every
    operation of every compiled graph went. Compiled functions of the caller stay
    compiled."""
    backend._capture.graphs = []
    fallbacks_before = len(backend.CACHE.fallbacks)
    try:
        fn = torch.compile(model_or_fn, backend=_Explaining(options), dynamic=False)
        fn(*inputs)
        captured = list(backend._capture.graphs)
    finally:
        backend._capture.graphs = None
    rules = list((options or {}).get("rules", ()))
    return Explanation(
        [report(cg, rules) for cg in captured], backend.CACHE.fallbacks[fallbacks_before:]
    )
