"""Two saturn trees under one zoo harness, one after the other on one machine: whether a
change moved the zoo's results (issue 30's "behaviour unchanged" check).

Each tree is installed in turn (editable, no dependencies) and runs *this* tree's
``bench/zoo.py`` (copied into the base tree, so both are timed the same way) with the
compile cache off; then this tree is installed again. The table gives per model: correct
in both, saturn's call time in each and their ratio, and eager's call time in each run
(the same eager code twice: the run-to-run noise to read saturn's ratio against). First
calls do not compare: the head's run finds on disk the kernel binaries both trees share.

    git archive BASE | tar -x -C /tmp/base          (where git is; carry it to a GPU machine)
    python bench/zoo_ab.py /tmp/base -- --device saturn:1 --size full --dtype float32 \\
        --baselines eager --jobs 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install(tree: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--no-index", "-e", str(tree)], check=True, cwd=tree)


def run(tree: Path, zoo_args: list[str], out: Path, timeout: float) -> list[dict]:
    """The zoo's rows for ``tree`` (``[]`` when its run wrote none)."""
    env = dict(os.environ, SATURN_COMPILE_CACHE="0")
    cmd = [sys.executable, str(tree / "bench" / "zoo.py"), *zoo_args, "--json", str(out)]
    try:
        subprocess.run(cmd, cwd=tree, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"{tree}: stopped after {timeout:.0f} s; the rows written so far are compared")
    return json.loads(out.read_text()) if out.exists() else []


def table(base: list[dict], head: list[dict]) -> str:
    """Per model both runs' figures; the geomean of saturn's head/base call times."""
    b = {r["model"]: r for r in base}
    lines = ["model | correct | saturn ms base / head | head/base | eager ms base / head"]
    ratios = []
    for r in head:
        o = b.get(r["model"])
        if o is None:
            lines.append(f"{r['model']} | base has no row")
            continue
        ok = f"{bool(o.get('correct'))} / {bool(r.get('correct'))}"
        if "saturn_s" not in o or "saturn_s" not in r:
            lines.append(f"{r['model']} | {ok} | not timed in both")
            continue
        ratio = r["saturn_s"] / o["saturn_s"]
        ratios.append(ratio)
        eager = (
            f"{o['eager_s'] * 1e3:.2f} / {r['eager_s'] * 1e3:.2f}"
            if "eager_s" in o and "eager_s" in r
            else "-"
        )
        lines.append(
            f"{r['model']} | {ok} | {o['saturn_s'] * 1e3:.2f} / {r['saturn_s'] * 1e3:.2f} | "
            f"{ratio:.3f} | {eager}"
        )
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"geomean head/base over {len(ratios)} models: {geo:.3f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path, help="the other tree (git archive of a commit)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per tree's run")
    ap.add_argument("--out", type=Path, default=None, help="folder for both runs' rows")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    zoo_args = argv[cut + 1 :]  # bench/zoo.py's own
    base = a.base.resolve()
    for name in ("zoo.py", "zoo_training.py"):  # one harness for both trees
        shutil.copy(ROOT / "bench" / name, base / "bench" / name)
    out = (a.out or Path(tempfile.mkdtemp(prefix="zoo-ab-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    try:
        for label, tree in (("base", base), ("head", ROOT)):
            install(tree)
            rows[label] = run(tree, zoo_args, out / f"{label}.json", a.timeout)
    finally:
        install(ROOT)
    print(table(rows["base"], rows["head"]))


if __name__ == "__main__":
    main()
