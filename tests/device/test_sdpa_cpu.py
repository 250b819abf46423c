"""``attention`` on saturn tensors without a GPU: which kernel the device
chooses (the fused op for half types, aten's math for the rest), the fused op's eager and
compiled forms on saturn:0 equal to eager CPU, and the compiled graph's fused branch (the
custom ops a GPU runs) written and computed as the math computes it."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.functional import scaled_dot_product_attention as attention

import saturn
from saturn import backend, sdpa
from saturn.codegen.attention import AttentionError, check_bias
from saturn.codegen.gemm import Layout
from saturn.custom_ops import fallback_counts

from .test_fused_attention_cpu import packed

REF = torch.device("saturn:0")
FUSED = "aten._scaled_dot_product_fused_attention_overrideable.default"
# bfloat16 results: the math rounds once (float32 inside); half an ulp of values up to 4
TOL = {torch.bfloat16: (1.6e-2, 1.6e-2), torch.float16: (2e-3, 2e-3)}


def operands(dtype=torch.bfloat16, b=2, h=4, hk=4, s=16, sk=16, d=16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(b, h, s, d).to(dtype)
    k = torch.randn(b, hk, sk, d).to(dtype)
    v = torch.randn(b, hk, sk, d).to(dtype)
    return q, k, v


def chosen(*args, **kwargs) -> set[str]:
    """The ATen attention ops aten calls for these saturn:0 operands."""
    g = make_fx(lambda *xs: attention(*xs, **kwargs))(*args)
    return {str(n.target) for n in g.graph.nodes if "attention" in str(n.target)}


CASES = {
    "plain": ({}, None),
    "causal": ({"is_causal": True}, None),
    "float-mask": ({}, "float"),
    "bool-mask": ({}, "bool"),
    "gqa-causal": ({"is_causal": True, "enable_gqa": True}, None),
    "scaled": ({"scale": 0.3}, "float"),
}


def case_args(name: str, dtype=torch.bfloat16):
    kwargs, mask = CASES[name]
    q, k, v = operands(dtype, hk=2 if "gqa" in name else 4)
    args = [q, k, v]
    if mask == "float":
        args.append(torch.randn(2, 1, 16, 16).to(dtype))
    elif mask == "bool":
        args.append(torch.rand(2, 1, 1, 16) > 0.3)
    return args, kwargs


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types_choose_the_fused_op(name, dtype):
    args, kwargs = case_args(name, dtype)
    assert FUSED in chosen(*(a.to(REF) for a in args), **kwargs)


@pytest.mark.parametrize(
    "why,dtype,change",
    [
        ("float32", torch.float32, {}),
        ("dropout", torch.bfloat16, {"dropout_p": 0.1}),
        ("odd head size", torch.bfloat16, {"d": 12}),
        ("head size over 256", torch.bfloat16, {"d": 264}),
        ("a float32 mask on bfloat16", torch.bfloat16, {"mask": torch.float32}),
        ("a gradient", torch.bfloat16, {"grad": True}),
        ("fewer key heads without enable_gqa", torch.bfloat16, {"hk": 2}),
    ],
)
def test_the_rest_keeps_the_math(why, dtype, change):
    q, k, v = operands(dtype, d=change.get("d", 16), hk=change.get("hk", 4))
    args = [t.to(REF) for t in (q, k, v)]
    kwargs = {"dropout_p": change["dropout_p"]} if "dropout_p" in change else {}
    if "mask" in change:
        args.append(torch.zeros(2, 1, 16, 16, dtype=change["mask"], device=REF))
    if change.get("grad"):
        args[0].requires_grad_(True)
    try:
        ops = chosen(*args, **kwargs)
    except RuntimeError:  # aten's math refuses the heads, as on the CPU
        assert why.startswith("fewer key heads")
        return
    assert FUSED not in ops, (why, ops)


def cpu_reference(args, kwargs):
    """Eager CPU attention in float32 (the mask as aten turns a boolean one into a bias)."""
    xs = [a.float() if a.is_floating_point() else a for a in args]
    return attention(*xs, **kwargs)


@pytest.mark.parametrize("name", list(CASES))
def test_eager_fused_op_on_saturn0_matches_eager_cpu(name):
    args, kwargs = case_args(name)
    got = attention(*(a.to(REF) for a in args), **kwargs)
    want = cpu_reference(args, kwargs)
    assert got.device == REF and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), want, rtol=0, atol=TOL[torch.bfloat16][1])
    # the op's log-sum-exp: float32 rows of the scaled, masked scores
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    res = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        *(a.to(REF) for a in (q, k, v)),
        None if mask is None else _bias(mask, q.dtype).to(REF),
        is_causal=kwargs.get("is_causal", False),
        scale=kwargs.get("scale"),
    )
    scale = kwargs.get("scale", q.shape[-1] ** -0.5)
    kk = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q.float() @ kk.transpose(-2, -1) * scale
    if kwargs.get("is_causal"):
        s = s.masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s + _bias(mask, q.dtype).float()
    torch.testing.assert_close(res[1].cpu(), torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)
    assert res[4] == 16 and res[5] == 16 and res[6].device == REF


def test_three_dimensional_operands_are_one_batch():
    q, k, v = (t[0] for t in operands())
    dq, dk, dv = (t.to(REF) for t in (q, k, v))
    assert FUSED in chosen(dq, dk, dv, is_causal=True)
    want = cpu_reference([q, k, v], {"is_causal": True})
    got = attention(dq, dk, dv, is_causal=True)
    assert got.shape == (4, 16, 16)
    torch.testing.assert_close(got.cpu().float(), want, rtol=0, atol=TOL[torch.bfloat16][1])
    got, _ = compiled_graphs(lambda *xs: attention(*xs, is_causal=True), [dq, dk, dv])
    torch.testing.assert_close(got.cpu().float(), want, rtol=0, atol=TOL[torch.bfloat16][1])
    torch._dynamo.reset()


def _bias(mask: torch.Tensor, dtype) -> torch.Tensor:
    """aten's boolean mask conversion: 0 where kept, -inf where masked."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))


def compiled_graphs(fn, args):
    """Compile ``fn`` for saturn:0, run it, and return (result, imported FX op targets)."""
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    ex = saturn.explain(fn, *args)
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    out = torch.compile(fn, backend="saturn", dynamic=False)(*args)
    assert backend.CACHE.fallbacks[before:] == []
    return out, ex


@pytest.mark.parametrize("name", ["causal", "float-mask", "gqa-causal"])
def test_compiled_attention_on_saturn0_is_the_math_it_was(name):
    """On saturn:0 the compiled op writes aten's math out: the same imported graph as when
    the device chose the math itself (the log-sum-exp result is dropped, unused)."""
    args, kwargs = case_args(name)
    dargs = [a.to(REF) for a in args]

    def fn(*xs):
        return attention(*xs, **kwargs) * 2

    got, ex = compiled_graphs(fn, dargs)
    torch.testing.assert_close(
        got.cpu().float(), 2 * cpu_reference(args, kwargs), rtol=0, atol=2 * TOL[torch.bfloat16][1]
    )
    graph = str(ex).split("imported graph:")[1].split("\n\n")[0]
    torch._C._set_sdp_use_overrideable(False)
    try:
        _, math_ex = compiled_graphs(fn, dargs)
    finally:
        torch._C._set_sdp_use_overrideable(True)
    math_graph = str(math_ex).split("imported graph:")[1].split("\n\n")[0]
    assert graph.count("(let ") == math_graph.count("(let "), (graph, math_graph)
    assert graph.count("BatchMatMul") == 2  # no third product for the log-sum-exp
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["plain", "causal", "float-mask", "bool-mask", "gqa-causal"])
def test_the_fused_branch_writes_the_custom_op_and_computes_the_math(name, monkeypatch):
    """Where the fused kernel takes the operands (a GPU with cuDNN; here saturn:0 is made to
    count as one, the layout checks are real), the compiled graph calls ``saturn::sdpa`` or
    ``saturn::sdpa_bias`` with key and value heads expanded and the mask broadcast to what
    the kernel reads; on saturn:0 their reference runs (counted) and equals eager CPU."""
    monkeypatch.setattr(sdpa, "on_fused_device", lambda *ts: True)
    args, kwargs = case_args(name)
    op = "saturn::sdpa_bias" if len(args) > 3 else "saturn::sdpa"
    before = fallback_counts().get(op, 0)

    def fn(*xs):
        return attention(*xs, **kwargs)

    got, ex = compiled_graphs(fn, [a.to(REF) for a in args])
    assert op.replace("::", ".") in str(ex)
    assert fallback_counts()[op] > before  # the reference ran: saturn:0 has no fused kernel
    torch.testing.assert_close(
        got.cpu().float(), cpu_reference(args, kwargs), rtol=0, atol=TOL[torch.bfloat16][1]
    )
    torch._dynamo.reset()


def test_heads_and_masks_as_the_kernel_reads_them():
    q, k, _ = operands(hk=2)
    e = sdpa.expand_heads(q, k)
    assert e.shape == q.shape
    assert torch.equal(e, k.repeat_interleave(2, dim=1))  # enable_gqa's head order
    assert sdpa.expand_heads(q, q) is q
    m = torch.randn(16, 16)
    b = sdpa.bias4(q, k, m)
    assert b.shape == (1, 1, 16, 16) and torch.equal(b[0, 0], m)
    pad = torch.randn(2, 1, 1, 16).expand(2, 1, 16, 16)  # a padding mask's broadcast rows
    b = sdpa.bias4(q, k, pad)
    assert b.shape == (2, 1, 16, 16) and b.is_contiguous() and torch.equal(b, pad)


@pytest.mark.parametrize(
    "bias,message",
    [
        (packed("f16", (2, 1, 16, 16)), "the bias is f16; q is bf16"),
        (packed("bf16", (16, 16)), "the bias must be"),
        (packed("bf16", (3, 1, 16, 16)), "bias \\[3, 1, 16, 16\\]"),
        (packed("bf16", (2, 1, 1, 16)), "bias \\[2, 1, 1, 16\\]"),
        (Layout("bf16", (2, 1, 16, 16), (256, 256, 1, 16)), "not packed"),
        (Layout("bf16", (2, 1, 16, 16), (16, 16, 0, 1)), "not packed"),  # broadcast rows
    ],
)
def test_the_fused_kernel_refuses_biases_it_cannot_read(bias, message):
    q = packed("bf16", (2, 4, 16, 16))
    check_bias(q, q, packed("bf16", (2, 4, 16, 16)))  # a full bias is taken
    with pytest.raises(AttentionError, match=message):
        check_bias(q, q, bias)


def test_without_a_gpu_the_fused_kernel_takes_nothing():
    q, k, v = (t.to(REF) for t in operands())
    assert not sdpa.fused_takes(q, k, v)
    assert not sdpa.fused_takes(*operands())


@pytest.mark.parametrize("op", ["saturn::sdpa", "saturn::sdpa_bias"])
def test_the_custom_ops_pass_their_arguments_through(op, monkeypatch):
    """Eager calls on saturn:0 ask the fused kernel's check (it says no: no GPU) and run the
    reference; the host function a GPU step calls hands the fused kernel the bias, scale
    and causal flag in their places, and runs the math where the plan is refused."""
    q, k, v = operands()
    bias = torch.randn(1, 1, 16, 16).to(torch.bfloat16)
    qt = q.transpose(1, 2)  # the ops take q and give the result as [B, Sq, H, D]
    args = (qt, k, v, bias, 0.3) if op.endswith("bias") else (qt, k, v, 0.3, True)
    want = (
        sdpa.reference(q, k, v, bias, 0.3)
        if op.endswith("bias")
        else (sdpa.reference(q, k, v, None, 0.3, True))
    ).transpose(1, 2)
    fn = getattr(torch.ops.saturn, op.split("::")[1])
    before = fallback_counts().get(op, 0)
    got = fn(*(a.to(REF) if isinstance(a, torch.Tensor) else a for a in args))
    assert fallback_counts()[op] == before + 1
    assert torch.equal(got.cpu(), want)
    seen = []
    monkeypatch.setattr(sdpa, "_run_fused", lambda *a: seen.append(a[4:]) or False)
    out = torch.empty(qt.shape, dtype=q.dtype, device=REF)
    sdpa._host(op)(out, *(a.to(REF) if isinstance(a, torch.Tensor) else a for a in args))
    ((b, scale, causal),) = seen
    assert (b is not None, scale, causal) == (
        (True, 0.3, False) if op.endswith("bias") else (False, 0.3, True)
    )
    assert fallback_counts()[op] == before + 2 and torch.equal(out.cpu(), want)
