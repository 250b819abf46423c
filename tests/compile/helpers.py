"""Shared helpers: compile on saturn:0 and compare with eager on the CPU."""

from __future__ import annotations

import copy

import torch

import saturn
from saturn import backend

DEV = "saturn:0"


def compile_and_compare(model_or_fn, *inputs, rtol=1e-5, atol=1e-5, options=None):
    """Run eagerly on the CPU and compiled on saturn:0; return (compiled output, recipe).

    Also checks that the compiled call ran no op through the CPU fallback and that no call
    failed and reran uncompiled."""
    torch._dynamo.reset()
    failed = len(backend.CACHE.failed_calls)
    cpu_fn = model_or_fn
    dev_fn = model_or_fn
    if isinstance(model_or_fn, torch.nn.Module):
        cpu_fn = model_or_fn.eval()
        dev_fn = copy.deepcopy(model_or_fn).eval().to(DEV)
    with torch.no_grad():
        want = cpu_fn(*inputs)
        compiled = torch.compile(dev_fn, backend="saturn", options=options or {}, dynamic=False)
        dev_inputs = [x.to(DEV) if isinstance(x, torch.Tensor) else x for x in inputs]
        compiled(*dev_inputs)  # compile (and warm)
        before = saturn.fallback_counts()
        got = compiled(*dev_inputs)
        after = saturn.fallback_counts()
    assert after == before, f"the compiled call used the CPU fallback: {after} vs {before}"
    assert backend.CACHE.failed_calls[failed:] == [], "a compiled call failed and reran"
    wants = want if isinstance(want, tuple | list) else (want,)
    gots = got if isinstance(got, tuple | list) else (got,)
    for w, g in zip(wants, gots, strict=True):
        assert g.device == torch.device(DEV), g.device
        torch.testing.assert_close(g.cpu(), w, rtol=rtol, atol=atol, equal_nan=True)
    return got


def last_compiled() -> backend.CompiledGraph:
    return next(reversed(backend.CACHE.items.values()))


def traced_step(fn, *inputs) -> list[torch.fx.GraphModule]:
    """The forward and backward FX graphs AOTAutograd makes of ``fn(*inputs)`` with saturn's
    decompositions (the graphs saturn's backend is handed), traced and run on the CPU with
    no compiler: the backward of the first output's float sum."""
    from torch._dynamo.backends.common import aot_autograd

    from saturn import decompositions

    graphs = []

    def capture(gm, _example):
        graphs.append(gm)
        return gm.forward

    traced = aot_autograd(
        fw_compiler=capture, bw_compiler=capture, decompositions=decompositions.table()
    )
    torch._dynamo.reset()
    out = torch.compile(fn, backend=traced, dynamic=False)(*inputs)
    (out[0] if isinstance(out, tuple | list) else out).float().sum().backward()
    return graphs
