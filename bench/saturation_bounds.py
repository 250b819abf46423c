"""How close saturation's time bound holds: many saturations of rule sets that never stop,
each timed (``Saturation.run`` only, wall clock), reported as how far past (+) or short of
(-) its bound each ended.

Rule sets (those of tests/eqsat/test_bounds.py): ``explode``, commutativity, associativity
and distributivity on a 12-term sum of products; ``grow``, an analysis rule that adds an
``Exp`` above every ``Exp``. Bounds 0.5, 1 and 2 s. ``--busy N`` starts N processes that
spin beside the runs (a loaded machine: a CI machine runs two test workers on two cores).

    python bench/saturation_bounds.py --runs 60 [--busy 1]

Figures are in docs/decisions/0053-saturation-bounds-that-hold.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "eqsat"))

import test_bounds as tb

from saturn.eqsat.egraph import Bounds

GROW_GRAPH = "(input x f32 [4])\n(let r (Exp x))\n(output r)\n"


def _spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="saturations per bound (a third at 2 s)")
    ap.add_argument("--busy", type=int, default=0, help="spinning processes beside the runs")
    a = ap.parse_args()
    busy = [mp.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for p in busy:
        p.start()
    with tempfile.TemporaryDirectory() as d:
        explode, grow = Path(d) / "explode.egg", Path(d) / "grow.egg"
        explode.write_text(tb.EXPLODE)
        grow.write_text(tb.GROW)
        cases = {
            "explode": (tb.sum_of_products(), explode, 10_000),
            "grow": (GROW_GRAPH, grow, 12),
        }
        print(f"busy processes: {a.busy}; (wall / bound - 1) per saturation")
        for name, (text, rules, iterations) in cases.items():
            for seconds in (0.5, 1.0, 2.0):
                n = a.runs if seconds < 2 else max(1, a.runs // 3)
                over = []
                for _ in range(n):
                    bounds = Bounds(iterations, tb.HUGE, seconds)
                    _, wall = tb.saturate(text, [rules], bounds)
                    over.append(wall / seconds - 1)
                print(
                    f"{name:8} {seconds:4} s  runs {n:3}  median {statistics.median(over):+.3f}"
                    f"  max {max(over):+.3f}  min {min(over):+.3f}"
                    f"  past 10%: {sum(o > 0.1 for o in over)}",
                    flush=True,
                )
    for p in busy:
        p.terminate()


if __name__ == "__main__":
    main()
