"""ATen ops the importer writes in saturn's own terms (views, comparisons, reductions) so
that they run as kernels: select, logical_not, any, full_like, and native_layer_norm's
mean and rstd results (a training forward saves them). Each against eager on the CPU with
both zeros, infinities and NaN where the op reads values; each decline stays the op's own
call (a host step) and still computes the right values."""

from __future__ import annotations

import pytest
import torch

from saturn import backend

from .helpers import DEV, compile_and_compare, last_compiled


def host_ops(prog) -> list[str]:
    return [s.op.split("#")[0] for s in prog.steps if s.kind == "host"]


def special(shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    flat[:5] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0])
    return x


def test_select_is_a_view():
    x = torch.randn(3, 4, 5)
    compile_and_compare(lambda x: x.select(1, 2) * 2 + x.select(2, 4)[:, 1:2], x)
    assert host_ops(last_compiled().compiled.program) == []


def test_select_with_a_negative_index_stays_the_call():
    x = torch.randn(3, 4)
    compile_and_compare(lambda x: x.select(0, -1) + 1, x)
    assert host_ops(last_compiled().compiled.program) == ["aten.select.int"]


def test_logical_not_is_a_comparison_with_zero():
    """True exactly for false, +0.0 and -0.0; NaN and infinities are truthy."""
    x = special((4, 6))
    compile_and_compare(lambda x: torch.logical_not(x).to(torch.float32) + x.abs(), x)
    compile_and_compare(lambda x: torch.logical_not(x > 0.5).to(torch.float32) * x, x)
    assert host_ops(last_compiled().compiled.program) == []


@pytest.mark.parametrize("keepdim", [False, True])
def test_any_over_booleans_counts_the_trues(keepdim):
    x = special((3, 5, 4))
    x[1] = -1.0  # a row with no true at all below

    def f(x):
        return torch.any(x > 0, dim=-1, keepdim=keepdim).to(torch.float32) + x.sum(-1, keepdim)

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []


def test_any_over_floats_stays_the_call():
    x = special((3, 5))
    compile_and_compare(lambda x: torch.any(x, dim=1).to(torch.float32) + x.sum(1), x)
    assert host_ops(last_compiled().compiled.program) == ["aten.any.dim"]


def test_full_like_is_a_broadcast_constant_and_the_safe_softmax_runs_as_kernels():
    """The masked softmax a training forward imports (``_safe_softmax``): rows that are all
    -inf give zeros, not NaN; the zeros are a device constant, not a copy per call."""
    s = torch.randn(2, 3, 4, 5)
    s[0, 1, 2] = float("-inf")  # a fully masked row

    def f(s):
        sm = torch.softmax(s, -1)
        masked = torch.logical_not(torch.any(torch.logical_not(s == float("-inf")), -1, True))
        return torch.where(masked, torch.full_like(sm, 0.0), sm)

    got = compile_and_compare(f, s)
    assert torch.equal(got[0, 1, 2].cpu(), torch.zeros(5))
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and prog.count("crossing") == 0


def test_layer_norm_statistics_of_a_training_forward_run_as_kernels():
    """With grad enabled the forward returns native_layer_norm's mean and rstd for the
    backward: Mean(x) and Rsqrt(Var(x, correction 0) + eps), kernels like the norm itself.
    The gradients (computed from them) match eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = special((4, 6, 16))
    x[0, 0, :3] = 0.0  # finite rows only: a NaN row would make every gradient NaN
    x = torch.where(x.isfinite(), x, torch.zeros(()))
    w, b = torch.randn(16), torch.randn(16)

    def f(x, w, b):
        return torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5) * x

    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    f(*leaves).sum().backward()
    want_grads = [t.grad for t in leaves]
    dev = [t.to(DEV).requires_grad_() for t in (x, w, b)]
    before = backend.CACHE.compiles
    fn = torch.compile(f, backend="saturn", dynamic=False)
    out = fn(*dev)
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), f(x, w, b), rtol=1e-5, atol=1e-5)
    for t, want in zip(dev, want_grads, strict=True):
        torch.testing.assert_close(t.grad.cpu(), want, rtol=1e-4, atol=1e-5)
    assert backend.CACHE.compiles - before == 2  # forward and backward
    forward = list(backend.CACHE.items.values())[-2]
    assert host_ops(forward.compiled.program) == []
    assert "aten.native_layer_norm" not in forward.imported.graph.to_text()


def test_layer_norm_statistics_in_another_dtype_stay_the_call():
    """bfloat16 input on saturn's device: PyTorch types mean and rstd float32 (as on CUDA),
    which Mean and Var of x (in x's dtype) are not, so the importer keeps
    native_layer_norm as the op's own call. (On the CPU they are bfloat16, and lowered.)"""
    from torch._dynamo.backends.common import aot_autograd

    from saturn import decompositions
    from saturn.importer import import_graph

    texts = []

    def capture(gm, _example):
        texts.append(import_graph(gm).graph.to_text())
        return gm.forward

    torch._dynamo.reset()
    x, w, b = (
        torch.randn(s, dtype=torch.bfloat16).to(DEV).requires_grad_() for s in ((4, 16), 16, 16)
    )
    fn = torch.compile(
        lambda x, w, b: torch.nn.functional.layer_norm(x, (16,), w, b) * x,
        backend=aot_autograd(fw_compiler=capture, decompositions=decompositions.table()),
        dynamic=False,
    )
    fn(x, w, b)
    (forward,) = texts
    assert '(Opaque "aten.native_layer_norm.default' in forward
    assert "(Mean " not in forward and "(LayerNorm " not in forward


def test_bfloat16_layer_norm_trains_through_its_host_call():
    """The kept call runs PyTorch's CPU kernel, whose bfloat16 statistics the step casts to
    the float32 the graph was traced with (before, the output check refused them). Forward
    and gradients as eager's on the CPU; the statistics came from the host call."""
    torch.manual_seed(7)
    ref = torch.nn.LayerNorm(16).to(torch.bfloat16)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    model = torch.nn.LayerNorm(16).to(torch.bfloat16).to(DEV)
    model.load_state_dict(ref.state_dict())
    torch._dynamo.reset()
    xd = x.to(DEV).requires_grad_()
    got = torch.compile(model, backend="saturn", dynamic=False)(xd)
    got.float().square().sum().backward()
    xc = x.clone().requires_grad_()
    want = ref(xc)
    want.float().square().sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad, rtol=1e-2, atol=1e-2)
    forward = list(backend.CACHE.items.values())[-2]
    assert "aten.native_layer_norm.default" in host_ops(forward.compiled.program)
