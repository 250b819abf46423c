"""CUDA loop groups: small elementwise loops run by one launch (``eqsat/horizontal.py``
``group_loops``). The kernel's own loop writes ``out`` over ``n`` elements, then each
loop beside it (``attrs["stats"]``, over ``attrs["segments"]``) writes ``stat{j}`` over
``n{j + 1}``: each a grid-stride loop of scalar accesses, one after the other in every
thread, so a thread's work is the sum of the loops' shares and the launch is one."""

from __future__ import annotations

import math

from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import Kernel, Operand, leaves

from .cuda_reads import _operand_reads, compute_dtype, store_expr, stored_body
from .expr import BodyWriter
from .generated import Params

WIDTH = {1: "u8", 2: "i16", 4: "i32", 8: "i64"}  # bit for bit: an integer of each width


def copy_group(sizes: list[tuple[int, int]]) -> Kernel:
    """A loop group copying packed values of ``(element width, elements)`` each, bit for
    bit: the first to its output, the others to the values written beside it (a GPU call's
    input writes, ``device/runner_writes.py``)."""
    dtypes = [WIDTH[w] for w, _ in sizes]
    inputs = [Operand(f"src{j}", dtypes[j], (n,), "same") for j, (_, n) in enumerate(sizes)]
    n0 = sizes[0][1]
    attrs = {
        "stats": tuple((("in", j), dtypes[j]) for j in range(1, len(sizes))),
        "segments": tuple((n,) for _, n in sizes[1:]),
    }
    return Kernel(Kind.LOOP, "dst0", dtypes[0], (n0,), inputs, ("in", 0), (n0,), attrs)


def is_group(k: Kernel) -> bool:
    return "segments" in k.attrs


def group_sizes(k: Kernel) -> dict[str, int]:
    """The element counts a launch passes: ``n`` for the kernel's own loop, ``n1``, ...
    for the loops beside it."""
    sizes = {"n": math.prod(k.domain)}
    for j, shape in enumerate(k.attrs["segments"]):
        sizes[f"n{j + 1}"] = math.prod(shape)
    return sizes


def group_source(k: Kernel, fn: str) -> tuple[str, Params]:
    bodies = [
        (k.body, k.dtype, "out"),
        *((e, t, f"stat{j}") for j, (e, t) in enumerate(k.attrs["stats"])),
    ]
    counts = list(group_sizes(k))
    params = Params(
        ["out", *[f"in{i}" for i in range(len(k.inputs))], *[t for *_, t in bodies[1:]]],
        counts,
    )
    rank = len(k.domain)
    ind = "        "
    lines = [
        f"def {fn}({params.signature()}):",
        "    start = cuda.grid(1)",
        "    step = cuda.gridsize(1)",
    ]
    for j, ((body, dtype, target), n) in enumerate(zip(bodies, counts, strict=True)):
        used = {leaf[1] for leaf in leaves(body) if leaf[0] == "in"}
        reads, _ = _operand_reads(k, "i", rank, [], ind, used=used)
        # names kept apart per loop: each loop's values have types of their own
        w = BodyWriter(lambda i: f"in{i}_v", lambda i: compute_dtype(k.inputs[i].dtype), f"_{j}")
        result, _ = w.emit(stored_body(body, dtype))
        lines += [
            "    i = start",
            f"    while i < {n}:",
            *reads,
            *(ind + ln for ln in w.lines),
            f"{ind}{target}[i] = {store_expr(dtype, result)}",
            f"{ind}i += step",
        ]
    return "\n".join(lines), params
