"""Where a zoo model's ops would run on a GPU, found on a machine without one.

Each graph a zoo model (``bench/zoo.py``, tiny or full) hands to saturn on saturn:0 is also
imported as for a GPU target and compiled with the GPU machine model (inputs and outputs
on the device, as in a compiled call); nothing is generated or run for the GPU. Prints
per model the host ops the GPU program keeps (named by target, with dtype and shape) and
its crossings, and the compile stages' seconds: a quick check of placement work before
spending device time.

    python bench/gpu_plan.py [--dtype float32|bfloat16] [--size tiny|full] NAME ...
"""

from __future__ import annotations

import argparse
import copy
import time
from collections import Counter

import torch
import zoo


def plan(name: str, dtype: str, size: str) -> list[dict]:
    import saturn  # noqa: F401
    from saturn import backend
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    planned: list[dict] = []
    real = backend.compile_graph

    def also_for_gpu(graph, **kw):
        out = real(graph, **kw)
        gm = copy.deepcopy(also_for_gpu.gm)  # importing may annotate the graph module
        t = time.perf_counter()
        imported = import_graph(gm, replacements=True)
        t_import = time.perf_counter() - t
        t = time.perf_counter()
        c = real(imported.graph, **{**kw, "machine": "gpu", "io_on_device": True})
        host = Counter(
            f"{s.op.split('#')[0]} {s.dtype}{list(s.shape)}"
            for s in c.program.steps
            if s.kind == "host"
        )
        planned.append(
            {
                "ops": len(imported.graph.nodes),
                "host": host,
                "crossings": c.program.count("crossing"),
                "kernels": len(c.program.kernels),
                "import_s": t_import,
                "compile_s": time.perf_counter() - t,
            }
        )
        return out

    real_fx = backend.compile_fx

    def capture(gm, *a, **kw):
        also_for_gpu.gm = gm
        return real_fx(gm, *a, **kw)

    backend.compile_graph, backend.compile_fx = also_for_gpu, capture
    try:
        zoo.run_one(name, "saturn:0", dtype, size, repeats=1, baselines=False)
    finally:
        backend.compile_graph, backend.compile_fx = real, real_fx
    del compile_graph
    return planned


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--size", default="tiny", choices=["tiny", "full"])
    a = ap.parse_args()
    for name in a.names:
        torch._dynamo.reset()
        for i, p in enumerate(plan(name, a.dtype, a.size)):
            host = ", ".join(f"{k} x{v}" for k, v in sorted(p["host"].items())) or "-"
            print(
                f"{name} graph {i}: {p['ops']} ops, {p['kernels']} kernels, "
                f"{p['crossings']} crossings, import {p['import_s']:.2f} s, "
                f"compile {p['compile_s']:.2f} s; host [{host}]",
                flush=True,
            )


if __name__ == "__main__":
    main()
