"""Time saturation plus extraction of a transformer-like graph of about 1,000 nodes.

What is timed: ``compile_graph`` on a text graph of N encoder blocks (layer norm, QKV
projections, attention through bmm and softmax, output projection, residual, MLP with
tanh-GELU), default rulesets, the GPU cost model with inputs on the device; wall time of
each phase, median over repeats, on this machine (no GPU involved). The issue's target is
under 2 s for 1,000 nodes on the 2-core CI machine.

    python bench/eqsat_transformer.py [--blocks 16] [--repeats 3]
    python bench/eqsat_transformer.py --sweep 3 10 30 100 250   (growth with graph size)

``--sweep`` times each size (median of ``--repeats``) and fits the growth exponent of each
phase: the slope of log(time) against log(nodes), least squares over the sizes given.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from saturn.eqsat.costs import GPU
from saturn.eqsat.egraph import Saturation
from saturn.eqsat.extract import CostModel, infer_placement, infer_types
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.lowering import lower
from saturn.eqsat.materialise import extract_shared
from saturn.eqsat.pipeline import device_twin


def block(i: int, x: str, s: int, d: int, h: int) -> tuple[list[str], str]:
    p = f"b{i}_"
    dh = d // h
    lines = [
        f"(param {p}g1 f32 [{d}])",
        f"(param {p}be1 f32 [{d}])",
        f"(param {p}wq f32 [{d} {d}])",
        f"(param {p}bq f32 [{d}])",
        f"(param {p}wk f32 [{d} {d}])",
        f"(param {p}bk f32 [{d}])",
        f"(param {p}wv f32 [{d} {d}])",
        f"(param {p}bv f32 [{d}])",
        f"(param {p}wo f32 [{d} {d}])",
        f"(param {p}bo f32 [{d}])",
        f"(param {p}g2 f32 [{d}])",
        f"(param {p}be2 f32 [{d}])",
        f"(param {p}w1 f32 [{d} {4 * d}])",
        f"(param {p}b1 f32 [{4 * d}])",
        f"(param {p}w2 f32 [{4 * d} {d}])",
        f"(param {p}b2 f32 [{d}])",
        f"(let {p}ln1 (LayerNorm {x} {p}g1 {p}be1 [1] 1e-05))",
        f"(let {p}q (Addmm {p}bq {p}ln1 {p}wq))",
        f"(let {p}k (Addmm {p}bk {p}ln1 {p}wk))",
        f"(let {p}v (Addmm {p}bv {p}ln1 {p}wv))",
        f"(let {p}qh (Permute (View {p}q [{s} {h} {dh}]) [1 0 2]))",
        f"(let {p}kh (Permute (View {p}k [{s} {h} {dh}]) [1 2 0]))",
        f"(let {p}vh (Permute (View {p}v [{s} {h} {dh}]) [1 0 2]))",
        f"(let {p}sc (Mul (BatchMatMul {p}qh {p}kh) (Scalar {dh**-0.5} f32)))",
        f"(let {p}pr (Softmax {p}sc 2))",
        f"(let {p}at (BatchMatMul {p}pr {p}vh))",
        f"(let {p}ao (View (Permute {p}at [1 0 2]) [{s} {d}]))",
        f"(let {p}o (Addmm {p}bo {p}ao {p}wo))",
        f"(let {p}r1 (Add {x} {p}o))",
        f"(let {p}ln2 (LayerNorm {p}r1 {p}g2 {p}be2 [1] 1e-05))",
        f"(let {p}h1 (GeluTanh (Addmm {p}b1 {p}ln2 {p}w1)))",
        f"(let {p}h2 (Addmm {p}b2 {p}h1 {p}w2))",
        f"(let {p}out (Add {p}r1 {p}h2))",
    ]
    return lines, f"{p}out"


def transformer_text(blocks: int, s: int = 128, d: int = 256, h: int = 4) -> str:
    lines = [f"(input x f32 [{s} {d}])"]
    x = "x"
    for i in range(blocks):
        b, x = block(i, x, s, d, h)
        lines += b
    lines.append(f"(output {x})")
    return "\n".join(lines) + "\n"


def run_once(text: str) -> dict[str, float]:
    t0 = time.perf_counter()
    graph = parse_graph(text, "transformer")
    t1 = time.perf_counter()
    sat = Saturation(graph)
    report = sat.run()
    t2 = time.perf_counter()
    view = sat.snapshot()
    types = infer_types(view, graph)
    place = infer_placement(view)
    t3 = time.perf_counter()
    model = CostModel(GPU, types, place, io_on_device=True)
    roots = [device_twin(view, r, place) for r in view.outputs]
    best = extract_shared(view, model, roots)
    t4 = time.perf_counter()
    prog = lower(graph, view, best, types, place, roots, True)
    t5 = time.perf_counter()
    return {
        "nodes": len(graph.nodes),
        "enodes": view.enode_count(),
        "stop": report.stop_reason,
        "kernels": len(prog.kernels),
        "parse": t1 - t0,
        "saturate": t2 - t1,
        "analyse": t3 - t2,
        "extract": t4 - t3,
        "lower": t5 - t4,
        "total": t5 - t1,
    }


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(ys) against log(xs)."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def sweep(sizes: list[int], repeats: int) -> None:
    phases = ("saturate", "analyse", "extract", "lower", "total")
    rows = []
    for blocks in sizes:
        runs = [run_once(transformer_text(blocks)) for _ in range(repeats)]
        med = {p: statistics.median(r[p] for r in runs) for p in phases}
        r0 = runs[0]
        rows.append((r0["nodes"], med))
        print(
            f"{blocks:4d} blocks {r0['nodes']:6d} nodes {r0['enodes']:7d} e-nodes "
            f"({r0['stop']}): " + ", ".join(f"{p} {med[p]:.3f} s" for p in phases),
            flush=True,
        )
    nodes = [n for n, _ in rows]
    print("growth exponent (log-log slope over the sizes above):")
    for p in phases:
        print(f"  {p:9s} {slope(nodes, [m[p] for _, m in rows]):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep", type=int, nargs="+", help="block counts to time in turn")
    args = ap.parse_args()
    if args.sweep:
        sweep(args.sweep, args.repeats)
        return
    text = transformer_text(args.blocks)
    runs = [run_once(text) for _ in range(args.repeats)]
    r0 = runs[0]
    print(
        f"graph: {r0['nodes']} nodes ({args.blocks} blocks); e-graph {r0['enodes']} e-nodes; "
        f"saturation {r0['stop']}; {r0['kernels']} kernels"
    )
    for phase in ("parse", "saturate", "analyse", "extract", "lower", "total"):
        med = statistics.median(r[phase] for r in runs)
        print(f"  {phase:9s} median {med * 1e3:8.1f} ms over {args.repeats} runs")


if __name__ == "__main__":
    main()
