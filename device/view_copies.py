"""Which view steps of a planned program copy at every call, found without running it.

A view step the runner cannot make a view of its source (a reshape of a permuted or
sliced buffer) copies it at every call (``GpuRunner._view``), a cost no kernel count
shows. Here each view is replayed with ``run_host``, as the runner applies it, on empty
CPU tensors laid out as the runner's buffers are: dense and row-major (a channels-last
buffer is not modelled). Used by ``bench/gpu_plan.py --views`` and the tests.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from saturn.eqsat.program import Program, StepKind

from .dtypes import TORCH_DTYPES
from .host_ops import run_host


def view_copies(program: Program) -> list[str]:
    """Each copying view as ``output: op shape <- the views it reads through <- the step
    under them``, in program order."""
    with unset_fake_temporarily():  # may be asked while a graph is traced: real tensors
        return _replayed(program)


def _replayed(program: Program) -> list[str]:
    steps = {s.output: s for s in program.steps}
    env: dict[str, torch.Tensor] = {}
    out = []
    for s in program.steps:
        if s.kind != StepKind.VIEW:
            env[s.output] = torch.empty(s.shape, dtype=TORCH_DTYPES[s.dtype])
            continue
        src = env[s.args[0]]
        env[s.output] = v = run_host(s.op, [src], s.attrs, {})
        if v.numel() and v.untyped_storage().data_ptr() != src.untyped_storage().data_ptr():
            out.append(f"{s.output}: {s.op} {list(s.shape)} <- {_under(steps, s.args[0])}")
    return out


def _under(steps: dict, at: str) -> str:
    chain = []
    while steps[at].kind == StepKind.VIEW:
        a = steps[at].attrs  # a shape or axes first; a Slice's (dim, start, end, step)
        chain.append(f"{steps[at].op}{list(a[0] if isinstance(a[0], tuple) else a)}")
        at = steps[at].args[0]
    base = steps[at]
    what = base.kernel.kind if base.kernel is not None else base.kind
    return f"{chain} <- {what} {list(base.shape)}"
