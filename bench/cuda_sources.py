"""Every CUDA source the emitter writes for the kernels of the golden graphs, compiled for
the GPU machine (no GPU needed), at every lane count and index width ``generate`` offers,
with the rows kernels' constants at their defaults and at the simulator's variants; prints
the digest of the whole text. Run it before and after a change to the emitters: the same
digest means byte-identical kernels (and the same cubins from the cache on disk).

    python bench/cuda_sources.py [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
from pathlib import Path

from saturn.codegen import cuda as cg
from saturn.codegen import cuda_rows
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

ROOT = Path(__file__).resolve().parents[1]
# (ROWS_WARP_MIN, ROW_REGISTERS, ROW_CACHE_BYTES): the defaults, then each turned off
ROWS_VARIANTS = [(4096, 64, 8192), (0, 64, 8192), (4096, 0, 8192), (4096, 64, 0)]


def sources() -> list[str]:
    graphs = sorted((ROOT / "tests/eqsat/golden").glob("*.graph"))
    graphs += sorted((ROOT / "tests/eqsat/cases").glob("*.graph"))
    kernels = []
    for path in graphs:
        try:
            c = compile_graph(parse_graph(path.read_text()), machine="gpu", io_on_device=True)
        except Exception:  # a golden graph that is an expected error
            continue
        kernels += [(path.name, s.kernel) for s in c.program.steps if s.kind == "kernel"]
    out = []
    default = (cuda_rows.ROWS_WARP_MIN, cuda_rows.ROW_REGISTERS, cuda_rows.ROW_CACHE_BYTES)
    try:
        for variant in ROWS_VARIANTS:
            cuda_rows.ROWS_WARP_MIN, cuda_rows.ROW_REGISTERS, cuda_rows.ROW_CACHE_BYTES = variant
            for (name, k), lanes, narrow in itertools.product(
                kernels, (None, 1, 2, 4, 8), (False, True)
            ):
                head = f"{name} {variant} lanes={lanes} narrow={narrow}"
                try:
                    out.append(f"{head}\n{cg.generate(k, lanes=lanes, narrow=narrow).source}")
                except Exception as e:  # a variant the kernel does not take
                    out.append(f"{head} refused: {type(e).__name__}")
    finally:
        cuda_rows.ROWS_WARP_MIN, cuda_rows.ROW_REGISTERS, cuda_rows.ROW_CACHE_BYTES = default
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="also write the sources to this file")
    a = ap.parse_args()
    text = "\n".join(out := sources())
    if a.out:
        Path(a.out).write_text(text)
    print(f"{len(out)} sources, sha256 {hashlib.sha256(text.encode()).hexdigest()}")


if __name__ == "__main__":
    main()
