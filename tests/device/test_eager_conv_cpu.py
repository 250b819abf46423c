"""Eager convolutions on saturn tensors (``aten::convolution`` picks the overrideable
kernels for the device; PyTorch has no CPU kernel for them, so the boxed fallback could
not run them): forward and backward equal PyTorch's CPU results, and each call is counted
as a fallback under the overrideable op's name."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

import saturn

DEV = torch.device("saturn:0")


def counted(fn):
    before = saturn.fallback_counts()
    out = fn()
    after = saturn.fallback_counts()
    return out, {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(padding=1),
        dict(stride=2, dilation=2, groups=2),
        dict(padding=(0, 2), stride=(1, 3)),
    ],
)
def test_conv2d_forward_and_backward_equal_the_cpu(kwargs):
    torch.manual_seed(0)
    x, w, b = (
        torch.randn(2, 4, 9, 11),
        torch.randn(6, 4 // kwargs.get("groups", 1), 3, 3),
        torch.randn(6),
    )
    x.view(-1)[5] = float("nan")  # NaN flows through as on the CPU
    cx, cw, cb = leaves(x, w, b)
    want = functional.conv2d(cx, cw, cb, **kwargs)
    want.pow(2).nansum().backward()
    dx, dw, db = (t.to(DEV).detach().requires_grad_() for t in (x, w, b))
    got, counts = counted(lambda: functional.conv2d(dx, dw, db, **kwargs))
    assert got.device == DEV and counts == {"aten::convolution_overrideable": 1}
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5, equal_nan=True)
    grads = got.pow(2).nansum()
    _, counts = counted(grads.backward)
    assert counts.get("aten::convolution_backward_overrideable") == 1
    for d, c in ((dx, cx), (dw, cw), (db, cb)):
        assert d.grad.device == DEV
        torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_transposed_conv_and_gradients_only_where_needed():
    torch.manual_seed(1)
    x, w = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3)
    cw = w.clone().requires_grad_()
    functional.conv_transpose2d(x, cw, stride=2, output_padding=1).sum().backward()
    dx, dw = x.to(DEV), w.to(DEV).requires_grad_()  # the input needs no gradient
    got = functional.conv_transpose2d(dx, dw, stride=2, output_padding=1)
    torch.testing.assert_close(
        got.cpu(),
        functional.conv_transpose2d(x, w, stride=2, output_padding=1),
        rtol=1e-5,
        atol=1e-5,
    )
    got.sum().backward()
    assert dx.grad is None
    torch.testing.assert_close(dw.grad.cpu(), cw.grad, rtol=1e-5, atol=1e-5)


def test_bfloat16_and_mismatched_operands():
    torch.manual_seed(2)
    x, w = torch.randn(1, 2, 6, 6).bfloat16(), torch.randn(3, 2, 3, 3).bfloat16()
    assert torch.equal(functional.conv2d(x.to(DEV), w.to(DEV)).cpu(), functional.conv2d(x, w))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        functional.conv2d(x.to(DEV), w)  # weight on the CPU: an error, as eager gives one
    with pytest.raises(RuntimeError):
        functional.conv2d(x.to(DEV), w.to(DEV)[:, :1])  # channels do not match: PyTorch's check
