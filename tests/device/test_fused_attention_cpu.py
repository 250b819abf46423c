"""``saturn::attention`` without a GPU: its reference is the unfused product, the fused
kernel's operand checks refuse what cuDNN does not take (each with its reason), and the
encoder's fast path keeps the unfused product wherever the fused kernel does not run."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn.codegen.attention import AttentionError, check_operands
from saturn.codegen.gemm import Layout
from saturn.custom_ops import fallback_counts
from saturn.fused_attention import fused_attention_takes, unfused

REF = torch.device("saturn:0")


def packed(dtype: str, shape) -> Layout:
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return Layout(dtype, tuple(shape), tuple(reversed(st)))


def qkv(dtype=torch.bfloat16, shape=(2, 4, 16, 8), seed=0):
    torch.manual_seed(seed)
    return [torch.randn(shape).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_reference_is_the_unfused_product(dtype):
    q, k, v = qkv(dtype)
    before = fallback_counts().get("saturn::attention", 0)
    got = torch.ops.saturn.attention(q, k, v, 0.3)
    want = torch.softmax((q * 0.3) @ k.transpose(-2, -1), dim=-1) @ v
    assert torch.equal(got, want)
    assert torch.equal(unfused(q, k, v, 0.3), want)
    # CPU tensors: the fused kernel cannot run, the reference did (counted)
    assert fallback_counts()["saturn::attention"] == before + 1


def test_saturn0_runs_the_reference_eager_and_compiled():
    q, k, v = qkv()
    want = unfused(q, k, v, 0.25)
    before = fallback_counts().get("saturn::attention", 0)
    got = torch.ops.saturn.attention(*(t.to(REF) for t in (q, k, v)), 0.25)
    assert got.device == REF and torch.equal(got.cpu(), want)

    def f(q, k, v):
        return torch.ops.saturn.attention(q, k, v, 0.25) * 2

    torch._dynamo.reset()
    got = torch.compile(f, backend="saturn", dynamic=False)(*(t.to(REF) for t in (q, k, v)))
    # the compiled graph's custom step ran the reference over bfloat16 host memory
    assert torch.equal(got.cpu(), want * 2)
    assert fallback_counts()["saturn::attention"] == before + 2


def test_the_fused_kernel_does_not_take_the_reference_device_or_float32():
    q, k, v = qkv()
    assert not fused_attention_takes(q, k, v)  # CPU
    assert not fused_attention_takes(*(t.to(REF) for t in (q, k, v)))  # saturn:0
    q, k, v = qkv(torch.float32)
    assert not fused_attention_takes(*(t.to(REF) for t in (q, k, v)))


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(dtype="f32"), "float16 and bfloat16"),
        (dict(q=(2, 4, 16)), "batch, heads, sequence, head"),
        (dict(k=(2, 3, 16, 8)), "differ in batch or heads"),
        (dict(k=(2, 4, 16, 16), v=(2, 4, 16, 16)), "does not pair"),
        (dict(q=(2, 4, 16, 12), k=(2, 4, 16, 12), v=(2, 4, 16, 12)), "multiple of 8"),
        (dict(q=(1, 1, 4, 264), k=(1, 1, 4, 264), v=(1, 1, 4, 264)), "up to 256"),
        (dict(strided="v"), "not contiguous"),
        (dict(out=(2, 4, 8, 8)), "output"),
    ],
)
def test_operand_checks_refuse_with_a_reason(change, reason):
    dtype = change.get("dtype", "bf16")
    shapes = {n: change.get(n, (2, 4, 16, 8)) for n in ("q", "k", "v")}
    lay = {n: packed(dtype, s) for n, s in shapes.items()}
    out = packed(dtype, change.get("out", (*shapes["q"][:-1], shapes["v"][-1])))
    if change.get("strided"):
        t = lay[change["strided"]]
        lay[change["strided"]] = Layout(t.dtype, t.shape, (*t.strides[:3], 2))
    with pytest.raises(AttentionError, match=reason):
        check_operands(lay["q"], lay["k"], lay["v"], out)


def test_operand_checks_take_a_packed_projections_heads_in_place():
    # q, k, v as the encoder reads them: [B, S, 3E] projection, heads [B, H, S, D] by strides
    b, s, h, d = 2, 16, 4, 8
    e = h * d
    strides = (s * 3 * e, d, 3 * e, 1)
    lay = Layout("bf16", (b, h, s, d), strides)
    check_operands(lay, lay, lay, packed("bf16", (b, h, s, d)))


def test_the_encoder_keeps_the_unfused_product_on_the_reference_device():
    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    layer = layer.to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 32).to(torch.bfloat16)
    with torch.no_grad():
        e = saturn.explain(layer.to(REF), x.to(REF))
    text = "\n".join(g.program_text for g in e.graphs)
    assert "attention" not in text and "Softmax" in text, text
