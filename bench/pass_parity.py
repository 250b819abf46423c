"""A GPU pass's effect on values, on real graphs, with no GPU: each graph a zoo model hands
saturn (tiny size, on saturn:0) is compiled for the GPU machine twice, with the pipeline as
it is and with the named passes left out, and both programs run by the numpy reference
evaluator (``eqsat.evaluate.eval_program``) on the same random inputs (integers 0 or 1,
so any index is in range). Prints per graph the values the passes write beside a kernel
(``row_stat`` steps gained), the launches saved, and whether every output is bit for bit
the same (else the largest difference).

    python bench/pass_parity.py [--without group_loops merge_siblings ...] [--training]
        [--dtype float32] NAME ...
"""

from __future__ import annotations

import argparse

import gpu_plan
import numpy as np

BINARY = {"bool", "i8", "u8", "i16", "i32", "i64"}


def inputs_for(graph, rng) -> dict | None:
    from saturn.eqsat import evaluate as ev

    out = {}
    for n in graph.inputs():
        if n.dtype == "bool":
            out[n.name] = rng.random(n.shape) < 0.5
        elif n.dtype in BINARY:
            out[n.name] = rng.integers(0, 2, size=n.shape).astype(ev.np_dtype(n.dtype))
        elif n.dtype in ("f16", "f32", "f64"):
            out[n.name] = rng.standard_normal(n.shape).astype(ev.np_dtype(n.dtype))
        else:
            return None  # bfloat16: no numpy type
    return out


def compare(a: list, b: list) -> str:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if np.array_equal(x, y, equal_nan=True):
            continue
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        worst = max(worst, float(np.nanmax(d)) if d.size else 0.0)
    return "equal" if worst == 0.0 else f"differ by up to {worst:.3g}"


def parity(name: str, without: list[str], dtype: str, training: bool) -> list[str]:
    from saturn.eqsat import evaluate as ev
    from saturn.eqsat import pipeline
    from saturn.eqsat.kinds import facts

    rows: list[str] = []

    def launches(prog) -> int:
        return sum(not facts(k.kind).side for k in prog.kernels)

    def visit(graph, kw):
        kw.pop("import_s")
        kept = pipeline.compile_graph(graph, **kw).program
        saved = {p: getattr(pipeline, p) for p in without}
        for p in without:
            setattr(pipeline, p, lambda prog: prog)
        try:
            apart = pipeline.compile_graph(graph, **kw).program
        finally:
            for p, f in saved.items():
                setattr(pipeline, p, f)
        side = kept.count("kernel") - launches(kept) - (apart.count("kernel") - launches(apart))
        line = f"{name} graph {len(rows)}: {side} values beside, "
        line += f"launches {launches(apart)} -> {launches(kept)}, "
        inputs = inputs_for(graph, np.random.default_rng(0))
        if inputs is None:
            rows.append(line + "not evaluated (bfloat16)")
            return
        with np.errstate(all="ignore"):
            verdict = compare(ev.eval_program(apart, inputs), ev.eval_program(kept, inputs))
        rows.append(line + verdict)

    gpu_plan.each_graph(name, dtype, "tiny", visit, training=training)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--without", nargs="+", default=["group_loops", "merge_siblings"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--training", action="store_true")
    args = ap.parse_args()
    for name in args.names:
        for row in parity(name, args.without, args.dtype, args.training):
            print(row, flush=True)


if __name__ == "__main__":
    main()
