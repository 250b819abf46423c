"""Swin's shifted-window attention written out (torchvision's and timm's unfused window
attention: the masked scores viewed as [images, windows, H, S, T], the shift mask added,
viewed back) found by ``device/attention.egg`` and compiled as one
``saturn::attention_bias`` kernel reading the two masks' sum (one loop of the program), with
results equal to eager CPU's: hand-written, and torchvision's Swin-T, every block of which
becomes one attention kernel; views that split another axis, and a float64 window mask, are
declined."""

from __future__ import annotations

import pytest
import torch

import saturn  # noqa: F401
from saturn.custom_ops import fallback_counts

from .test_attention_pattern import a_mask, any_attention, attention_kernels, compiled, gpu_programs

BIAS = "saturn::attention_bias"


def swin(q, k, v, bias, mask, c: float = 0.25, mask_first: bool = False):
    """torchvision's ``shifted_window_attention`` from q, k, v on: the query scaled, the
    relative position bias added, the shift mask added per window (``mask_first``: the
    mask as the add's first operand)."""
    a = (q * c) @ k.transpose(-2, -1) + bias
    b, h, s, t = a.shape
    w = mask.shape[0]
    m = mask.unsqueeze(1).unsqueeze(0)
    a = a.view(b // w, w, h, s, t)
    a = m + a if mask_first else a + m
    return torch.softmax(a.view(-1, h, s, t), dim=-1) @ v


def mask_first(q, k, v, bias, mask):
    return swin(q, k, v, bias, mask, mask_first=True)


def operands(images=2, windows=3, h=4, s=16, d=32, bias_batch=1):
    gen = torch.Generator().manual_seed(0)
    b = images * windows
    q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
    bias = torch.randn(bias_batch, h, s, s, generator=gen)
    return q, k, v, bias, a_mask((windows, s, s))  # Swin's: 0 or a large negative


@pytest.mark.parametrize("form", [swin, mask_first], ids=["scores-first", "mask-first"])
@pytest.mark.parametrize("bias_batch", [1, 6], ids=["bias-per-head", "bias-per-batch"])
def test_shifted_window_attention_is_one_kernel(dev, form, bias_batch):
    args = operands(bias_batch=bias_batch)
    calls = fallback_counts().get(BIAS, 0)
    got, prog = compiled(form, dev, args)
    torch.testing.assert_close(got.cpu(), form(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog, BIAS)) == 1, prog.to_text()
    # the attention and the two masks' sum (one loop), nothing else
    assert len(prog.kernels) == 2 and [k.kind for k in prog.kernels].count("custom") == 1
    assert prog.count("host") == 0
    ran_reference = fallback_counts().get(BIAS, 0) - calls
    assert ran_reference == (1 if dev == "saturn:0" else 0)


def test_masks_of_lower_rank_broadcast_as_written():
    """A bias of rank 2 ([S, T]) and a window mask of rank 4 ([W, 1, S, T], broadcast to
    [1, W, 1, S, T] by the add): one kernel, eager's result."""

    def f(q, k, v, bias, mask):
        a = (q * 0.25) @ k.transpose(-2, -1) + bias
        b, h, s, t = a.shape
        a = a.view(b // 3, 3, h, s, t) + mask.unsqueeze(1)
        return torch.softmax(a.view(-1, h, s, t), dim=-1) @ v

    q, k, v, bias, mask = operands()
    args = (q, k, v, bias[0, 0], mask)
    got, prog = compiled(f, "saturn:0", args)
    torch.testing.assert_close(got.cpu(), f(*args), rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog, BIAS)) == 1 and len(prog.kernels) == 2, prog.to_text()


def test_torchvision_swin_has_one_attention_kernel_per_block():
    """torchvision's Swin-T (64-pixel images: two stages shift their windows): all twelve
    blocks' attention are one masked kernel each, the shifted ones too; output eager's."""
    torchvision = pytest.importorskip("torchvision", reason="the zoo extra is not installed")
    torch.manual_seed(0)
    model = torchvision.models.swin_t(weights=None, num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(x)
        model.to("saturn:0")
        got, prog = compiled(model, "saturn:0", (x,))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert len(attention_kernels(prog, BIAS)) == 12, prog.to_text()
    assert len(any_attention(prog)) == 12, prog.to_text()


def heads_split(q, k, v, bias, mask):
    """The scores viewed as [B, 2, H/2, S, T]: the heads split, not the batch."""
    a = (q * 0.25) @ k.transpose(-2, -1) + bias
    b, h, s, t = a.shape
    a = a.view(b, 2, h // 2, s, t) + mask[:2].unsqueeze(1).unsqueeze(0)
    return torch.softmax(a.view(b, h, s, t), dim=-1) @ v


@pytest.mark.parametrize("form", ["heads-split", "float64-mask", "no-rewrites"])
def test_the_windowed_form_declines_what_it_does_not_take(form):
    args = operands()
    fn = heads_split if form == "heads-split" else swin
    if form == "float64-mask":  # promotes the windowed scores to float64
        args = (*args[:4], args[4].double())

        def fn(q, k, v, bias, mask):
            a = (q * 0.25) @ k.transpose(-2, -1) + bias
            b, h, s, t = a.shape
            a = (a.view(b // 3, 3, h, s, t) + mask.unsqueeze(1).unsqueeze(0)).float()
            return torch.softmax(a.view(b, h, s, t), dim=-1) @ v

    rewrites = () if form == "no-rewrites" else ("attention",)
    got, prog = compiled(fn, "saturn:0", args, rewrites)
    assert any_attention(prog) == [], prog.to_text()
    torch.testing.assert_close(got.cpu(), fn(*args), rtol=1e-5, atol=1e-5)


def test_the_windowed_form_reads_through_the_gpu_softmax_kernel():
    """As for a GPU target with ``saturn.library``: the softmax is its replacing kernel,
    and the windowed pattern still finds it."""
    (prog,) = gpu_programs(swin, operands(), ["attention"])
    assert len(attention_kernels(prog, BIAS)) == 1 and len(prog.kernels) == 2, prog.to_text()
