"""Attention written out in PyTorch (``softmax(q @ k^T * c [+ mask]) @ v``) found by the
e-graph and compiled as one ``saturn::attention`` (or ``saturn::attention_bias``) kernel
(``device/attention.egg``, opt-in: rewrites=["attention"]), with results equal to eager
CPU's, in hand-written forms and in real models (timm's ViT, Hugging Face BERT, GPT-2 and T5
with eager attention); and every form the pattern must not take left written out: another
softmax axis, a mask that widens the scores or is not float32, a boolean mask applied by
``masked_fill``, dropout, a value head size unlike the query's, float64, a scale that is not
finite, and the ruleset not asked for."""

from __future__ import annotations

import pytest
import torch

import saturn  # noqa: F401
from saturn import backend
from saturn.custom_ops import fallback_counts

F = torch.nn.functional


def last_program():
    return list(backend.CACHE.items.values())[-1].compiled.program


def attention_kernels(prog, name: str = "saturn::attention") -> list:
    return [k for k in prog.kernels if k.kind == "custom" and k.attrs["name"] == name]


def any_attention(prog) -> list:
    return attention_kernels(prog) + attention_kernels(prog, "saturn::attention_bias")


def written(q, k, v, c: float = 0.125):
    return torch.softmax(q @ k.transpose(-2, -1) * c, dim=-1) @ v


def compiled(fn, dev: str, args, rewrites=("attention",)):
    torch._dynamo.reset()
    g = torch.compile(fn, backend="saturn", options={"rewrites": list(rewrites)}, dynamic=False)
    before = len(backend.CACHE.fallbacks)
    out = g(*(a.to(dev) for a in args))
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    return out, last_program()


def qkv(b=2, h=4, s=16, t=24, d=32, dv=None, kv_batch=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, s, d, generator=gen, dtype=dtype)
    k = torch.randn(kv_batch or b, h, t, d, generator=gen, dtype=dtype)
    v = torch.randn(kv_batch or b, h, t, dv or d, generator=gen, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("shape", [{}, {"s": 1, "t": 77, "d": 8}, {"b": 1, "h": 12, "s": 197}])
def test_written_out_attention_is_one_kernel(dev, shape):
    args = qkv(**shape)
    calls = fallback_counts().get("saturn::attention", 0)
    got, prog = compiled(written, dev, args)
    torch.testing.assert_close(got.cpu(), written(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog)) == 1 and len(prog.kernels) == 1, prog.to_text()
    assert prog.count("host") == 0
    ran_reference = fallback_counts().get("saturn::attention", 0) - calls
    assert ran_reference == (1 if dev == "saturn:0" else 0)  # saturn:0 runs its reference


def test_a_broadcast_key_and_value_are_read_through_their_expand():
    args = qkv(b=3, kv_batch=1)

    def f(q, k, v):
        return written(q, k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1))

    got, prog = compiled(f, "saturn:0", args)
    torch.testing.assert_close(got.cpu(), f(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog)) == 1, prog.to_text()


def declined(fn, args, rewrites=("attention",)):
    got, prog = compiled(fn, "saturn:0", args, rewrites)
    assert attention_kernels(prog) == [], prog.to_text()
    return got


@pytest.mark.parametrize(
    "form",
    [
        "no-rewrites",
        "softmax-over-queries",
        "mask-widens-the-scores",
        "float64-mask",
        "masked-fill",
        "value-head-size",
        "float64",
        "inf",
        "divided-by-6",
    ],
)
def test_the_pattern_declines_what_it_does_not_take(form):
    args = qkv(dv=16) if form == "value-head-size" else qkv()
    if form == "float64":
        args = qkv(dtype=torch.float64)
    if form == "mask-widens-the-scores":  # one query row, a mask of five: five output rows
        args = (*qkv(s=1), torch.randn(2, 4, 5, 24))
    if form == "float64-mask":  # promotes the scores to float64
        args = (*args, torch.randn(2, 1, 1, 24, dtype=torch.float64))
    if form == "masked-fill":
        args = (*args, torch.rand(2, 1, 16, 24) < 0.8)
    fns = {
        "no-rewrites": written,
        "softmax-over-queries": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -2) @ v,
        "mask-widens-the-scores": lambda q, k, v, m: torch.softmax(scores(q, k) + m, -1) @ v,
        "float64-mask": lambda q, k, v, m: torch.softmax(scores(q, k) + m, -1).float() @ v,
        "masked-fill": lambda q, k, v, m: (
            torch.softmax(scores(q, k).masked_fill(~m, float("-inf")), -1) @ v
        ),
        "value-head-size": written,
        "float64": written,
        "inf": lambda q, k, v: written(q, k, v, float("inf")),
        # a division by what is not a power of two is not a product: declined
        "divided-by-6": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / 6.0, -1) @ v,
    }
    fn = fns[form]
    got = declined(fn, args, rewrites=() if form == "no-rewrites" else ("attention",))
    want = fn(*args)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


def scores(q, k, c: float = 0.125):
    return q @ k.transpose(-2, -1) * c


LOWEST = torch.finfo(torch.float32).min
MASKS = {  # name -> (mask shape, as a model writes it)
    "padding [B,1,1,T]": (2, 1, 1, 24),
    "causal [1,1,S,T]": (1, 1, 16, 24),
    "per-head [1,H,S,T]": (1, 4, 16, 24),
    "rank 2 [S,T]": (16, 24),
}


def a_mask(shape) -> torch.Tensor:
    """Model-style: 0 where a key is read, the lowest float32 where it is masked."""
    keep = torch.rand(*shape, generator=torch.Generator().manual_seed(1)) < 0.8
    return torch.zeros(shape).masked_fill(~keep, LOWEST)


MASKED_FORMS = {
    "scores + mask": lambda q, k, v, m: torch.softmax(scores(q, k) + m, -1) @ v,
    "mask + scores": lambda q, k, v, m: torch.softmax(m + scores(q, k), -1) @ v,
    "unscaled + mask": lambda q, k, v, m: torch.softmax(q @ k.transpose(-2, -1) + m, -1) @ v,
    "query scaled + mask": lambda q, k, v, m: (
        torch.softmax((q * 0.3) @ k.transpose(-2, -1) + m, -1) @ v
    ),
    "two masks": lambda q, k, v, m: torch.softmax(scores(q, k) + m + m * 0.5, -1) @ v,
    # divided by sqrt(64): a product by 1/8 (simplify's div-power-of-two, exact)
    "scores / 8 + mask": lambda q, k, v, m: (
        torch.softmax(q @ k.transpose(-2, -1) / 8.0 + m, -1) @ v
    ),
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("form", list(MASKED_FORMS))
def test_masked_attention_is_one_kernel(dev, form, mask):
    fn, args = MASKED_FORMS[form], (*qkv(), a_mask(MASKS[mask]))
    calls = fallback_counts().get("saturn::attention_bias", 0)
    got, prog = compiled(fn, dev, args)
    torch.testing.assert_close(got.cpu(), fn(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog, "saturn::attention_bias")) == 1, prog.to_text()
    # nothing else but the two masks' sum
    assert len(prog.kernels) == (2 if form == "two masks" else 1), prog.to_text()
    assert prog.count("host") == 0
    ran_reference = fallback_counts().get("saturn::attention_bias", 0) - calls
    assert ran_reference == (1 if dev == "saturn:0" else 0)


def test_unscaled_attention_is_one_kernel():
    args = qkv()

    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    got, prog = compiled(f, "saturn:0", args)
    torch.testing.assert_close(got.cpu(), f(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog)) == 1 and len(prog.kernels) == 1, prog.to_text()


def test_dropout_between_the_products_declines():
    args = qkv()

    def f(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1)
        return F.dropout(p, 0.5, training=True) @ v

    got = declined(f, args)
    assert got.shape == (2, 4, 16, 32)


def test_the_query_scaled_first_is_the_same_kernel():
    args = qkv()

    def f(q, k, v):
        return torch.softmax((q * 0.125) @ k.transpose(-2, -1), dim=-1) @ v

    got, prog = compiled(f, "saturn:0", args)
    torch.testing.assert_close(got.cpu(), f(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog)) == 1 and len(prog.kernels) == 1, prog.to_text()


def test_timms_unfused_attention_becomes_the_kernel():
    """timm's ViT with its fused path off writes attention out as ``(q * scale) @ k^T``, a
    softmax and a product: each block's becomes one kernel, and the model's output is
    eager's."""
    timm = pytest.importorskip("timm", reason="the zoo extra is not installed")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2).eval()
    for block in model.blocks:
        block.attn.fused_attn = False
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        got, prog = compiled(model.to("saturn:0"), "saturn:0", (x,))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog)) == 2, prog.to_text()


# name -> (config class, model class, a small configuration); eager attention for each
HF_MODELS = {
    "bert": (
        "BertConfig",
        "BertModel",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2Model",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=32, use_cache=False, eos_token_id=0),
    ),
    "t5": (
        "T5Config",
        "T5EncoderModel",
        dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
    ),
}


def hf_model(name: str):
    """A small Hugging Face model of ``name`` with eager (written-out) attention, and its
    inputs: token ids and a padding mask (the second sequence's last four tokens padded)."""
    tf = pytest.importorskip("transformers", reason="the zoo extra is not installed")
    torch.manual_seed(0)
    config, model_class, kwargs = HF_MODELS[name]
    cfg = getattr(tf, config)(**kwargs, vocab_size=100, bos_token_id=0, attn_implementation="eager")
    model = getattr(tf, model_class)(cfg)
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    pad = torch.ones(2, 12, dtype=torch.long)
    pad[1, 8:] = 0
    return model.eval(), ids, pad


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_hugging_face_eager_attention_becomes_the_kernel(name):
    """BERT's and GPT-2's eager attention (scores scaled, plus the padding or causal mask)
    and T5's (unscaled, plus its position bias and the padding mask): each layer's
    attention becomes one masked kernel, and the model's output is eager's."""
    model, ids, pad = hf_model(name)

    def f(ids, pad):
        return model(ids, attention_mask=pad).last_hidden_state

    with torch.no_grad():
        want = f(ids, pad)
        model.to("saturn:0")
        got, prog = compiled(f, "saturn:0", (ids, pad))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog, "saturn::attention_bias")) == 2, prog.to_text()


def gpu_programs(fn, args, rewrites: list[str]) -> list:
    """``fn``'s graphs imported and compiled as for a GPU target with ``saturn.library``
    imported (the softmax is then its replacing op's kernel, ``saturn::softmax``), on any
    machine: compile only."""
    from torch._dynamo.backends.common import aot_autograd

    import saturn.library  # noqa: F401  (defines saturn::softmax, which replaces aten::_softmax)
    from saturn import decompositions
    from saturn.backend import _generated_rules
    from saturn.custom_ops import pattern_files, placement_rules
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    programs = []

    def capture(gm, _example):
        imp = import_graph(gm, replacements=True)
        assert [n.op for n in imp.replaced.values()] == ["Softmax"], imp.replaced
        rules = [*pattern_files(rewrites)]
        rules.append(_generated_rules(placement_rules(imp.custom_nodes, imp.graph, imp.replaced)))
        # as the backend: a custom op's pattern ruleset runs as its file is given
        compiled = compile_graph(imp.graph, rules, [], machine="gpu", io_on_device=True)
        programs.append(compiled.program)
        return gm.forward

    torch._dynamo.reset()
    be = aot_autograd(fw_compiler=capture, decompositions=decompositions.table())
    with torch.no_grad():
        torch.compile(fn, backend=be, dynamic=False)(*args)
    return programs


@pytest.mark.parametrize("form", ["scaled-scores", "scaled-query", "masked"])
def test_the_pattern_reads_through_the_gpu_softmax_kernel(form):
    """With ``saturn.library`` imported, a GPU target's importer gives aten._softmax to the
    custom op that replaces it; the pattern still sees the softmax (the replacement states
    the term it stands for), and without the ruleset the softmax kernel stays."""
    fn, args = written, qkv()
    if form == "scaled-query":
        fn = lambda q, k, v: torch.softmax((q * 0.125) @ k.transpose(-2, -1), -1) @ v  # noqa: E731
    if form == "masked":
        fn, args = MASKED_FORMS["scores + mask"], (*args, a_mask((2, 1, 1, 24)))
    (prog,) = gpu_programs(fn, args, ["attention"])
    assert len(any_attention(prog)) == 1 and len(prog.kernels) == 1, prog.to_text()
    (plain,) = gpu_programs(fn, args, [])  # without the ruleset: the softmax kernel stays
    assert any_attention(plain) == [], plain.to_text()
    assert any(k.kind == "custom" and "softmax" in k.attrs["name"] for k in plain.kernels)
