"""Eager elementwise ops without a GPU: on saturn:0 (host memory) they decline to PyTorch's
CPU kernel and are counted as fallbacks under the op's name; the GPU kernels' operand
layouts (read flat where operands share one dense layout, through strides otherwise) are
worked out the same way on any device."""

from __future__ import annotations

import torch

import saturn
from saturn import eager_pointwise as ep

DEV = "saturn:0"


def test_saturn0_runs_pytorchs_cpu_kernel_and_counts_it():
    a, b = torch.randn(4, 5), torch.randn(5)
    got, bd = a.to(DEV), b.to(DEV)
    before = saturn.fallback_counts()
    got.add_(bd, alpha=-0.5).mul_(3.0)
    after = saturn.fallback_counts()
    want = a.clone().add_(b, alpha=-0.5).mul_(3.0)
    assert torch.equal(got.cpu(), want)
    for key in ("aten::add_.Tensor", "aten::mul_.Tensor"):
        assert after.get(key, 0) == before.get(key, 0) + 1, key


def test_cpu_kernel_errors_reach_the_caller():
    a = torch.zeros(1, 5, device=DEV)
    try:
        torch.zeros(1, 5).add_(torch.ones(3, 5))
    except RuntimeError as e:
        message = str(e)
    try:
        a.add_(torch.ones(3, 5, device=DEV))
    except RuntimeError as e:
        assert str(e) == message
    else:
        raise AssertionError("a broadcast that does not fit the target must raise")
    assert torch.equal(a.cpu(), torch.zeros(1, 5)), "nothing written on error"


def test_operands_sharing_one_dense_layout_are_read_flat():
    a = torch.randn(6, 4).t()  # transposed, dense
    b = torch.randn(6, 4).t()
    out = torch.empty_strided(a.shape, a.stride())
    ops, shapes, _strides, domain, direct = ep.layout(
        "f32", [a, b, torch.tensor(2.0)], a.shape, out
    )
    assert [o.indexing for o in ops] == ["same", "same", "scalar"]
    assert domain == (24,) and shapes[:2] == [(24,), (24,)] and direct


def test_broadcast_and_mixed_layouts_are_read_through_strides():
    a, b = torch.randn(4, 6), torch.randn(6)
    ops, _shapes, strides, domain, direct = ep.layout("f32", [a, b], (4, 6), torch.empty(4, 6))
    assert [o.indexing for o in ops] == ["strided", "strided"] and domain == (4, 6) and direct
    assert strides == [(6, 1), (1,)]
    t = torch.randn(6, 4).t()  # same shape, other layout than the packed output
    ops, *_ = ep.layout("f32", [a, t], (4, 6), torch.empty(4, 6))
    assert [o.indexing for o in ops] == ["strided", "strided"]
    # a strided in-place target with a broadcast operand is written through a packed result
    target = torch.randn(6, 4).t()
    *_, direct = ep.layout("f32", [target, b], (4, 6), target)
    assert not direct


def test_numbers_that_would_promote_are_declined():
    assert ep._number(2, "i32") == 2
    assert ep._number(torch.tensor(1.5), "f32") == 1.5
    for v, code in ((2.5, "i64"), (True, "f32"), (1j, "f32"), (torch.ones(2), "f32")):
        try:
            ep._number(v, code)
        except ep.DeclinedError:
            continue
        raise AssertionError(f"{v!r} with {code} must decline")
