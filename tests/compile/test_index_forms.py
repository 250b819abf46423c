"""Advanced indexing with index tensors on several axes, and integer cumsum, in the forms
real models write them. Indexing:
Hugging Face's mask functions index a (batch, kv) mask with broadcast aranges
(``mask[batch_idx[:, None, None, None], kv_idx[None, None, :, None]]``). Where every index
is known in range at compile time it is one take on the device (no host op), equal to
eager; an index read at the call stays PyTorch's op, so an index out of range on any axis
raises PyTorch's own error naming that axis and value. cumsum of integers or bools
(position ids from a padding mask: ``cumsum(mask, 1) * mask + pad``; the mask functions'
``cumsum(diff != 1, -1)``) is a masked sum on the device, bit-equal (integer sums wrap
alike in any order); a float cumsum sums in float64, as PyTorch's CPU kernel accumulates."""

from __future__ import annotations

import pytest
import torch

import saturn

from .helpers import last_compiled

CASES = {
    "hf-mask": (
        lambda m: m[torch.arange(2)[:, None, None, None], torch.arange(16)[None, None, :, None]],
        lambda: [torch.rand(2, 16) > 0.5],
    ),
    "hf-mask-offset": (
        lambda m: (
            m[torch.arange(2)[:, None, None, None], (torch.arange(12) + 4)[None, None, None, :]]
            & m[:, None, None, :1]
        ),
        lambda: [torch.rand(2, 16) > 0.5],
    ),
    "rows-kept": (
        lambda x: x[torch.arange(3)[:, None], torch.arange(1, 5)[None, :] - 1] * 2,
        lambda: [torch.randn(3, 4, 5)],
    ),
    "three-axes": (
        lambda x: (
            x[torch.arange(2)[:, None, None], torch.arange(3)[None, :, None], 2 - torch.arange(3)]
            + 1
        ),
        lambda: [torch.randn(2, 3, 3, 2)],
    ),
    "int32-and-int64": (
        lambda x: x[torch.arange(4, dtype=torch.int32), torch.arange(3, -1, -1)] - 1,
        lambda: [torch.randn(4, 4)],
    ),
}


INT32 = (-(2**31), 2**31 - 1)
SCANS = {
    "position-ids": (
        lambda m: torch.cumsum(m, dim=1).type_as(m) * m + 1,
        lambda: [(torch.rand(2, 16) > 0.3).long()],
    ),
    "bool-last-axis": (
        lambda m: torch.cumsum(m != 1, -1),
        lambda: [torch.randint(0, 3, (2, 16))],
    ),
    "int32-wraps-first-axis": (
        lambda x: torch.cumsum(x, 0),
        lambda: [torch.randint(*INT32, (9, 3), dtype=torch.int32)],
    ),
    "int64-to-int32-middle-axis": (
        lambda x: torch.cumsum(x, 1, dtype=torch.int32),
        lambda: [torch.randint(*INT32, (2, 5, 3), dtype=torch.int64)],
    ),
    "int64-wraps": (
        lambda x: torch.cumsum(x, -1),
        lambda: [torch.full((2, 40), 2**62)],
    ),
    "int32-length-one": (
        lambda x: torch.cumsum(x, 1),
        lambda: [torch.randint(*INT32, (4, 1), dtype=torch.int32)],
    ),
}


def _compiled(fn, dev):
    torch._dynamo.reset()
    return torch.compile(fn, backend="saturn", options={"device": dev}, dynamic=False)


@pytest.mark.parametrize("name", sorted(CASES) + sorted(SCANS))
def test_on_the_device_and_equal_to_eager(dev, name):
    fn, make = CASES.get(name) or SCANS[name]
    xs = make()
    mine = [x.to(dev) for x in xs]
    g = _compiled(fn, dev)
    g(*mine)
    before = saturn.fallback_counts()
    got = g(*mine)
    assert saturn.fallback_counts() == before
    want = fn(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)
    prog = last_compiled().compiled.program
    assert prog.count("host") == 0, prog.to_text()


def test_indices_read_at_the_call_stay_pytorch_s_op_and_its_errors():
    """A flat index in range does not mean each axis's index is (x[0, 5] of a 2x4 table is
    flat 5, in range): such indices are PyTorch's op, negative ones included."""
    fn = lambda x, i, j: x[i, j] * 2  # noqa: E731
    x = torch.randn(2, 4)
    g = _compiled(fn, "saturn:0")
    i, j = torch.tensor([0, -1]), torch.tensor([-4, 3])
    assert torch.equal(g(x.to("saturn:0"), i.to("saturn:0"), j.to("saturn:0")).cpu(), fn(x, i, j))
    assert last_compiled().compiled.program.count("host") == 1
    bad = torch.tensor([0, 5])
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 4"):
        fn(x, i, bad)
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 4"):
        g(x.to("saturn:0"), i.to("saturn:0"), bad.to("saturn:0"))


def test_an_arange_out_of_range_is_not_taken_and_raises_as_eager():
    """An arange reaching past its axis declines (PyTorch raises at the call)."""
    fn = lambda x: x[torch.arange(2)[:, None], torch.arange(5)[None, :]]  # noqa: E731
    x = torch.randn(2, 4)
    g = _compiled(fn, "saturn:0")
    with pytest.raises(IndexError, match="out of bounds for dimension 1 with size 4"):
        g(x.to("saturn:0"))


def _special_rows(dtype) -> torch.Tensor:
    x = torch.randn(4, 24, generator=torch.Generator().manual_seed(3)) * 100
    x[0, :6] = torch.tensor([-0.0, -0.0, 1.0, float("inf"), 2.0, float("-inf")])
    x[1, 3] = float("nan")
    x[2, :3] = torch.tensor([3e38, 3e38, -3e38])  # float32's running sum passes its largest
    x[3] = -0.0  # every term -0.0: the running sum is +0.0
    return x.to(dtype)


FLOAT_SCANS = {
    "opt-position-ids": (
        lambda m: (torch.cumsum(m, dim=1) * m - 1).long(),
        lambda d: (torch.rand(2, 16, generator=torch.Generator().manual_seed(1)) > 0.3).to(d),
    ),
    "special-values-last-axis": (lambda x: torch.cumsum(x * 1, -1), _special_rows),
    "first-axis": (lambda x: torch.cumsum(x, 0) + 1, lambda d: _special_rows(d)[:, :5]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(FLOAT_SCANS))
def test_a_float_cumsum_is_a_float64_masked_sum(dev, name, dtype):
    """Against eager on the CPU, which accumulates float32 in float64 (CUDA's scan in
    float32) and bfloat16 in float32: bit-equal there, NaN and zero signs included (but for
    a float32 overflow in another order, bfloat16); float64 to its last bits. On saturn:0 a
    half cumsum stays PyTorch's op (no half kernels there)."""
    fn, make = FLOAT_SCANS[name]
    x = make(dtype)
    g = _compiled(fn, dev)
    got = g(x.to(dev)).cpu()
    want = fn(x)
    if dtype == torch.bfloat16 and name != "opt-position-ids":
        # float32 sums in another order: where a running sum passes float32's largest value
        # (the row of 3e38s) it may overflow elsewhere; the other rows' sums round alike
        got, want = torch.cat([got[:2], got[3:]]), torch.cat([want[:2], want[3:]])
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0, equal_nan=True)
    else:
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(0.0).signbit(), want.nan_to_num(0.0).signbit())
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
    prog = last_compiled().compiled.program
    if dtype != torch.bfloat16 or dev != "saturn:0":
        assert prog.count("host") == 0, prog.to_text()


def test_an_axis_too_long_for_the_masked_sum_stays_pytorch_s_op(monkeypatch):
    from saturn import import_reductions

    monkeypatch.setattr(import_reductions, "CUMSUM_MAX_LENGTH", 8)
    fn = lambda x: torch.cumsum(x, -1) + 1  # noqa: E731
    x = torch.randint(0, 9, (2, 9))
    g = _compiled(fn, "saturn:0")
    assert torch.equal(g(x.to("saturn:0")).cpu(), fn(x))
    assert last_compiled().compiled.program.count("host") == 1
