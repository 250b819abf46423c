"""Which cuBLASLt algorithm each float32 product of a zoo model's compiled call chose, and
what every candidate costs when run the way a replay runs it (on a GPU machine).

A compiled call times cuBLASLt's heuristic candidates once per distinct product
(``codegen/gemm.GemmPlan``, timed as ``SATURN_GEMM_TUNE`` says: nvmath's autotune by
default, each candidate run alone after an L2 flush, or back to back) and keeps the fastest,
in memory and on disk (``codegen/gemm_tuning``). Here, after one compiled step
(``--training``: the zoo's training step; otherwise an inference call), every product
plan is listed with how often
it runs per call, its chosen tile and its device time back to back
(``gemm.time_on_stream``: the stream held by a spin kernel while ten calls are enqueued,
CUDA events around them, operands warm in L2 as in a replay), then ``torch.matmul``'s
time for operands of the same layouts on CUDA (cuBLAS's own choice, what eager and
Inductor's default mode call), then every cuBLASLt heuristic candidate's back-to-back
time in the heuristic's order (planned again, untimed); the last
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


def torch_time(a, b) -> float:
    """Device ms per ``torch.matmul`` (cuBLAS's own choice, as eager and Inductor's
    default call it) of operands with ``a``'s and ``b``'s shapes and strides on CUDA,
    back to back: ten calls between CUDA events after two warm ones."""
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]

    def operand(lay):
        n = 1 + sum((d - 1) * s for d, s in zip(lay.shape, lay.strides, strict=True))
        return torch.randn(n, device="cuda", dtype=dt).as_strided(lay.shape, lay.strides)

    x, y = operand(a), operand(b)
    for _ in range(2):
        torch.matmul(x, y)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.matmul(x, y)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 10


def candidates(plan):
    """A plan of ``plan``'s product over its last call's operands holding all of cuBLASLt's
    heuristic candidates, none timed (None for cuBLAS's own choice and tf32x3 plans)."""
    from saturn.codegen.gemm import GemmPlan

    if plan.blas is not None or plan.precision != "fp32" or plan._ptrs is None:
        return None
    a, b, out, bias = plan.layouts
    gelu = "separate" if plan.gelu_separate else "fused"
    return GemmPlan(a, b, out, plan.epilogue, bias, plan._ptrs, plan.stream,
                    autotune=False, choose=False, gelu=gelu)  # fmt: skip


def report(plans: list) -> None:
    from saturn.codegen.gemm import time_on_stream
    from saturn.codegen.gemm_tuning import alignment

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
        aligned = tuple(alignment(x) for x in p._ptrs[:3]) if p._ptrs else ()
        groups[(a, b, out, p.epilogue, p.blas is not None, p.precision, tile(p), aligned)].append(p)
    lost = 0.0
    rows = []
    for (a, b, out, epi, blas, precision, tile_, aligned), ps in groups.items():
        p = ps[0]
        chosen = b2b(p)
        # every candidate cuBLASLt's heuristic lists for this product, in its order (a plan
        # made again, untimed: a timed plan keeps its choice alone)
        listed = candidates(p)
        cands = [] if listed is None else [(x, b2b(listed, x)) for x in listed.mm.algorithms]
        lost += len(ps) * max(0.0, chosen - min((t for _, t in cands), default=chosen))
        how = "cuBLAS" if blas else f"tile {tile_}"
        head = f"a{list(a.shape)}{list(a.strides)} b{list(b.shape)}{list(b.strides)} align{aligned}"
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
        print(f"        torch.matmul on CUDA: {1e3 * torch_time(*ps[0].layouts[:2]):8.1f} us")
        for i, (alg, t) in enumerate(cands):
            print(f"        #{i} tile {getattr(alg, 'tile', None)}: {1e3 * t:8.1f} us")
    print(f"  chosen against the fastest candidate back to back: {1e3 * lost:.1f} us per call")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
