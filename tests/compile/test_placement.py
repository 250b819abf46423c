"""Proof of where the work ran: one fused kernel for the MLP's elementwise chain, saturn:0's
allocator counters moving, no CPU fallback, and an op saturn does not run kept on the host
with no crossing added around it."""

from __future__ import annotations

import pytest
import torch

import saturn

from .helpers import DEV, compile_and_compare, last_compiled


def test_elementwise_chain_is_one_kernel():
    torch.manual_seed(0)
    w = torch.randn(16, 16)
    b = torch.randn(16)

    def block(x, w, b):
        h = x @ w
        return torch.sigmoid(torch.relu(h * 0.5 + b) - 1.0)

    compile_and_compare(block, torch.randn(8, 16), w, b)
    prog = last_compiled().compiled.program
    loops = [k for k in prog.kernels if k.kind in ("loop", "reduce")]
    assert len(loops) == 1, [k.body for k in loops]
    assert str(loops[0].body).count("'sigmoid'") == 1 and "'relu'" in str(loops[0].body)


def test_allocator_counters_move_during_the_call():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: (x.exp() + 1).sum(0), backend="saturn", dynamic=False)
    x = torch.randn(32, 8).to(DEV)
    with torch.no_grad():
        fn(x)
        before = torch.saturn.memory_stats(DEV)
        fb = saturn.fallback_counts()
        fn(x)
        after = torch.saturn.memory_stats(DEV)
    assert (after["hits"] + after["misses"]) > (before["hits"] + before["misses"])
    assert saturn.fallback_counts() == fb
    assert last_compiled().recipe.last.launches >= 1


def test_unsupported_op_stays_on_host_without_extra_crossings():
    x = torch.randn(6, 5)

    def f(x):
        return torch.cumprod(x, 1)  # no row in the op table: an opaque host op

    compile_and_compare(f, x)
    prog = last_compiled().compiled.program
    hosts = [s for s in prog.steps if s.kind == "host"]
    assert [s.op.split("#")[0] for s in hosts] == ["aten.cumprod.default"]
    # its input crosses to the host once and its result comes back once: nothing more
    assert prog.count("crossing") == 2
    assert last_compiled().recipe.last.crossings == 2


def test_explain_names_every_fate():
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval().to(DEV)
    with torch.no_grad():
        ex = saturn.explain(m, torch.randn(4, 8).to(DEV))
    text = str(ex)
    assert len(ex.graphs) == 1
    g = ex.graphs[0]
    assert g.launches == 1 and g.crossings == 0, text
    assert any("gemm" in " ".join(f) for f in g.fates.values()), text
    assert "relu_bias" in g.kernels_text  # ReLU folded into the GEMM epilogue
    assert "schedule" in text and "per call: 1 kernel launches, 0 crossings" in text


def test_every_op_table_row_can_run_as_a_host_step():
    """A value the cost model keeps on the host (every half op on saturn:0) runs through
    run_host: by its ATen spelling or an adapter. A row with neither failed at call time
    (ClampMin/ClampMax of bfloat16 relu6 in MobileNetV2: every call reran uncompiled)."""
    from saturn.eqsat import optable as ot
    from saturn.host_ops import ADAPTERS

    missing = [
        o.name for o in ot.OPS if o.category != ot.LEAF and not o.aten and o.name not in ADAPTERS
    ]
    assert missing == [], missing


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_clamps_run_on_the_reference_host(dtype):
    x = (torch.randn(4, 9) * 8).to(dtype)
    x[0, :3] = torch.tensor([-0.0, float("nan"), 6.0])
    # compile_and_compare fails on a call that reran uncompiled
    compile_and_compare(lambda x: torch.nn.functional.relu6(x) + x.clamp(min=-1), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("op", ["ClampMin", "ClampMax"])
def test_host_clamps_keep_x_on_a_tie_at_every_width(op, dtype):
    """A clamp kept on the host (a GPU program with CPU inputs) is torch.clamp with a
    number bound: -0.0 against a 0.0 bound stays -0.0 and a NaN x stays NaN, on the
    vector path too (clamp_min's Tensor overload gave +0.0 from 8 elements on). It also
    declines to touch values inside the bound."""
    from saturn.host_ops import run_host

    n = 37  # vector body and scalar tail
    if dtype.is_floating_point:
        x = torch.tensor([-0.0, 0.0, float("nan"), -3.0, 3.0] * 8)[:n].to(dtype)
    else:
        x = torch.tensor([0, -3, 3, 2**31 - 1, -(2**31)] * 8, dtype=torch.int64)[:n].to(dtype)
    bound = torch.zeros((), dtype=dtype)
    got = run_host(op, [x, bound], (), {})
    kw = {"min": 0} if op == "ClampMin" else {"max": 0}
    want = torch.clamp(x, **kw)
    assert torch.equal(got.isnan(), want.isnan())
    same = ~want.isnan()
    assert torch.equal(got[same], want[same])
    if dtype.is_floating_point:  # the signs of the zeros
        assert torch.equal(torch.signbit(got[same]), torch.signbit(want[same]))
    if dtype.is_floating_point:  # a NaN bound gives NaN everywhere, as torch.clamp's
        nan = run_host(op, [x, torch.tensor(float("nan"), dtype=dtype)], (), {})
        assert bool(nan.isnan().all())
