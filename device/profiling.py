"""saturn's steps in ``torch.profiler`` traces.

While a profiler records, each step of a compiled call runs inside a ``record_function``
range named for what it computes: its kind and the graph's ops it covers (for a fused loop,
every op fused into it), e.g. ``saturn loop v12 [mul, add, relu]``; a replayed call is one
range naming the CUDA graph's kernel count. Nothing is done while no profiler records (one
flag read per call)."""

from __future__ import annotations

import contextlib

import torch

from saturn.eqsat.program import Step, StepKind

MAX_NAMES = 8  # ops named in one range; the rest are counted


def recording() -> bool:
    return torch._C._autograd._profiler_enabled()


def label(s: Step) -> str:
    """The range name of one step: ``saturn <kind> <value> [ops]``."""
    if s.kernel is not None:
        kind = s.kernel.kind
        names = [*s.covers, *(n for n in s.kernel.fused if n not in s.covers)]
    else:
        kind = s.kind if s.kind != StepKind.HOST else f"host {s.op.split('#')[0]}"
        names = list(s.covers)
    shown = ", ".join(names[:MAX_NAMES])
    if len(names) > MAX_NAMES:
        shown += f", +{len(names) - MAX_NAMES}"
    return f"saturn {kind} {s.output} [{shown}]" if names else f"saturn {kind} {s.output}"


def step_range(s: Step, labels: dict[str, str]):
    """A ``record_function`` range for ``s`` while a profiler records, else nothing."""
    if not recording():
        return contextlib.nullcontext()
    name = labels.get(s.output)
    if name is None:
        name = labels[s.output] = label(s)
    return torch.profiler.record_function(name)
