"""What reading inputs fresh and owning outputs as eager does cost saturn on the blocks of
`bench/blocks.py` (docs/decisions/0049): saturn only, float32, inference (no_grad), weights
and inputs on the device (a model moved with ``.to("saturn:1")``, as users run it).

Run it from two trees on one machine in one session (the tree before the change and
after it) and compare the rows. What is timed, per workload, after warm-up calls (the
same as bench/blocks.py):
  call   wall time of one call including a device synchronize after it, median of REPEATS
  host   wall time until the call returns, without waiting for the device, median
and, from the recipe of the last call: crossings (host-device copies per call, inputs
included), outputs given memory of their own, and the CUDA-graph replays of the timed
calls (a replay reads the inputs where they are: a copy would show as a crossing).

    python bench/freshness.py [workload ...]        (on a GPU machine)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

import saturn
from saturn import backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.compile.blocks import WORKLOADS, make

GPU = "saturn:1"
REPEATS = 100


def timed(fn, x) -> tuple[float, float]:
    sync = lambda: torch.saturn.synchronize(GPU)  # noqa: E731
    for _ in range(5):
        fn(x)
    sync()
    calls, hosts = [], []
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter()
        fn(x)
        t1 = time.perf_counter()
        sync()
        hosts.append(t1 - t0)
        calls.append(time.perf_counter() - t0)
    return statistics.median(calls) * 1e6, statistics.median(hosts) * 1e6


def main(names: list[str]) -> None:
    print(f"saturn from {Path(saturn.__file__).parent}, torch {torch.__version__}")
    head = ("workload", "call us", "host us", "crossings", "owned", "replays")
    print(f"{head[0]:22s} {head[1]:>9s} {head[2]:>9s} {head[3]:>9s} {head[4]:>6s} {head[5]:>8s}")
    for name in names:
        model, x = make(name)
        torch._dynamo.reset()
        before = backend.CACHE.compiles
        with torch.no_grad():
            fn = torch.compile(model.to(GPU), backend="saturn", dynamic=False)
            xs = x.to(GPU)
            fn(xs)
            items = list(backend.CACHE.items.values())[-(backend.CACHE.compiles - before) :]
            (recipe,) = [cg.recipe for cg in items]
            runner = recipe.runner
            replays0 = runner.replays
            call, host = timed(fn, xs)
        last = recipe.last
        owned = getattr(last, "outputs_copied", "-")
        print(
            f"{name:22s} {call:9.1f} {host:9.1f} {last.crossings:9d} {owned!s:>6s} "
            f"{runner.replays - replays0:8d}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or list(WORKLOADS))
