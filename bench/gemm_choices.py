"""Which cuBLASLt algorithm each float32 product of a zoo model's compiled call chose, and
what every candidate costs when run the way a replay runs it (on a GPU machine).

A compiled call times cuBLASLt's heuristic candidates once per distinct product
(``codegen/gemm.GemmPlan``: nvmath's autotune, each candidate run alone after an L2
flush from host memory) and keeps the fastest, in memory and on disk
(``codegen/gemm_tuning``). Here, after one compiled step (``--training``: the zoo's
training step; otherwise an inference call), every product plan is listed with how often
it runs per call, its chosen tile and its device time back to back
(``gemm.time_on_stream``: the stream held by a spin kernel while ten calls are enqueued,
CUDA events around them, operands warm in L2 as in a replay). For each plan that timed
its candidates, every candidate's back-to-back time follows, in nvmath's order; the last
line sums, per call, what the chosen algorithms lose against each product's fastest
candidate back to back.

``--fresh`` times every choice anew in this process (``SATURN_COMPILE_CACHE=0``: choices
and compiled graphs neither read from disk nor stored; the C++ extension and the kernels'
cubins are still found there); without it the choices on disk from earlier processes are
reused, as a warm process would.

    python bench/gemm_choices.py [--training] [--fresh] [--size full|tiny] NAME ...
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--training", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="time every choice anew")
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    a = ap.parse_args()
    if a.fresh:
        os.environ["SATURN_COMPILE_CACHE"] = "0"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import zoo
    import zoo_training

    import saturn  # noqa: F401
    from saturn.codegen import gemm

    plans: list = []
    made = gemm.GemmPlan.__init__

    def kept(self, *args, **kw):
        made(self, *args, **kw)
        plans.append(self)

    gemm.GemmPlan.__init__ = kept
    gpu = "saturn:1"
    sync = lambda: torch.saturn.synchronize(gpu)  # noqa: E731
    for name in a.names:
        plans.clear()
        torch._dynamo.reset()
        model, inputs = zoo.build(name, a.size)
        m, xs = zoo.moved(model, inputs, gpu, torch.float32)
        if a.training:
            opt = torch.optim.SGD(m.parameters(), lr=zoo_training.LR)
            step = zoo_training.Step(m, opt, zoo._first, zoo_training.saturn_compile)
            step(xs)
        else:
            with torch.no_grad():
                torch.compile(m, backend="saturn", dynamic=False)(*xs)
        sync()
        print(f"== {name} ({'training step' if a.training else 'inference'})", flush=True)
        report(plans)


def report(plans: list) -> None:
    from saturn.codegen.gemm import time_on_stream

    def b2b(plan, algorithm=None) -> float:
        if algorithm is None:
            return time_on_stream(lambda: plan.run(plan._ptrs), plan.stream, 10)
        run = lambda: plan.mm.execute(algorithm=algorithm, stream=plan.stream)  # noqa: E731
        return time_on_stream(run, plan.stream, 10)

    def tile(plan):
        return getattr(plan.mm.algorithms[0], "tile", None) if plan.mm.algorithms else None

    # plans of one product whose operands' alignments differ may hold different choices
    groups: dict[tuple, list] = defaultdict(list)
    for p in plans:
        a, b, out, _ = p.layouts
        groups[(a, b, out, p.epilogue, p.blas is not None, p.precision, tile(p))].append(p)
    lost = 0.0
    rows = []
    for (a, b, out, epi, blas, precision, tile_), ps in groups.items():
        p = ps[0]
        chosen = b2b(p)
        # the plan of this product that timed the candidates (later ones took its choice)
        timed = next((q for q in ps if len(q.mm.algorithms) > 1), None)
        cands = [] if timed is None else [(x, b2b(timed, x)) for x in timed.mm.algorithms]
        lost += len(ps) * max(0.0, chosen - min((t for _, t in cands), default=chosen))
        how = "cuBLAS" if blas else f"tile {tile_}"
        head = f"a{list(a.shape)}{list(a.strides)} b{list(b.shape)}{list(b.strides)}"
        rows.append(
            (
                len(ps) * chosen,
                len(ps),
                chosen,
                f"{head} out{list(out.shape)}",
                epi,
                precision,
                how,
                cands,
            )
        )
    rows.sort(key=lambda r: -r[0])
    for _, n, chosen, what, epi, precision, how, cands in rows:
        print(f"  x{n:<3d} {1e3 * chosen:8.1f} us  {what} {epi} {precision} {how}")
        for i, (alg, t) in enumerate(cands):
            print(f"        #{i} tile {getattr(alg, 'tile', None)}: {1e3 * t:8.1f} us")
    print(f"  chosen against the fastest candidate back to back: {1e3 * lost:.1f} us per call")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
