"""Compiled float16/bfloat16 graphs on the GPU (marker gpu, decision 0032): fused loops that
round after every op give eager's bits, products run cuBLASLt with float32 accumulation,
and ops whose fusion would change rounding stay as PyTorch computes them; values against
eager PyTorch on the CPU, with proof of where the work ran."""

from __future__ import annotations

import copy

import pytest
import torch

import saturn
from saturn import backend

pytestmark = pytest.mark.gpu
GPU = "saturn:1"
HALVES = [torch.float16, torch.bfloat16]
TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}  # ~2 units of rounding


def compile_last(fn, *args):
    """(compiled fn, its second call's result on args, the recipe it ran, the fallback
    counts before that call). The first call compiles (tracing may run an op without a
    meta kernel through the fallback, on fake values' stand-ins); the second runs the
    recipe alone."""
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    cfn = torch.compile(fn, backend="saturn", dynamic=False)
    cfn(*args)
    assert backend.CACHE.compiles == compiles + 1
    fb = saturn.fallback_counts()
    out = cfn(*args)
    recipe = list(backend.CACHE.items.values())[-1].recipe
    return cfn, out, recipe, fb


@pytest.mark.parametrize("dtype", HALVES)
def test_a_fused_half_chain_gives_eagers_bits(dtype):
    torch.manual_seed(0)
    x, y = torch.randn(256, 96).to(dtype), torch.randn(256, 96).to(dtype)

    def f(x, y):
        a = x + y
        return a * torch.exp(a * 0.25) - 1.5

    xd, yd = x.to(GPU), y.to(GPU)
    eager = f(xd, yd)  # saturn's eager kernels: each op rounded to the half type
    _, got, recipe, fb = compile_last(f, xd, yd)
    prog = recipe.program
    assert [k.kind for k in prog.kernels] == ["loop"], prog.to_text()
    assert prog.count("host") == 0 and recipe.last.crossings == 0
    assert saturn.fallback_counts() == fb
    assert got.dtype == dtype and torch.equal(got.cpu(), eager.cpu())
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu(), f(x, y), rtol=rtol, atol=atol)


def test_bfloat16_stores_round_as_pytorchs_cpu_conversion_bit_for_bit():
    """A fused loop storing bfloat16 (the hardware's ``cvt.rn.bf16.f32`` from 8.0,
    decision 0114) and saturn's eager cast give the CPU conversion's bits for ordinary
    values, ties both ways, values past the largest finite one, subnormals, both zeros and
    infinities, and any NaN as 0x7FFF: PyTorch's CUDA conversion bit for bit (its CPU
    conversion's NaN is 0xFFFF)."""
    specials = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, -3.4e38, 3.3961e38, 1e-40]
    specials += [-1e-40, 2**-133, 0.0, -0.0, float("inf"), float("-inf"), float("nan")]
    x = torch.randn(4096) * 4
    x[: len(specials)] = torch.tensor(specials)
    x[len(specials) : 2 * len(specials)] = -torch.tensor(specials).abs()  # a negative NaN

    def f(x):
        return (x * 1.0).to(torch.bfloat16)

    def bits(t):
        return t.cpu().view(torch.int16).to(torch.int32) & 0xFFFF

    want = bits(x.to(torch.bfloat16))
    want[x.isnan()] = 0x7FFF
    _, got, recipe, fb = compile_last(f, x.to(GPU))
    assert [k.kind for k in recipe.program.kernels] == ["loop"], recipe.program.to_text()
    assert saturn.fallback_counts() == fb
    assert torch.equal(bits(got), want)
    assert torch.equal(bits(x.to(GPU).to(torch.bfloat16)), want)
    if torch.cuda.is_available():
        assert torch.equal(bits(x.cuda().to(torch.bfloat16)), want)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_mlp_block_runs_library_products_and_replays(dtype):
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)
    ).to(dtype)
    x = torch.randn(4, 32, 64).to(dtype)

    def block(x):
        return x + mlp(x)

    with torch.no_grad():
        want = block(x)
        mlp.to(GPU)
        xd = x.to(GPU)
        eager = block(xd)
        cfn, got, recipe, fb = compile_last(block, xd)
        outs = [got, cfn(xd)]  # captured, replayed
    from saturn.codegen.cublaslt import LtPlan

    prog = recipe.program
    gemms = [k.attrs["epilogue"] for k in prog.kernels if k.kind == "gemm"]
    # cuBLASLt's half ReLU epilogue turns NaN into 0 (decision 0054): the ReLU is a loop
    assert gemms == ["bias", "bias"], prog.to_text()
    assert prog.count("host") == 0 and recipe.last.crossings == 0
    assert all(isinstance(p, LtPlan) for _, p in recipe.runner.plans.values())
    assert recipe.runner.replays >= 1
    assert saturn.fallback_counts() == fb
    rtol, atol = TOL[dtype]
    for out in outs:
        assert out.dtype == dtype
        torch.testing.assert_close(out.cpu(), want, rtol=rtol, atol=atol)
        torch.testing.assert_close(out.cpu(), eager.cpu(), rtol=rtol, atol=atol)


def test_mixed_precision_casts_run_on_the_device():
    torch.manual_seed(2)
    x, w, b = torch.randn(48, 64), torch.randn(96, 64) / 8, torch.randn(96)
    wb, bb = w.to(torch.bfloat16), b.to(torch.bfloat16)

    def f(x, w, b):
        return (torch.nn.functional.linear(x.to(torch.bfloat16), w, b).relu().float() * 2).sum(-1)

    _, got, recipe, fb = compile_last(f, x.to(GPU), wb.to(GPU), bb.to(GPU))
    prog = recipe.program
    assert prog.count("host") == 0 and recipe.last.crossings == 0, prog.to_text()
    assert saturn.fallback_counts() == fb
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), f(x, wb, bb), rtol=1.6e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_softmax_is_the_float32_softmax_rounded_once(dtype):
    # as PyTorch computes it (widened, float32 throughout, one rounding), on the device
    torch.manual_seed(3)
    x = (torch.randn(16, 40) * 4).to(dtype)

    def f(x):
        return torch.softmax(x * 2, -1) + x

    _, got, recipe, fb = compile_last(f, x.to(GPU))
    prog = recipe.program
    assert prog.count("host") == 0 and recipe.last.crossings == 0, prog.to_text()
    # one rows kernel: the softmax's reductions accumulate in float32, the result is rounded
    # to the half type once, at the store
    rows = [k for k in prog.kernels if k.kind == "rows"]
    assert len(rows) == 1, prog.to_text()
    assert rows[0].stages and all(s.acc_dtype == "f32" for s in rows[0].stages)
    assert rows[0].dtype == {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    assert saturn.fallback_counts() == fb
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu(), f(x), rtol=rtol, atol=atol)
    want = (torch.softmax((x * 2).float(), -1).to(dtype) + x).float()
    torch.testing.assert_close(got.cpu().float(), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_encoder_layer_runs_on_the_device(dtype):
    """Attention as one fused cuDNN kernel, the layer norms as float32 rows kernels of the
    widened values rounded once (as PyTorch computes them): nothing on the host."""
    torch.manual_seed(4)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    layer = layer.to(dtype).eval()
    x = torch.randn(2, 16, 64).to(dtype)
    with torch.no_grad():
        want = layer(x).float()
        layer.to(GPU)
        cfb = saturn.custom_ops.fallback_counts()
        cfn, got, recipe, fb = compile_last(layer, x.to(GPU))
        again = cfn(x.to(GPU))  # replayed
    assert torch.equal(again.cpu(), got.cpu())
    prog = recipe.program
    assert prog.count("host") == 0 and recipe.last.crossings == 0, prog.to_text()
    assert "gemm" in [k.kind for k in prog.kernels]
    # attention is one fused cuDNN kernel: no scores, no softmax of them
    fused = [k for k in prog.kernels if k.kind == "custom" and "attention" in k.attrs["name"]]
    assert len(fused) == 1, prog.to_text()
    assert [k.kind for k in prog.kernels].count("rows") == 2  # the two layer norms
    assert saturn.fallback_counts() == fb
    assert saturn.custom_ops.fallback_counts() == cfb
    err = (got.cpu().float() - want).abs().max().item()
    # a few roundings of the half type through the layer (values are O(1) after the norm)
    assert err < {torch.float16: 1e-2, torch.bfloat16: 6e-2}[dtype], err


@pytest.mark.parametrize("dtype", HALVES)
def test_half_reductions_compile_to_float32_accumulators(dtype):
    torch.manual_seed(5)
    x = torch.randn(64, 300).to(dtype)

    def f(x):
        return x.sum(1), x.mean(0), x.amax(1) - x.amin(1)

    _, got, recipe, fb = compile_last(f, x.to(GPU))
    prog = recipe.program
    assert prog.count("host") == 0 and recipe.last.crossings == 0, prog.to_text()
    reduces = [k for k in prog.kernels if k.kind == "reduce"]
    # what each accumulates: the epilogue's input when a cast back is fused, else its value
    assert reduces and all(k.attrs.get("acc_dtype", k.dtype) == "f32" for k in reduces)
    assert saturn.fallback_counts() == fb
    rtol, atol = TOL[dtype]
    for g, w in zip(got, f(x.float()), strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g.cpu(), w.to(dtype), rtol=rtol, atol=max(atol, rtol))


@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_conv_block_runs_cudnn_and_loops(dtype):
    """A half conv (with and without bias, grouped) + batch norm + ReLU block: the
    convolutions are cuDNN plans of the half type (float32 accumulation), a bias is added
    after the rounded product as eager CUDA adds it, and the batch norm is the float32
    norm of the widened values rounded once, fused into a loop; nothing on the host.
    Against eager CUDA in the half type and eager float32 on the CPU."""
    torch.manual_seed(6)
    block = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise, with a bias
        torch.nn.BatchNorm2d(16),
    ).eval()
    with torch.no_grad():
        for m in block:  # statistics that are not the identity
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 8, 20, 20)
    with torch.no_grad():
        want32 = block(x)
        half = block.to(dtype)
        cuda = copy.deepcopy(half).to("cuda")(x.to("cuda", dtype)).float().cpu()
        half.to(GPU)
        cfn, got, recipe, fb = compile_last(half, x.to(GPU, dtype))
        again = cfn(x.to(GPU, dtype))  # replayed
    assert torch.equal(again.cpu(), got.cpu())
    prog = recipe.program
    assert prog.count("host") == 0 and recipe.last.crossings == 0, prog.to_text()
    convs = [k for k in prog.kernels if k.kind == "conv"]
    name = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    assert len(convs) == 2 and all(k.dtype == name for k in convs), prog.to_text()
    assert not any(k.attrs["bias"] for k in convs), prog.to_text()  # added by a loop
    assert saturn.fallback_counts() == fb
    assert got.dtype == dtype
    err = (got.cpu().float() - want32).abs().max().item()
    eager_err = (cuda - want32).abs().max().item()
    assert err <= 2 * max(eager_err, 1e-3), (err, eager_err)
