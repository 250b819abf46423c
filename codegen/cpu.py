"""The CPU emitter: kernel descriptions to Numba ``njit`` functions for saturn:0.

It takes the same descriptions the CUDA emitter takes. Loops with packed operands run one
flat loop (operands read at ``i``, ``i % n``, ``i // n`` or ``0`` by their indexing);
anything strided runs nested loops over the iteration shape with every operand viewed
broadcast to it. Reductions run outer loops over the kept axes and inner loops over the
reduced ones, accumulating in float64 (floats) or int64 (integers), NaN propagating for
max/min. Source is written under the cache directory so Numba can cache the machine code
on disk; each distinct source is compiled once per process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from saturn.eqsat import optable as ot
from saturn.eqsat.kinds import Kind
from saturn.eqsat.program import Kernel

from .expr import NUMBA_TYPE, BodyWriter, helpers
from .sources import import_source


def _flat_read(name: str, indexing: str, i: int) -> str:
    if indexing == "same":
        return f"{name}[i]"
    if indexing == "scalar":
        return f"{name}[0]"
    if indexing == "trailing":
        return f"{name}[i % {name}.size]"
    if indexing == "leading":
        return f"{name}[i // (n // {name}.size)]"
    raise ValueError(indexing)


def _flat(k: Kernel) -> bool:
    """Whether a loop reads every operand at a flat index (else through broadcast views:
    strided and channel operands, whose index needs the shape)."""
    return all(o.indexing not in ("strided", "middle") for o in k.inputs)


def loop_source(k: Kernel, fn: str) -> str:
    names = [f"in{i}" for i in range(len(k.inputs))]
    flat = _flat(k)
    rank = len(k.domain)
    if flat:
        idx = "i"
        head = [
            f"def {fn}(out, {', '.join(names)}):" if names else f"def {fn}(out):",
            "    n = out.size",
            "    for i in range(n):",
        ]
        reads = {i: _flat_read(names[i], o.indexing, i) for i, o in enumerate(k.inputs)}
        ind = "        "
    else:
        loops = [f"j{d}" for d in range(rank)]
        idx = ", ".join(loops) if rank else "0"
        head = [f"def {fn}(out, {', '.join(names)}):"]
        ind = "    "
        for d in range(rank):
            head.append(f"{ind}for j{d} in range(out.shape[{d}]):")
            ind += "    "
        reads = {
            i: f"{names[i]}[{idx}]" if rank else f"{names[i]}[()]" for i in range(len(k.inputs))
        }
    body = BodyWriter(lambda i: f"{names[i]}_v", lambda i: k.inputs[i].dtype)
    pre = [f"{names[i]}_v = {reads[i]}" for i in range(len(k.inputs))]
    result, _ = body.emit(k.body)
    store = f"out[{idx}]" if (flat or rank) else "out[()]"
    lines = head + [ind + line for line in pre + body.lines]
    lines.append(f"{ind}{store} = {NUMBA_TYPE[k.dtype]}({result})")
    return "\n".join(lines)


def reduce_source(k: Kernel, fn: str) -> str:
    names = [f"in{i}" for i in range(len(k.inputs))]
    rank = len(k.domain)
    dims = set(k.attrs["dims"])
    kept = [d for d in range(rank) if d not in dims]
    kind = k.attrs["reduce"]
    red_dtype = k.attrs.get("acc_dtype", k.dtype)
    acc_t = "np.float64" if red_dtype in ot.FLOATS else "np.int64"
    init = {
        "sum": "0",
        "mean": "0",
        "prod": "1",
        "max": "-np.inf" if red_dtype in ot.FLOATS else str(np.iinfo(np.int64).min),
        "min": "np.inf" if red_dtype in ot.FLOATS else str(np.iinfo(np.int64).max),
    }[kind]
    lines = [f"def {fn}(out, {', '.join(names)}):"]
    ind = "    "
    for d in kept:
        lines.append(f"{ind}for j{d} in range({names[0]}.shape[{d}]):")
        ind += "    "
    lines.append(f"{ind}acc = {acc_t}({init})")
    for d in sorted(dims):
        lines.append(f"{ind}for j{d} in range({names[0]}.shape[{d}]):")
        ind += "    "
    idx = ", ".join(f"j{d}" for d in range(rank)) if rank else "()"
    body = BodyWriter(lambda i: f"{names[i]}_v", lambda i: k.inputs[i].dtype)
    pre = [f"{names[i]}_v = {names[i]}[{idx}]" for i in range(len(k.inputs))]
    v, _ = body.emit(k.body)
    lines += [ind + line for line in pre + body.lines]
    if kind in ("sum", "mean", "prod") and red_dtype not in ot.FLOATS:
        # int64 accumulation wraps as PyTorch's does (LLVM may not assume it cannot)
        op = "mul" if kind == "prod" else "add"
        lines.append(f"{ind}acc = {op}_i64(acc, np.int64({v}))")
    elif kind in ("sum", "mean"):
        lines.append(f"{ind}acc += {v}")
    elif kind == "prod":
        lines.append(f"{ind}acc *= {v}")
    else:
        cmp = ">" if kind == "max" else "<"
        lines.append(f"{ind}if {v} != {v} or {v} {cmp} acc:")
        lines.append(f"{ind}    acc = {v}")
        lines.append(f"{ind}if acc != acc:")  # NaN stays NaN
        lines.append(f"{ind}    break")
    ind = "    " * (1 + len(kept))
    count = " * ".join(f"{names[0]}.shape[{d}]" for d in sorted(dims)) or "1"
    if kind == "mean":
        lines.append(f"{ind}acc = acc / ({count})")
    out_idx = ", ".join(f"j{d}" for d in kept) if kept else "()"
    value = "acc"
    if k.epilogue is not None:  # an elementwise function of the reduced value
        lines.append(f"{ind}acc_r = {NUMBA_TYPE[red_dtype]}(acc)")
        epi = BodyWriter(lambda i: "acc_r", lambda i: red_dtype, "e")
        value, _ = epi.emit(k.epilogue)
        lines += [ind + line for line in epi.lines]
    lines.append(f"{ind}out[{out_idx}] = {NUMBA_TYPE[k.dtype]}({value})")
    return "\n".join(lines)


def kernel_source(k: Kernel) -> tuple[str, str]:
    """(module source, function name) for a loop or reduce kernel."""
    digest = hashlib.sha256(
        repr(
            (
                k.kind,
                k.body,
                k.epilogue,
                len(k.domain),  # the source reads extents at run time: one kernel per rank
                k.dtype,
                k.attrs,
                [(o.dtype, o.indexing) for o in k.inputs],
            )
        ).encode()
    )
    fn = f"{k.kind}_{digest.hexdigest()[:12]}"
    body = loop_source(k, fn) if k.kind == Kind.LOOP else reduce_source(k, fn)
    src = (
        "# generated by saturn.codegen.cpu\nimport math\n\nimport numba\nimport numpy as np\n"
        # IEEE results, not Python's exceptions: x / 0.0 is inf or NaN (as PyTorch and the
        # CUDA target give), math.log(0.0) is -inf, math.sqrt(-1.0) is NaN
        + helpers('@numba.njit(inline="always", error_model="numpy")')
        + '\n\n@numba.njit(cache=True, error_model="numpy")\n'
        + body
        + "\n"
    )
    return src, fn


def load(k: Kernel) -> Callable:
    """The compiled function for a kernel (each distinct source imported once)."""
    src, fn = kernel_source(k)
    return getattr(import_source(src, "cpu-kernels"), fn)


def prepare_operands(k: Kernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Arrays shaped for the kernel: flat for packed loops, broadcast views otherwise."""
    flat = k.kind == Kind.LOOP and _flat(k)
    out = []
    for o, a in zip(k.inputs, arrays, strict=True):
        if tuple(a.shape) != tuple(o.shape):
            raise ValueError(f"kernel operand has shape {a.shape}, compiled for {o.shape}")
        if flat:
            if not a.flags.c_contiguous:
                raise ValueError("a packed operand is not contiguous")
            out.append(a.reshape(-1) if a.ndim else a.reshape(1))
        else:
            out.append(np.broadcast_to(a, k.domain))
    return out


def run(k: Kernel, out: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Run a loop or reduce kernel on the CPU, writing ``out`` (its packed output)."""
    fn = load(k)
    ops = prepare_operands(k, arrays)
    if k.kind == Kind.LOOP:
        if _flat(k):
            fn(out.reshape(-1) if out.ndim else out.reshape(1), *ops)
        else:
            fn(out, *ops)
    else:
        kept = [s for d, s in enumerate(k.domain) if d not in set(k.attrs["dims"])]
        fn(out.reshape(kept) if kept else out.reshape(()), *ops)
