"""ATen ops the importer writes in saturn's own terms (views, comparisons, reductions,
constants) so that they run as kernels: select, logical_not, any, full_like, arange, and
native_layer_norm's mean and rstd results (a training forward saves them). Each against
eager on the CPU with both zeros, infinities and NaN where the op reads values; each
decline stays the op's own call (a host step) and still computes the right values."""

from __future__ import annotations

import pytest
import torch

from saturn import backend

from .helpers import DEV, compile_and_compare, last_compiled

nnf = torch.nn.functional


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


def safe_softmax(s):
    """PyTorch's ``_safe_softmax`` as a training forward imports it (all() through any())."""
    sm = torch.softmax(s, -1)
    masked = torch.logical_not(torch.any(torch.logical_not(s == float("-inf")), -1, True))
    return torch.where(masked, torch.full_like(sm, 0.0), sm)


def test_full_like_is_a_broadcast_constant_and_the_safe_softmax_runs_as_kernels():
    """The masked softmax a training forward imports (``_safe_softmax``): rows that are all
    -inf give zeros, not NaN; the zeros are a device constant, not a copy per call."""
    s = torch.randn(2, 3, 4, 5)
    s[0, 1, 2] = float("-inf")  # a fully masked row
    got = compile_and_compare(safe_softmax, s)
    assert torch.equal(got[0, 1, 2].cpu(), torch.zeros(5))
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and prog.count("crossing") == 0
    # the zeros are a constant in the kernel's body, not an operand read through strides
    expands = {st.output for st in prog.steps if st.kind == "view" and st.op == "Expand"}
    assert not [o.value for k in prog.kernels for o in k.inputs if o.value in expands]


def reductions(prog) -> list[tuple[str, str]]:
    return [(k.attrs["reduce"], k.dtype) for k in prog.kernels if k.kind == "reduce"]


def test_safe_softmax_mask_is_the_rows_max():
    """any(s != -inf) over a row is max(s) != -inf: the mask of the safe softmax needs no
    count of its own, the softmax's max gives it. Rows all -inf, -inf with NaN, +inf."""
    s = special((2, 3, 4, 5))
    s[0, 1, 2] = float("-inf")  # fully masked: zeros
    s[1, 0, 0] = torch.tensor([float("-inf"), float("nan"), float("-inf"), 1.0, 2.0])
    s[1, 2, 3] = torch.tensor([float("inf"), float("-inf"), 0.0, -0.0, 1.0])
    got = compile_and_compare(safe_softmax, s)
    assert torch.equal(got[0, 1, 2].cpu(), torch.zeros(5))
    prog = last_compiled().compiled.program
    # one max (shared with the softmax's), one sum, no integer count
    assert sorted(reductions(prog)) == [("max", "f32"), ("sum", "f32")], reductions(prog)
    x = special((3, 7))
    x[1] = float("-inf")
    compile_and_compare(lambda x: (x != float("-inf")).any(-1).float() + x.sum(-1), x)
    assert ("max", "f32") in reductions(last_compiled().compiled.program)


def test_any_above_neg_inf_over_an_empty_axis_counts():
    """Over an empty axis any() is false and max() has no value: the count stays."""
    x = torch.randn(3, 0, 4)
    compile_and_compare(lambda x: (x != float("-inf")).any(1).float() + 1.0, x)
    assert ("max", "f32") not in reductions(last_compiled().compiled.program)


def test_an_expanded_tensor_stays_an_operand():
    x, b = special((4, 5)), special((5,), 1)
    compile_and_compare(lambda x, b: torch.where(x > 0, x, b.expand(4, 5)), x, b)
    (k,) = last_compiled().compiled.program.kernels
    assert len(k.inputs) == 2


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


def test_half_layer_norm_statistics_are_float32_of_the_widened_input():
    """bfloat16 input on saturn's device: PyTorch types mean and rstd float32 (as on CUDA,
    which computes them in float32), so they are Mean and Var of x widened, in float32
    (decision 0089), not the op's own call. (On the CPU they are bfloat16.)"""
    from torch._dynamo.backends.common import aot_autograd

    from saturn import decompositions
    from saturn.importer import import_graph

    graphs = []

    def capture(gm, _example):
        graphs.append(import_graph(gm).graph)
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
    (forward,) = graphs
    assert "Opaque" not in forward.to_text(), forward.to_text()
    stats = [n for n in forward.nodes.values() if n.op in ("Mean", "Var")]
    assert len(stats) == 2 and all(n.dtype == "f32" for n in stats)
    assert all(forward.nodes[n.args[0]].op == "Cast" for n in stats)


def test_bfloat16_layer_norm_trains_with_float32_statistics():
    """The statistics in float32 as the graph was traced (CUDA's): the forward is eager's
    bit for bit, and the gradients are closer to the float64 gradient of the same bfloat16
    values than eager CPU's (which rounds its statistics to bfloat16), within bfloat16's
    rounding of it."""
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
    r64 = torch.nn.LayerNorm(16).double()
    r64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    x64 = x.double().requires_grad_()
    r64(x64).backward(2 * want.detach().double())  # d(sum y^2)/dy at eager's rounded y
    mine = (xd.grad.cpu().double() - x64.grad).abs().max().item()
    eager = (xc.grad.double() - x64.grad).abs().max().item()
    assert mine <= eager and mine < 1e-2 * x64.grad.abs().max().item(), (mine, eager)
    torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad, rtol=1e-2, atol=1e-2)
    forward = list(backend.CACHE.items.values())[-2]
    assert "aten.native_layer_norm.default" not in host_ops(forward.compiled.program)


def consts(prog, op: str) -> list:
    return [s for s in prog.steps if s.kind == "const" and s.op == op]


def test_arange_is_a_constant_made_once():
    """Integer bounds, integer and float results: the values are the op table's, made once
    where the program reads them; no host step, no crossing."""
    x = special((3, 5))

    def f(x):
        i = torch.arange(5, device=x.device)
        onehot = (torch.arange(-1, 8, 3, device=x.device)[:, None] == i).to(x.dtype)
        ramp = torch.arange(-3, 7, 2, dtype=torch.float32, device=x.device)
        return x * ramp + onehot[:3], i * 2

    compile_and_compare(f, x)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and prog.count("crossing") == 0
    assert sorted(c.attrs for c in consts(prog, "Arange")) == [
        (-3, 2, 5, "f32"),
        (-1, 3, 3, "i64"),
        (0, 1, 5, "i64"),
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.arange(0.0, 1.0, 0.25, device=d),  # fractional bounds
        lambda d: torch.arange(4096, dtype=torch.float16, device=d).float(),  # inexact in f16
    ],
)
def test_arange_that_is_not_exact_stays_the_call(make):
    x = torch.randn(4)
    compile_and_compare(lambda x: x.sum() + make(x.device).sum(), x)
    prog = last_compiled().compiled.program
    assert [h for h in host_ops(prog) if h.startswith("aten.arange")], host_ops(prog)
    assert consts(prog, "Arange") == []


def test_training_encoder_backward_has_no_host_step():
    """select's backward (the packed q/k/v projection) builds its one-hot mask from arange:
    with Arange a constant, the whole backward of an encoder layer runs as kernels.
    Gradients as eager's on the CPU."""
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).to(DEV)
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 16)
    torch._dynamo.reset()
    before = backend.CACHE.compiles
    xd = x.to(DEV).requires_grad_()
    out = torch.compile(model, backend="saturn", dynamic=False)(xd)
    out.square().sum().backward()
    xc = x.clone().requires_grad_()
    want = ref(xc)
    want.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert backend.CACHE.compiles - before == 2
    backward = list(backend.CACHE.items.values())[-1].compiled.program
    assert host_ops(backward) == [] and backward.count("crossing") == 0
    # the three selects' (q, k, v) aranges are one value: one constant
    assert [c.attrs for c in consts(backward, "Arange")] == [(0, 1, 3, "i64")]


def test_ne_is_a_comparison_on_the_device():
    """x != y: true for NaN against anything, false for -0.0 against 0.0, as PyTorch."""
    x, y = special((4, 6)), special((4, 6), seed=1)
    y[0, 3] = 0.0  # -0.0 in x against 0.0
    compile_and_compare(lambda x, y: (x != y).to(torch.float32) + (x != 0.5) * 2.0, x, y)
    assert host_ops(last_compiled().compiled.program) == []


@pytest.mark.parametrize("op", [torch.logical_and, torch.logical_or])
def test_logical_and_or_read_truthiness(op):
    """Nonzero is true (NaN and infinities included), both zeros false; bools as they are."""
    x, y = special((4, 6)), special((4, 6), seed=2)
    y[0, :5] = torch.tensor([0.0, -0.0, float("nan"), 0.0, 1.0])

    def f(x, y):
        return op(x, y).to(torch.float32) + op(x > 0, y < 0).to(torch.float32) * 2

    compile_and_compare(f, x, y)
    assert host_ops(last_compiled().compiled.program) == []


def test_bitwise_ops_of_booleans_are_logical():
    x, y = special((3, 5)), special((3, 5), seed=3)

    def f(x, y):
        a, b = x > 0, y > 0
        return (a & b).to(torch.float32) + (a | b) * 2.0 + (~a) * 4.0

    compile_and_compare(f, x, y)
    assert host_ops(last_compiled().compiled.program) == []


def test_bitwise_ops_of_integers_stay_the_call():
    a = torch.randint(-8, 8, (3, 5))
    compile_and_compare(lambda a: (a & 6) + (~a), a)
    assert sorted(host_ops(last_compiled().compiled.program)) == [
        "aten.bitwise_and.Scalar",
        "aten.bitwise_not.default",
    ]


def test_clamp_with_number_bounds():
    """NaN stays NaN, infinities clamp, lo > hi gives hi (PyTorch's clamp)."""
    x = special((4, 6), seed=4) * 3

    def f(x):
        return (
            torch.clamp(x, -1.0, 2.0)
            + torch.clamp(x, min=0.5) * 2
            + torch.clamp(x, max=-0.25) * 4
            + torch.clamp(x, 3.0, 1.0) * 8
        )

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []


def test_clamp_that_changes_the_dtype_or_takes_tensors_stays_the_call():
    a = torch.randint(-8, 8, (3, 5))
    x, lo = torch.randn(3, 5), torch.randn(3, 5)
    compile_and_compare(lambda a: torch.clamp(a, -2.5, 3.5) * 2, a)  # int -> float result
    assert host_ops(last_compiled().compiled.program) == ["aten.clamp.default"]
    compile_and_compare(lambda x, lo: torch.clamp(x, lo) + 1, x, lo)
    assert host_ops(last_compiled().compiled.program) == ["aten.clamp.Tensor"]
    # a bound outside int8: PyTorch raises, and so does the call (not a wrapped constant)
    torch._dynamo.reset()
    fn = torch.compile(lambda a: torch.clamp(a, max=1000) + 1, backend="saturn", dynamic=False)
    with pytest.raises(RuntimeError, match="overflow"):
        fn(a.to(torch.int8).to(DEV))


def test_split_pieces_are_slices():
    x = special((4, 10), seed=5)

    def f(x):
        a, b, c = x.split([3, 5, 2], dim=1)
        d, e = x.split(2, dim=0)
        return a.sum(1) + b.amax(1) - c[:, 0], d * e

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []


def test_a_boolean_full_is_a_broadcast_constant():
    x = torch.randn(4, 4)

    def f(x):
        keep = torch.full((4, 4), True, dtype=torch.bool, device=x.device).tril()
        return torch.where(torch.logical_and(keep, x > 0), x, 0.0)

    compile_and_compare(f, x)
    assert "aten.full.default" not in host_ops(last_compiled().compiled.program)


def test_an_integer_constant_outside_its_dtype_runs_the_graph_uncompiled():
    """int8 != 1000: PyTorch compares with the wrapped value here (and raises in full());
    the graph runs as PyTorch runs it, with the reason logged, not with a constant saturn
    would have to make up."""
    x = torch.tensor([-24, 1, 5], dtype=torch.int8)

    def f(x):
        return (x != 1000).to(torch.int32) + (x > 1000) * 2

    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to(DEV))
    assert torch.equal(got.cpu(), f(x))
    assert any("does not fit i8" in r for r in backend.CACHE.fallbacks[before:])


def test_fma_rounds_once():
    """prims.fma (what an optimizer's addcmul_ decomposes into): the device computes the
    float32 product and sum in float64 and rounds once, so (1 + 2^-12)^2 - (1 + 2^-11) is
    2^-24, not the 0 that rounding the product first gives (PyTorch's CPU addcmul fuses
    where the CPU has FMA; its CPU prims.fma does not). NaN and infinities as eager's."""
    a, b, c = special((4, 6)), special((4, 6), seed=6), special((4, 6), seed=7)
    compile_and_compare(lambda a, b, c: torch.ops.prims.fma(a, b, c), a, b, c)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and "fma" in str([k.body for k in prog.kernels])
    a = torch.full((3,), 1 + 2**-12)
    c = torch.full((3,), -(1 + 2**-11))
    torch._dynamo.reset()
    fn = torch.compile(lambda a, c: torch.ops.prims.fma(a, a, c), backend="saturn")
    got = fn(a.to(DEV), c.to(DEV)).cpu()
    assert torch.equal(got, torch.full((3,), 2.0**-24))  # the fused result
    assert host_ops(last_compiled().compiled.program) == []


def test_fma_in_float64_stays_the_call():
    """The kernel is float32's; float64 is PyTorch's own call, to float64 precision."""
    a = torch.randn(5, dtype=torch.float64)
    compile_and_compare(lambda a: torch.ops.prims.fma(a, a, a) + 1, a, rtol=1e-15, atol=1e-15)
    assert host_ops(last_compiled().compiled.program) == ["Fma"]


def test_add_with_alpha_and_functional_copy():
    """p.add_(g, alpha=-lr) (an optimizer's update) is a + alpha * b; copy(dst, src) is
    src's values in dst's dtype and shape."""
    x, y = special((4, 6)), special((4, 6), seed=8)
    compile_and_compare(lambda x, y: torch.add(x, y, alpha=-0.01) - torch.sub(x, y, alpha=3), x, y)
    compile_and_compare(lambda x, y: torch.add(x, y[0], alpha=0.5), x, y)  # b broadcasts
    assert host_ops(last_compiled().compiled.program) == []
    i = torch.randint(-5, 5, (4, 6))
    compile_and_compare(lambda i: torch.add(i, i, alpha=3), i)
    assert host_ops(last_compiled().compiled.program) == []
    compile_and_compare(lambda x, y: torch.ops.aten.copy(x, y[0]) + x, x, y)
    assert host_ops(last_compiled().compiled.program) == []


def test_pow_of_a_number_by_a_tensor():
    """beta ** step (Adam's bias correction): Pow with a constant base."""
    e = special((5,), seed=9)
    compile_and_compare(lambda e: torch.pow(0.9, e) + torch.pow(2.0, e), e)
    assert host_ops(last_compiled().compiled.program) == []


def test_max_pool_over_tiling_windows_is_a_reduction():
    """Windows that tile the image (an uneven edge cut off, as floor mode does): the maximum
    over a view of the windows. NaN in a window gives NaN; infinities as they are."""
    x = special((2, 3, 9, 13), seed=10)

    def f(x):
        return torch.nn.functional.max_pool2d(x, 2) + 1, torch.nn.functional.max_pool2d(x, (3, 4))

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []


def test_pool_kernels_are_ones_the_gpu_emitter_takes():
    """The GPU's reductions take adjacent axes: the windows' axes are permuted last."""
    from torch._dynamo.backends.common import aot_autograd

    from saturn import decompositions
    from saturn.codegen import cuda as cg
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    progs = []

    def capture(gm, _example):
        progs.append(compile_graph(import_graph(gm).graph, machine="gpu", io_on_device=True))
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(
        lambda x: (
            torch.nn.functional.max_pool2d(x, (2, 3)),
            torch.nn.functional.avg_pool2d(x, (2, 3)),
        ),
        backend=aot_autograd(fw_compiler=capture, decompositions=decompositions.table()),
        dynamic=False,
    )
    with torch.no_grad():
        fn(torch.randn(2, 3, 9, 13))
    (compiled,) = progs
    kernels = compiled.program.kernels
    assert [k.kind for k in kernels] == ["reduce", "reduce"]
    for k in kernels:
        cg.generate(k)  # raises for a reduction it does not take


@pytest.mark.parametrize(
    "pool,kw,call",
    [
        # (max pools with overlap, padding, dilation or in ceil mode: test_movement.py)
        (
            "avg",
            dict(kernel_size=3, stride=2, ceil_mode=True),
            "aten.avg_pool2d.default",
        ),
        (
            "avg",
            dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
            "aten.avg_pool2d.default",
        ),
        ("avg", dict(kernel_size=2, divisor_override=3), "aten.avg_pool2d.default"),
    ],
)
def test_pool_in_ceil_mode_without_padding_counted_or_a_divisor_override_stays_the_call(
    pool, kw, call
):
    fn = getattr(torch.nn.functional, f"{pool}_pool2d")
    x = torch.randn(2, 3, 8, 8)
    compile_and_compare(lambda x: fn(x, **kw) * 2, x)
    assert call in host_ops(last_compiled().compiled.program)


def test_max_pool_in_training_computes_its_indices_on_the_device():
    """The backward reads the argmax indices: the forward folds them with the maximum, the
    backward adds at them (decision 0087); no host op either way, gradients as eager's."""
    x = torch.randn(2, 3, 8, 8)
    torch._dynamo.reset()
    xd = x.to(DEV).requires_grad_()
    out = torch.compile(lambda x: torch.nn.functional.max_pool2d(x, 2) * 3, backend="saturn")(xd)
    out.sum().backward()
    xc = x.clone().requires_grad_()
    (torch.nn.functional.max_pool2d(xc, 2) * 3).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    forward, backward = (g.compiled.program for g in list(backend.CACHE.items.values())[-2:])
    assert host_ops(forward) == [] and host_ops(backward) == [], backward.to_text()


def test_foreach_ops_are_the_single_tensor_ops():
    """The multi-tensor forms an optimizer uses by default: each position is the one-tensor
    op's formula (lerp from the nearer end, addcmul/addcdiv fused), NaN and infinities as
    eager's."""
    a, b, c = special((3, 5), seed=11), special((6,), seed=12), special((3, 5), seed=13)
    d = special((6,), seed=14)

    def f(a, b, c, d):
        out = []
        out += torch._foreach_add([a, b], [c, d], alpha=0.5)
        out += torch._foreach_sub([a, b], 2.0)
        out += torch._foreach_mul([a, b], 0.9)
        out += torch._foreach_div([a, b], [c, d])
        out += torch._foreach_lerp([a, b], [c, d], 0.3)
        out += torch._foreach_lerp([a, b], [c, d], 0.8)
        out += torch._foreach_addcmul([a, b], [c, d], [c, d], value=0.001)
        out += torch._foreach_addcdiv([a, b], [c, d], [a, b], value=-0.01)
        out += torch._foreach_pow(0.9, [c.abs(), d.abs()])
        out += torch._foreach_sqrt([a.abs(), b.abs()])
        out += torch._foreach_reciprocal([a, b])
        out += torch._foreach_neg([a, b])
        return tuple(out)

    compile_and_compare(f, a, b, c, d)
    assert host_ops(last_compiled().compiled.program) == []


def test_foreach_that_a_position_declines_stays_the_call():
    """addcmul of integers has no fused form here: the whole multi-tensor call stays the
    call (on the host), with eager's values."""
    a = torch.randint(-5, 5, (3,))
    compile_and_compare(lambda a: torch._foreach_addcmul([a, a], [a, a], [a, a])[1] * 2, a)
    assert host_ops(last_compiled().compiled.program) == ["aten._foreach_addcmul.Scalar", "Item"]


def test_avg_pool_over_tiling_windows_is_a_mean():
    x = special((2, 3, 9, 13), seed=15)

    def f(x):
        return torch.nn.functional.avg_pool2d(x, 2) * 2, torch.nn.functional.avg_pool2d(x, (3, 4))

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []


def reduce_operands(prog) -> list[str]:
    return [o.indexing for k in prog.kernels if k.kind == "reduce" for o in k.inputs]


@pytest.mark.parametrize(
    "f",
    [
        lambda x: x.permute(1, 0, 2).sum((0, 1)),  # a permute of a packed value
        lambda x: (x.permute(2, 0, 1) * 2.0).amax(0),
        lambda x: x.permute(1, 0, 2).reshape(24, 5).mean(0),  # the reshape copies: packed
    ],
)
def test_reductions_read_operands_packed_in_memory_order(f):
    """A reduction over a permuted (or reshaped-and-copied) packed value reads it without
    strides: in the value's memory order, the same elements per output."""
    x = special((4, 6, 5))
    compile_and_compare(f, x)
    assert reduce_operands(last_compiled().compiled.program) == ["same"]


def test_a_reduction_whose_kept_axes_would_reorder_reads_through_strides():
    x = special((4, 6, 5))
    compile_and_compare(lambda x: x.permute(1, 0, 2).sum(2), x)  # kept (6, 4) lie as (4, 6)
    assert reduce_operands(last_compiled().compiled.program) == ["strided"]


def test_view_strides_follow_pytorchs_rule():
    """The lowering's static strides of a reshape agree with PyTorch's view (None where
    PyTorch must copy)."""
    import itertools

    from saturn.eqsat.program import view_strides

    g = torch.Generator().manual_seed(0)
    for shape in [(4, 6, 5), (2, 1, 3, 4), (3, 8), (1, 5, 1)]:
        n = 1
        for v in shape:
            n *= v
        news = [(n,), (shape[0], n // shape[0]), (n // shape[-1], shape[-1]), (*shape, 1)]
        for perm in itertools.permutations(range(len(shape))):
            t = torch.empty(shape).permute(perm)
            for new in news:
                new = tuple(new[i] for i in torch.randperm(len(new), generator=g).tolist())
                if torch.Size(new).numel() != n:
                    continue
                try:
                    want = t.view(new).stride()
                except RuntimeError:
                    want = None
                assert view_strides(tuple(t.shape), t.stride(), new) == want, (shape, perm, new)


def gpu_program(fn, *args):
    """The GPU machine's program for ``fn`` (compiled here, on the CPU), and a check that
    the CUDA emitter builds each of its loops and reductions."""
    from torch._dynamo.backends.common import aot_autograd

    from saturn import decompositions
    from saturn.codegen import cuda as cg
    from saturn.constants import lift_constants
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    progs = []

    def capture(gm, _example):
        gm, _ = lift_constants(gm)
        progs.append(compile_graph(import_graph(gm).graph, machine="gpu", io_on_device=True))
        return gm.forward

    torch._dynamo.reset()
    c = torch.compile(
        fn, backend=aot_autograd(fw_compiler=capture, decompositions=decompositions.table())
    )
    with torch.no_grad():
        c(*args)
    (compiled,) = progs
    for k in compiled.program.kernels:
        if k.kind in ("loop", "reduce", "rows"):
            cg.generate(k)
    return compiled.program


UNARY_CASES = {
    "log1p": lambda x: torch.log1p(x),
    "expm1": lambda x: torch.expm1(x),
    "atan2": lambda x: torch.atan2(x, x * -0.5 + 0.25),
    "sin cos": lambda x: torch.sin(x) * torch.cos(x * 3e4),  # large arguments too
    "softplus": lambda x: torch.nn.functional.softplus(x),
    "mish": lambda x: torch.nn.functional.mish(x),
    "sign": lambda x: torch.sign(x),
    "isnan": lambda x: torch.isnan(x).to(torch.float32) + x.isnan().sum(),
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x) + torch.nn.functional.relu6(x),
    "elu": lambda x: torch.nn.functional.elu(x, 0.7),
    "selu": lambda x: torch.nn.functional.selu(x),
    "celu": lambda x: torch.nn.functional.celu(x, 1.3),
}


@pytest.mark.parametrize("case", sorted(UNARY_CASES))
def test_elementwise_functions_run_as_loops(case):
    """Functions PyTorch has as one op, written in saturn's elementwise ops (log1p, expm1,
    atan2 are rows of the table; sign, isnan, hardtanh, elu are compositions that give
    PyTorch's CPU values for both zeros, infinities and NaN), on both machines."""
    fn = UNARY_CASES[case]
    x = special((5, 7), seed=3)
    x.view(-1)[5:9] = torch.tensor([-1.0, -2.0, 1e-6, -1e-6])  # log1p's edge, small args
    compile_and_compare(fn, x)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(fn, x)) == []


def test_sign_of_an_integer_tensor_and_a_zero_keeps_its_sign_rule():
    x = torch.tensor([-3, 0, 5, -1], dtype=torch.int64)
    compile_and_compare(lambda x: torch.sign(x) * 2, x)
    assert host_ops(last_compiled().compiled.program) == []
    z = torch.tensor([-0.0, 0.0, float("nan")])
    got = compile_and_compare(lambda z: torch.sign(z), z)
    assert not got.cpu().signbit().any()  # +0.0 for both zeros and NaN, as PyTorch's CPU


def test_isnan_of_integers_stays_the_call():
    x = torch.arange(6)
    compile_and_compare(lambda x: torch.isnan(x).to(torch.int64) + x, x)
    assert host_ops(last_compiled().compiled.program) == ["aten.isnan.default"]


@pytest.mark.parametrize("kind", ["no affine", "no bias", "no weight"])
def test_layer_norm_without_weight_or_bias(kind):
    """A missing weight is the scalar 1 and a missing bias -0.0: y * 1 and y + -0.0 are y
    for every y (+0.0 would turn -0.0 into +0.0)."""
    torch.manual_seed(0)
    x = special((3, 8), seed=5)
    if kind == "no weight":
        b = torch.randn(8)
        args = (x, b)

        def fn(x, b):
            return torch.nn.functional.layer_norm(x, (8,), None, b)

    else:
        fn = torch.nn.LayerNorm(8, elementwise_affine=kind == "no bias", bias=False)
        if kind == "no bias":
            torch.nn.init.normal_(fn.weight)
        args = (x,)
    compile_and_compare(fn, *args)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(fn, *args)) == []
    ones = torch.full((2, 8), 3.0)  # every value the mean: y is 0 * rstd = +0.0 throughout
    got = compile_and_compare(lambda x: torch.nn.functional.layer_norm(x, (8,)), ones)
    assert torch.equal(got.cpu().signbit(), torch.nn.functional.layer_norm(ones, (8,)).signbit())


def test_batch_norm_inference_without_affine():
    bn = torch.nn.BatchNorm2d(3, affine=False).eval()
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 1.5)
    x = special((2, 3, 4, 5), seed=6)
    compile_and_compare(bn, x)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(bn, x)) == []


@pytest.mark.parametrize("correction", [0, 1, 2])
def test_corrected_variance_is_written_out(correction):
    """var/std with a correction: sum((x - mean)^2) / max(N - correction, 0), PyTorch's
    definition, written out where the importer knows N (the e-graph's Var holds no count);
    too few elements give inf or NaN, as in PyTorch."""
    x = torch.randn(4, 6, 5)
    x[0, 0, 0] = float("nan")

    def f(x):
        return (
            x.var(-1, correction=correction),
            x.std((0, 2), correction=correction, keepdim=True),
            x[:, :1, :2].var(1, correction=correction),  # N = 1: 0 / max(1 - c, 0)
        )

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(f, x)) == []


def test_variance_over_a_symbolic_length_keeps_the_op():
    """N unknown until the call (a marker): the corrected variance stays the Var op."""

    def f(x):
        return x.var(1) * 2

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    for n in (3, 6):
        x = torch.randn(2, n)
        torch.testing.assert_close(fn(x.to(DEV)).cpu(), f(x))
    prog = last_compiled().recipe.program
    assert "Var" in host_ops(prog)


def test_logsumexp_squeezes_as_a_view():
    x = special((4, 9), seed=7)
    compile_and_compare(lambda x: torch.logsumexp(x, 1), x)
    assert host_ops(last_compiled().compiled.program) == []


@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_over_axes_that_are_not_one_run(keepdim):
    """x.sum((0, 2)): the emitters take one run of adjacent axes, so the lowering reads
    the operands through views permuted to put the reduced axes last (and the CUDA
    emitter builds each reduction: ``gpu_program``)."""
    x = special((4, 6, 5, 3), seed=8)

    def f(x):
        return (
            x.sum((0, 2), keepdim=keepdim),
            x.amax((1, 3), keepdim=keepdim),
            x.mean((0, 3), keepdim=keepdim),
            x.var((0, 2), keepdim=keepdim),
        )

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []
    prog = gpu_program(f, x)  # raised "reduction over non-adjacent axes" before
    assert host_ops(prog) == []
    for k in prog.kernels:
        if k.kind == "reduce":
            dims = k.attrs["dims"]
            assert tuple(dims) == tuple(range(dims[0], dims[-1] + 1)), prog.to_text()


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_is_a_layer_norm_over_groups(affine):
    torch.manual_seed(0)
    gn = torch.nn.GroupNorm(3, 6, affine=affine)
    if affine:
        torch.nn.init.normal_(gn.weight)
        torch.nn.init.normal_(gn.bias)
    x = special((2, 6, 4, 5), seed=9)
    x[1] = torch.randn(6, 4, 5)  # the second sample's groups without special values
    compile_and_compare(gn, x)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(gn, x)) == []


def test_group_norm_whose_statistics_are_read_stays_the_call():
    """A training forward reads mean and rstd too: the op stays PyTorch's."""
    x = torch.randn(2, 4, 3)
    w, b = torch.randn(4), torch.randn(4)
    compile_and_compare(
        lambda x, w, b: torch.ops.aten.native_group_norm(x, w, b, 2, 4, 3, 2, 1e-5), x, w, b
    )
    assert host_ops(last_compiled().compiled.program)[0] == "aten.native_group_norm.default"


def test_rounding_functions_run_as_loops():
    """floor, ceil, trunc, round (half to even): both zeros, infinities and NaN kept, ties
    and values just below them, values past 2^23 that are integral already."""
    x = special((6, 8), seed=11)
    x.view(-1)[5:16] = torch.tensor(
        [0.5, 1.5, 2.5, -0.5, -1.5, -0.3, 0.49999997, 8388609.0, -3.7, 1e-40, -2.5]
    )

    def f(x):
        return torch.floor(x), torch.ceil(x), torch.trunc(x), torch.round(x)

    got = compile_and_compare(f, x)
    for g, w in zip(got, f(x), strict=True):
        assert torch.equal(g.cpu().signbit(), w.signbit())  # -0.0 where PyTorch gives it
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(f, x)) == []
    compile_and_compare(lambda x: torch.round(x.double() * 3), x)


def test_rounding_an_integer_tensor_is_its_values():
    x = torch.arange(-3, 4)
    compile_and_compare(lambda x: (torch.floor(x) + 1, torch.round(x) * 2), x)
    assert host_ops(last_compiled().compiled.program) == []


def test_rounding_to_decimals_stays_the_call():
    x = special((3, 4), seed=12)
    compile_and_compare(lambda x: torch.round(x, decimals=2) + 1, x)
    assert host_ops(last_compiled().compiled.program) == ["aten.round.decimals"]


def division_operands():
    a = special((7, 9), seed=13)
    b = special((7, 9), seed=14)
    a.view(-1)[5:14] = torch.tensor([-1.4, 1.4, -0.7, 2.1, -3.0, 3.0, 5.0, -5.0, 1e-30])
    b.view(-1)[5:14] = torch.tensor([0.7, -0.7, 0.7, -0.7, 2.0, -2.0, 0.0, -0.0, 3.0])
    return a, b


def test_fmod_remainder_and_floor_division_give_pytorchs_values():
    """Both zeros (a zero remainder keeps the dividend's sign; numpy's would take the
    divisor's), infinities, NaN, zero divisors, exact multiples, negative divisors."""
    a, b = division_operands()

    def f(a, b):
        return (
            torch.fmod(a, b),
            torch.remainder(a, b),
            torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b, rounding_mode="trunc"),
            a // b,
            torch.remainder(a, -0.7),
            torch.fmod(a, 2.5),
            torch.div(a, -1.5, rounding_mode="floor"),
        )

    got = compile_and_compare(f, a, b)
    for g, w in zip(got, f(a, b), strict=True):
        num = ~w.isnan()  # a NaN's sign bit is not part of its value
        assert torch.equal(g.cpu().signbit()[num], w.signbit()[num])
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(f, a, b)) == []


def test_integer_division_modes_stay_the_call():
    """A zero integer divisor raises in PyTorch; a kernel cannot, so they stay the op."""
    a, b = torch.arange(-6, 6), torch.tensor([3, -2, 5, 1] * 3)
    compile_and_compare(lambda a, b: (a // b + 1, torch.remainder(a, b) * 2), a, b)
    ops = host_ops(last_compiled().compiled.program)
    assert ops == ["aten.floor_divide.default", "aten.remainder.Tensor"], ops


@pytest.mark.parametrize(
    "call",
    [
        dict(scale_factor=2),
        dict(scale_factor=(3, 2)),
        dict(size=(8, 15)),  # 4 x 5 -> factors 2 and 3
    ],
)
def test_nearest_upsampling_by_whole_factors_is_a_broadcast(call):
    """PyTorch decomposes nearest upsampling into an index with computed positions; where
    they are arange(k * n) // k (checked exactly at import), the result is x with each
    element repeated k times: a View, an Expand and a View (one copy kernel)."""
    x = special((2, 3, 4, 5), seed=15)

    def f(x):
        return torch.nn.functional.interpolate(x, **call) * 2

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(f, x)) == []


def test_nearest_upsampling_of_other_ranks_and_a_fractional_size():
    x1 = special((2, 3, 6), seed=16)
    compile_and_compare(lambda x: torch.nn.functional.interpolate(x, scale_factor=4), x1)
    assert host_ops(last_compiled().compiled.program) == []
    x3 = special((1, 2, 3, 2, 4), seed=17)
    compile_and_compare(lambda x: torch.nn.functional.interpolate(x, scale_factor=2), x3)
    assert host_ops(last_compiled().compiled.program) == []
    # 4 -> 6 rows is not a whole factor: PyTorch's index stays the op (values as PyTorch)
    x = special((1, 2, 4, 4), seed=18)
    compile_and_compare(lambda x: torch.nn.functional.interpolate(x, size=(6, 8)), x)
    assert any("index.Tensor" in op for op in host_ops(last_compiled().compiled.program))


def test_an_index_that_is_not_a_repeat_is_a_take():
    """Not a repeat (an input, or a constant that does not repeat evenly): a row take
    (tests/compile/test_takes.py), not views."""
    x = special((5, 4), seed=19)
    idx = torch.tensor([0, 0, 1, 3, 3, 2])
    compile_and_compare(lambda x, i: x[i] + 1, x, idx)  # an input: not a constant
    compile_and_compare(lambda x: x[torch.tensor([0, 0, 1, 1, 2, 3], device=x.device)], x)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and "gather" in [k.kind for k in prog.kernels]


CAT_CASES = {
    "equal halves, last axis": lambda a, b: torch.cat([a, b * 2], -1),
    "rotate half": lambda a, b: torch.cat([-a[..., 3:], a[..., :3]], -1) * b,
    "lengths 2 and 4": lambda a, b: torch.cat([a[:, :2], b[:, :4]], 1),
    "three inputs, first axis": lambda a, b: torch.cat([a, b, a - b], 0),
    "stack": lambda a, b: torch.stack([a, b], 1) + 1,
    "promoted dtypes": lambda a, b: torch.cat([a, (b > 0).to(torch.int64)], 1),
    "repeat": lambda a, b: a.repeat(2, 1, 3) - b.repeat(1, 3),
}


@pytest.mark.parametrize("case", sorted(CAT_CASES))
def test_concatenation_selects_among_equal_pieces(case):
    """cat as Where over pieces of gcd length viewed with a new axis (broadcasts), merged
    by a View; repeat as a tiled Expand: copies of elements, special values included."""
    fn = CAT_CASES[case]
    a, b = special((4, 6), seed=20), special((4, 6), seed=21)
    compile_and_compare(fn, a, b)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(fn, a, b)) == []


def test_concatenation_of_many_pieces_is_a_concat_kernel():
    """Lengths 3 and 4 cut into 7 pieces of 1: each output element would load all seven,
    so it is not a selection but a two-operand concatenation kernel
    (tests/compile/test_movement.py)."""
    a, b = special((2, 3), seed=22), special((2, 4), seed=23)
    compile_and_compare(lambda a, b: torch.cat([a, b], 1) + 1, a, b)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and [k.kind for k in prog.kernels] == ["concat", "loop"]


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argmax_and_argmin_give_the_first_extreme(kind):
    """The first index of the row's extreme; a row with NaN gives its first NaN; ties
    (both zeros, repeated values) the first of them; infinities as values."""
    fn = getattr(torch, kind)
    x = torch.randn(6, 7)
    x[0, 2] = x[0, 5] = float("nan")  # two NaN: the first
    x[1] = torch.tensor([-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0])  # all ties
    x[2, 1] = x[2, 4] = float("inf")
    x[2, 3] = x[2, 6] = float("-inf")
    x[3] = 3.0  # a constant row
    x[4, 0] = float("nan")

    def f(x):
        return fn(x, 1), fn(x, 0, keepdim=True), fn(x), fn(x.to(torch.int64), -1)

    compile_and_compare(f, x)
    assert host_ops(last_compiled().compiled.program) == []
    assert host_ops(gpu_program(f, x)) == []


def test_argmax_over_all_axes_kept_stays_the_op():
    x = special((3, 4), seed=24)
    compile_and_compare(lambda x: torch.argmax(x, keepdim=True) + 1, x)
    assert host_ops(last_compiled().compiled.program) == ["aten.argmax.default"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_norms_without_a_weight_or_a_bias(dtype, affine):
    """A missing weight or bias is an exact stand-in (1 or -0.0), on the device and in
    PyTorch's own kernel where the norm is a host op (half types on saturn:0): layer norm,
    group norm, nn.LayerNorm(bias=False)."""
    g = torch.Generator().manual_seed(1)
    x = special((3, 4, 8)).to(dtype)
    p8, p4 = torch.randn(8, generator=g).to(dtype), torch.randn(4, generator=g).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    if affine == "none":
        compile_and_compare(lambda x: nnf.layer_norm(x, (8,)), x, rtol=tol, atol=tol)
        compile_and_compare(lambda x: nnf.group_norm(x, 2), x, rtol=tol, atol=tol)
    elif affine == "weight":
        compile_and_compare(lambda x, w: nnf.layer_norm(x, (8,), w), x, p8, rtol=tol, atol=tol)
        compile_and_compare(lambda x, w: nnf.group_norm(x, 2, w), x, p4, rtol=tol, atol=tol)
        ln = torch.nn.LayerNorm(8, bias=False).to(dtype)
        compile_and_compare(ln, x, rtol=tol, atol=tol)
    else:
        fn = lambda x, b: nnf.layer_norm(x, (8,), None, b)  # noqa: E731
        compile_and_compare(fn, x, p8, rtol=tol, atol=tol)
        compile_and_compare(lambda x, b: nnf.group_norm(x, 2, None, b), x, p4, rtol=tol, atol=tol)
