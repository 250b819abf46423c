"""Where a zoo model's ops would run on a GPU, found on a machine without one.

Each graph a zoo model (``bench/zoo.py``, tiny or full) hands to saturn on saturn:0 is also
imported as for a GPU target and compiled with the GPU machine model (inputs and outputs
on the device, as in a compiled call); nothing is generated or run for the GPU. Prints
per model the host ops the GPU program keeps (named by target, with dtype and shape) and
its crossings, the compile stages' seconds, and the kernel variants its runner builds
before the first call (with ``--build``, the seconds building them takes here, in
parallel as a first call builds them; that needs no GPU): a quick check of placement and
compile-time work before spending device time. ``--views`` lists the view steps that
copy at every call (a reshape whose source it cannot view: ``saturn.view_copies``).

    python bench/gpu_plan.py [--dtype float32|bfloat16] [--size tiny|full] [--build]
        [--kinds] [--views] [--list] [--rewrites RULESET ...] [--training] NAME ...
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from collections import Counter

import torch
import zoo


def kernel_sources(program) -> list:
    """The variants of every generated kernel of a GPU program its runner builds before
    the first call (``CudaKernel.expected``, concatenations and pads)."""
    from saturn.codegen import cuda as cg

    out = []
    for s in program.steps:
        k = s.kernel
        if s.kind != "kernel":
            continue
        if k.kind in ("loop", "reduce", "rows"):
            out += cg.CudaKernel(k, (9, 0)).expected()
        elif k.kind == "concat":
            a = k.inputs[0]
            width, rank, dim = cg.MEMORY_SIZE[a.dtype], len(a.shape), k.attrs["dim"]
            out += cg.ConcatKernel(width, rank, dim, (9, 0), len(k.inputs)).expected()
        elif k.kind == "pad":
            x = k.inputs[0]
            out.append(cg.generate_pad(cg.MEMORY_SIZE[x.dtype], len(x.shape)))
        elif k.kind == "roll":
            from saturn.codegen.roll import RollLauncher

            out += RollLauncher(k, (9, 0)).expected()
    return out


def build_seconds(gens: list) -> float:
    """Wall time of building ``gens`` as a first call does (``cubins.precompile``, worker
    processes over this machine's cores) into an empty cache: PTX and cubins need no GPU."""
    from saturn.codegen import cubins

    old = os.environ.get("SATURN_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SATURN_CACHE_DIR"] = tmp
        try:
            t = time.perf_counter()
            cubins.precompile(gens, (9, 0))
            return time.perf_counter() - t
        finally:
            if old is None:
                del os.environ["SATURN_CACHE_DIR"]
            else:
                os.environ["SATURN_CACHE_DIR"] = old


def each_graph(
    name: str,
    dtype: str,
    size: str,
    visit,
    rewrites: tuple[str, ...] = (),
    training: bool = False,
) -> None:
    """Run zoo model ``name`` once on saturn:0 and call ``visit(graph, kw)`` with each graph
    it hands saturn, imported as for a GPU target (``kw``: the compile's options, for
    ``compile_graph`` with ``machine="gpu", io_on_device=True`` added)."""
    import saturn  # noqa: F401
    from saturn import backend, sdpa
    from saturn.importer import import_graph

    real, real_fx = backend.compile_cached, backend.compile_fx

    def also_for_gpu(graph, **kw):
        out = real(graph, **kw)
        gm = copy.deepcopy(also_for_gpu.gm)  # importing may annotate the graph module
        t = time.perf_counter()
        imported = import_graph(gm, replacements=True)
        kw = {**kw, "machine": "gpu", "io_on_device": True, "import_s": time.perf_counter() - t}
        visit(imported.graph, kw)
        return out

    def capture(gm, *a, **kw):
        also_for_gpu.gm = gm
        return real_fx(gm, *a, **kw)

    # attention traced as for a GPU with cuDNN: the fused op wherever its layouts are taken.
    # Half types only: float32 attention is one step on a GPU too (decision 0115), but the
    # device's choice (csrc/attention.cpp) keeps aten's math on saturn:0, where this plans,
    # so float32 plans here show the math's products and softmax instead
    real_device = sdpa.on_fused_device
    backend.compile_cached, backend.compile_fx = also_for_gpu, capture
    sdpa.on_fused_device = lambda *ts: True
    try:
        zoo.run_one(
            name,
            "saturn:0",
            dtype,
            size,
            repeats=1,
            baselines="none",
            rewrites=rewrites,
            training=training,
        )
    finally:
        backend.compile_cached, backend.compile_fx = real, real_fx
        sdpa.on_fused_device = real_device


def plan(
    name: str,
    dtype: str,
    size: str,
    ptx: bool = False,
    rewrites: tuple[str, ...] = (),
    training: bool = False,
) -> list[dict]:
    from saturn.eqsat.kinds import facts
    from saturn.eqsat.pipeline import compile_graph
    from saturn.view_copies import view_copies

    planned: list[dict] = []

    def visit(graph, kw):
        t_import = kw.pop("import_s")
        t = time.perf_counter()
        c = compile_graph(graph, **kw)
        compile_s = time.perf_counter() - t
        host = Counter(
            f"{s.op.split('#')[0]} {s.dtype}{list(s.shape)}"
            for s in c.program.steps
            if s.kind == "host"
        )
        gens = kernel_sources(c.program)
        distinct = {g.source for g in gens}
        built = build_seconds(gens) if ptx else None
        planned.append(
            {
                "generated": len(gens),
                "distinct": len(distinct),
                "build_s": built,
                "ops": len(graph.nodes),
                "host": host,
                "crossings": c.program.count("crossing"),
                # launched: a value written beside a kernel launches nothing
                "kernels": sum(not facts(k.kind).side for k in c.program.kernels),
                "custom": sum(k.kind == "custom" for k in c.program.kernels),
                "kinds": Counter(k.kind for k in c.program.kernels),
                "view_copies": view_copies(c.program),
                "list": [
                    f"{k.kind:9} {k.dtype}{list(k.shape)} <- "
                    + ", ".join(f"{o.dtype}{list(o.shape)}" for o in k.inputs)
                    + f"  [{' '.join(k.covers[:6])}{' ...' if len(k.covers) > 6 else ''}]"
                    + (f" fused {len(k.fused)}" if k.fused else "")
                    for k in c.program.kernels
                ],
                "import_s": t_import,
                "compile_s": compile_s,
            }
        )

    each_graph(name, dtype, size, visit, rewrites, training)
    return planned


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--size", default="tiny", choices=["tiny", "full"])
    ap.add_argument(
        "--build", action="store_true", help="also time building the kernels (no GPU needed)"
    )
    ap.add_argument("--kinds", action="store_true", help="also count the kernels by kind")
    ap.add_argument(
        "--views", action="store_true", help="also list the views that copy at every call"
    )
    ap.add_argument(
        "--list", action="store_true", help="also list every kernel: kind, shapes, nodes"
    )
    ap.add_argument("--rewrites", nargs="*", default=[], help="saturn's opt-in rulesets")
    ap.add_argument(
        "--training",
        action="store_true",
        help="plan a training step's graphs (forward and backward, bench/zoo_training.py)",
    )
    a = ap.parse_args()
    if a.training and a.rewrites:
        ap.error("--rewrites applies to inference; a training step compiles with the defaults")
    for name in a.names:
        torch._dynamo.reset()
        for i, p in enumerate(plan(name, a.dtype, a.size, a.build, tuple(a.rewrites), a.training)):
            host = ", ".join(f"{k} x{v}" for k, v in sorted(p["host"].items())) or "-"
            print(
                f"{name} graph {i}: {p['ops']} ops, {p['kernels']} kernels "
                f"({p['custom']} custom), "
                f"{p['crossings']} crossings, import {p['import_s']:.2f} s, "
                f"compile {p['compile_s']:.2f} s; {p['generated']} generated kernels, "
                f"{p['distinct']} distinct"
                + (f", built in {p['build_s']:.1f} s" if p["build_s"] is not None else "")
                + f"; host [{host}]",
                flush=True,
            )
            if a.kinds:
                print("  kinds: " + ", ".join(f"{k} {v}" for k, v in p["kinds"].most_common()))
            if a.list:
                for line in p["list"]:
                    print("    " + line)
            if a.views:
                print(f"  views copying at every call: {len(p['view_copies'])}")
                for line in p["view_copies"]:
                    print("    " + line)


if __name__ == "__main__":
    main()
