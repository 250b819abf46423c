"""What a rule file buys on zoo models: each model compiled by saturn twice, with saturn's
rules alone and with the extra rule files too, on one device; both programs' kernels, the
extra rules' matches, each variant's error against eager float32, and per-call times
(medians of interleaved rounds: a call of one variant, then one of the other, each
followed by a device synchronize, so drift on the machine falls on both alike).

    python bench/rule_effect.py --rules notebooks/rules/rotary_cache.egg \\
        --device saturn:1 --size full --dtype float32 Qwen2Model MistralModel

Prints one line per model and, with ``--json``, writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from graph_corpus import load_zoo  # noqa: E402 (beside this file)


def _program(backend, before: set) -> tuple[int, dict[str, int]]:
    """Kernels of the graphs compiled since ``before`` and the matches of every rule."""
    kernels, matches = 0, {}
    for key, item in backend.CACHE.items.items():
        if key in before or getattr(item, "compiled", None) is None:
            continue
        kernels += len(item.compiled.program.kernels)
        for rule, n in item.compiled.report.rule_totals().items():
            matches[rule] = matches.get(rule, 0) + n
    return kernels, matches


def run_one(name: str, rules: list[str], device: str, dtype: str, size: str, rounds: int) -> dict:
    import torch

    import saturn  # noqa: F401
    from saturn import backend
    from saturn.eqsat.check import read_rules

    zoo = load_zoo()
    model, inputs = zoo.build(name, size)
    gpu = device != "saturn:0"
    with torch.no_grad():
        m32, x32 = zoo.moved(model, inputs, "cuda" if gpu else "cpu", torch.float32)
        want = zoo._first(m32(*x32)).float().cpu()
    scale = max(want.abs().max().item(), 1e-30)
    m, x = zoo.moved(model, inputs, device, getattr(torch, dtype))
    sync = (lambda: torch.saturn.synchronize(device)) if gpu else (lambda: None)
    extra = {r.name for f in rules for r in read_rules(Path(f))[0]}
    row: dict = {"model": name, "device": device, "dtype": dtype, "size": size}
    fns = {}
    torch._dynamo.reset()
    # both variants stay compiled side by side (Dynamo keeps an entry per backend); a reset
    # between them would make every later call of the first trace again
    for variant, options in (("without", {}), ("with", {"rules": rules})):
        before = set(backend.CACHE.items)
        fn = torch.compile(m, backend="saturn", options=options, dynamic=False)
        with torch.no_grad():
            got = zoo._first(fn(*x)).float().cpu()
        kernels, matches = _program(backend, before)
        row[f"{variant}_kernels"] = kernels
        row[f"{variant}_error"] = (got - want).abs().max().item() / scale
        if variant == "with":
            row["matches"] = {r: n for r, n in sorted(matches.items()) if r in extra and n}
        fns[variant] = fn
    times: dict[str, list[float]] = {"without": [], "with": []}
    compiled = set(backend.CACHE.items)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for _ in range(3):  # warm both (CUDA-graph capture, caches)
            for fn in fns.values():
                fn(*x)
        sync()
        for _ in range(rounds):
            for variant, fn in fns.items():
                sync()
                t = time.perf_counter()
                fn(*x)
                sync()
                times[variant].append(time.perf_counter() - t)
    for variant, ts in times.items():
        row[f"{variant}_s"] = statistics.median(ts)
    # graphs traced or compiled while timing: none, or the times include compiles
    row["recompiles"] = len(set(backend.CACHE.items) - compiled) + (
        torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rules", action="append", required=True, help="an extra .egg file")
    ap.add_argument("--device", default="saturn:1")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--size", default="full", choices=("tiny", "full"))
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for name in args.models:
        row = run_one(name, args.rules, args.device, args.dtype, args.size, args.rounds)
        rows.append(row)
        print(
            f"{name:20s} {args.dtype} kernels {row['without_kernels']} -> {row['with_kernels']}"
            f"  per call {row['without_s'] * 1e6:.1f} -> {row['with_s'] * 1e6:.1f} us"
            f"  error {row['without_error']:.1e} / {row['with_error']:.1e}"
            f"  matches {row['matches']}  recompiles {row['recompiles']}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
