"""Zoo models' graphs as the importer makes them for a GPU, kept as text and replayed through
the compiler core: what a change to saturation, extraction or lowering does to real models,
on a machine with no GPU.

``capture`` traces each model on the CPU (``torch.compile`` with saturn as the backend,
targeting saturn:1 without running it: every graph is imported for the GPU machine, written
out, and the model runs uncompiled) and writes ``<model>_<dtype>[_train]_<i>.graph``.
``replay`` compiles every graph file (``compile_graph``, machine gpu, inputs and outputs on
the device) and writes one JSON row per graph: ops, e-nodes, stop reason, program cost,
kernels, the digest of the program's text and each stage's seconds. ``compare`` prints two
replays side by side: the same digest means the same program.

    python bench/graph_corpus.py capture DIR --size full --dtypes float32,bfloat16 MODEL...
    python bench/graph_corpus.py capture DIR --size tiny --training MODEL...
    python bench/graph_corpus.py replay DIR OUT.json
    python bench/graph_corpus.py compare BEFORE.json AFTER.json

Graphs traced on the CPU hold the CPU's forms where they differ from a GPU's (an attention
backward dispatched to the CPU's flash kernel is an opaque op here).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_zoo():
    """bench/zoo.py as the module ``saturn_zoo`` (its child processes find it by that name)."""
    spec = importlib.util.spec_from_file_location("saturn_zoo", HERE / "zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    sys.modules["saturn_zoo"] = zoo
    spec.loader.exec_module(zoo)
    return zoo


def capture(out: Path, models: list[str], size: str, dtypes: list[str], training: bool) -> None:
    import torch

    from saturn import backend, gpu_stack
    from saturn.import_core import UnsupportedError

    zoo = load_zoo()
    out.mkdir(parents=True, exist_ok=True)
    state = {"stem": "", "i": 0}

    def write(graph, *_args, **_kwargs):
        path = out / f"{state['stem']}_{state['i']}.graph"
        state["i"] += 1
        path.write_text(graph.to_text())
        print(f"  {path.name}: {len(graph.nodes)} ops", flush=True)
        raise UnsupportedError("captured for bench/graph_corpus.py")  # run uncompiled

    saved = backend._target, gpu_stack.check_once, backend.compile_cached
    backend._target = lambda opts, inputs: torch.device("saturn", 1)  # import for a GPU
    gpu_stack.check_once = lambda: None
    backend.compile_cached = write
    try:
        for name in models:
            for dt in dtypes:
                state.update(stem=f"{name}_{dt}" + ("_train" if training else ""), i=0)
                torch._dynamo.reset()
                model, inputs = zoo.build(name, size)
                model, inputs = zoo.moved(model, inputs, "cpu", getattr(torch, dt))
                inputs = tuple(x[:1] for x in inputs)  # the graphs, not the batch, matter
                fn = torch.compile(model, backend="saturn")
                t = time.perf_counter()
                try:
                    if training:
                        zoo._first(fn(*inputs)).float().square().mean().backward()
                    else:
                        with torch.no_grad():
                            fn(*inputs)
                except Exception as e:  # the uncompiled run's own failure: graphs are written
                    print(f"  {name} {dt}: {type(e).__name__}: {str(e)[:120]}")
                print(f"{name} {dt}: {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        backend._target, gpu_stack.check_once, backend.compile_cached = saved


def replay(folder: Path, out: Path) -> None:
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph

    rows = {}
    for path in sorted(folder.glob("*.graph")):
        graph = parse_graph(path.read_text(), path.name)
        t = time.perf_counter()
        c = compile_graph(graph, machine="gpu", io_on_device=True)
        wall = time.perf_counter() - t
        text = c.program.to_text()
        rows[path.name] = {
            "ops": len(graph.nodes),
            "enodes": c.view.enode_count(),
            "stop": c.report.stop_reason,
            "cost": c.cost,
            "kernels": len(c.program.kernels),
            "host": c.program.count("host"),
            "digest": hashlib.sha256(text.encode()).hexdigest()[:16],
            "stages": {k: round(v, 3) for k, v in c.stages.seconds.items()},
            "seconds": round(wall, 3),
        }
        print(path.name, json.dumps(rows[path.name]), flush=True)
    out.write_text(json.dumps(rows, indent=1))


def compare(before: Path, after: Path) -> None:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    same = 0
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        same += x["digest"] == y["digest"]
        ex, ey = (r["stages"].get("extract", 0.0) for r in (x, y))
        print(
            f"{name:44s} {'same' if x['digest'] == y['digest'] else 'DIFFERS'}"
            f"  cost {x['cost']:.3f} -> {y['cost']:.3f}  extract {ex:.3f} -> {ey:.3f} s"
            f"  compile {x['seconds']:.2f} -> {y['seconds']:.2f} s"
        )
    print(f"{same} of {len(set(a) & set(b))} programs the same")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("dir", type=Path)
    c.add_argument("models", nargs="+")
    c.add_argument("--size", default="full", choices=("tiny", "full"))
    c.add_argument("--dtypes", default="float32,bfloat16")
    c.add_argument("--training", action="store_true")
    r = sub.add_parser("replay")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    m = sub.add_parser("compare")
    m.add_argument("before", type=Path)
    m.add_argument("after", type=Path)
    a = ap.parse_args()
    if a.cmd == "capture":
        capture(a.dir, a.models, a.size, a.dtypes.split(","), a.training)
    elif a.cmd == "replay":
        replay(a.dir, a.out)
    else:
        compare(a.before, a.after)


if __name__ == "__main__":
    main()
