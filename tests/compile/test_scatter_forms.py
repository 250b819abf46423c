"""Slice assignments as real models write them, functionalised to ``slice_scatter``
(Bart's decoder ids shifted right, Swin's shifted-window masks, a cache written at an
offset; strided ones, the backward of ``x[:, 0::2]``): compiled on saturn:0 and on the
GPU with no host op, bit-equal to eager on the CPU (pads, views and selects move values,
they compute none), into memory of their own."""

from __future__ import annotations

import pytest
import torch

from .helpers import last_compiled


def shift_right(ids):  # transformers' shift_tokens_right
    out = ids.new_zeros(ids.shape)
    out[:, 1:] = ids[:, :-1].clone()
    out[:, 0] = 2
    return out.masked_fill(out == -100, 1)


def window_mask(x):  # torchvision's shifted-window attention mask, on a traced value
    m = x.new_zeros((14, 14))
    cnt = 0
    for h in ((0, -7), (-7, -3), (-3, None)):
        for w in ((0, -7), (-7, -3), (-3, None)):
            m[h[0] : h[1], w[0] : w[1]] = cnt
            cnt += 1
    return m + x


CASES = {
    "shift-right-int64": (shift_right, lambda: [torch.randint(0, 50, (3, 9))]),
    "window-mask-float": (window_mask, lambda: [torch.randn(14, 14)]),
    "special-values": (
        lambda b, s: torch.slice_scatter(b * 1, s, 1, 2, 5),
        lambda: [
            torch.randn(3, 8),
            torch.tensor([[float("nan"), -0.0, float("inf")]] * 3),
        ],
    ),
    "middle-dim-computed": (
        # exact on every device (exp would differ from the CPU's in its last bits)
        lambda b, s: torch.slice_scatter(b, s * 2, 1, 1, 3) - 1,
        lambda: [torch.randn(2, 4, 5), torch.randn(2, 2, 5)],
    ),
    "negative-and-clamped-bounds": (
        lambda b, s: torch.slice_scatter(b, s, -1, -3, 100),
        lambda: [torch.randn(4, 6), torch.randn(4, 3)],
    ),
    "bool": (
        lambda b, s: torch.slice_scatter(b, s, 0, 1, 2) | b,
        lambda: [torch.rand(4, 5) > 0.5, torch.rand(1, 5) > 0.5],
    ),
    "empty-slice": (
        lambda b, s: torch.slice_scatter(b, s, 0, 2, 2) * 2,
        lambda: [torch.randn(4, 5), torch.randn(0, 5)],
    ),
    # strided: the backward of x[:, 0::2] (Swin's patch merging), every other from 0 and
    # from 1, every third from 1 to the end (its spread passes the end: cropped) and from
    # 2 short of it, special values carried
    "strided-every-other": (
        lambda b, s: torch.slice_scatter(b, s, 1, 0, 6, 2) + 1,
        lambda: [torch.randn(3, 6), torch.randn(3, 3)],
    ),
    "strided-odd-positions": (
        lambda b, s: torch.slice_scatter(b * 0, s, 1, 1, None, 2),
        lambda: [torch.randn(2, 8, 3), torch.randn(2, 4, 3)],
    ),
    "strided-third-to-the-end": (
        lambda b, s: torch.slice_scatter(b, s, 1, 1, 8, 3) * 1,
        lambda: [
            torch.randn(2, 8, 3),
            torch.tensor([float("nan"), -0.0, float("inf")]).repeat(2, 3, 1),
        ],
    ),
    "strided-third-inside": (
        lambda b, s: torch.slice_scatter(b, s, 1, 2, 7, 3) * 1,
        lambda: [torch.randn(2, 8, 3), torch.randn(2, 2, 3)],
    ),
    "strided-one-element": (
        lambda b, s: torch.slice_scatter(b, s, 0, 3, 5, 4) + 0,
        lambda: [torch.randn(6, 2), torch.randn(1, 2)],
    ),
}


def _one_nan(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.isnan(), torch.full_like(t, float("nan")), t)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float tensor (NaN payloads and zero signs included)."""
    if not t.dtype.is_floating_point:
        return t
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


def _run(fn, xs, dev):
    mine = [x.to(dev) for x in xs]
    torch._dynamo.reset()
    g = torch.compile(fn, backend="saturn", options={"device": dev}, dynamic=False)
    got = g(*mine)
    return got, mine


@pytest.mark.parametrize("name", sorted(CASES))
def test_slice_scatter_runs_on_the_device(dev, name):
    fn, make = CASES[name]
    torch.manual_seed(0)
    xs = make()
    got, mine = _run(fn, xs, dev)
    want = fn(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bits(got.cpu()), _bits(want))
    prog = last_compiled().compiled.program
    assert prog.count("host") == 0, prog.to_text()
    ptr = got.untyped_storage().data_ptr()
    assert all(ptr != x.untyped_storage().data_ptr() for x in mine if x.numel())


def test_a_slice_scatter_of_a_symbolic_extent_stays_pytorchs_op():
    """The handler declines sizes it cannot see (each call's extent): PyTorch's op runs,
    for every length, equal to eager."""
    from saturn import backend

    def fn(b, s):
        return torch.slice_scatter(b, s, 1, 0, None, 2) + 1

    torch._dynamo.reset()
    g = torch.compile(fn, backend="saturn", options={"device": "saturn:0"}, dynamic=True)
    before = len(backend.CACHE.fallbacks)
    for n in (6, 8):
        b, s = torch.randn(3, n), torch.randn(3, n // 2)
        assert torch.equal(g(b.to("saturn:0"), s.to("saturn:0")).cpu(), fn(b, s))
    assert backend.CACHE.fallbacks[before:] == []
    prog = last_compiled().compiled.program
    assert [s.op.split("#")[0] for s in prog.steps if s.kind == "host"] == [
        "aten.slice_scatter.default"
    ], prog.to_text()


STRIDED_SCATTERS = {
    # the backward of a flatten written as as_strided (Swin's): src covers base whole
    "whole": (lambda b, s: torch.as_strided_scatter(b, s, (2, 12), (12, 1), 0) + 1, (24,), (2, 12)),
    # a packed range from an offset, extents of 1 among them, special values carried
    "range": (
        lambda b, s: torch.as_strided_scatter(b, s, (3, 1, 4), (4, 4, 1), 10) * 1,
        (4, 6),
        (3, 1, 4),
    ),
    "to-the-end": (
        lambda b, s: torch.as_strided_scatter(b, s, (2, 5), (5, 1), 14) + 0,
        (24,),
        (2, 5),
    ),
}


@pytest.mark.parametrize("name", sorted(STRIDED_SCATTERS))
def test_packed_as_strided_scatters_run_on_the_device(dev, name):
    fn, base, src = STRIDED_SCATTERS[name]
    torch.manual_seed(0)
    s = torch.randn(src)
    s.view(-1)[:3] = torch.tensor([float("nan"), -0.0, float("inf")])
    xs = [torch.randn(base), s]
    got, _ = _run(fn, xs, dev)
    # the NaN's payload after arithmetic is the hardware's (a GPU's add returns its
    # canonical NaN, as eager CUDA's does): NaN positions compared, every other bit too
    assert torch.equal(_bits(_one_nan(got.cpu())), _bits(_one_nan(fn(*xs))))
    prog = last_compiled().compiled.program
    assert prog.count("host") == 0, prog.to_text()


def test_a_reordered_as_strided_scatter_stays_pytorchs_op():
    def fn(b, s):
        return torch.as_strided_scatter(b, s, (2, 5), (1, 2), 3) + 1

    xs = [torch.randn(24), torch.randn(2, 5)]
    got, _ = _run(fn, xs, "saturn:0")
    assert torch.equal(_bits(got.cpu()), _bits(fn(*xs)))
    prog = last_compiled().compiled.program
    assert [s.op.split("#")[0] for s in prog.steps if s.kind == "host"] == [
        "aten.as_strided_scatter.default"
    ], prog.to_text()


# A rotary embedding's backward: the gradients of x[..., :r] and x[..., r:] (the rotated
# part and the part passed through), and of rotate_half's two halves, each put back into
# a tensor of zeros. Few pieces: joined as cat joins, views the reading loop reads.
FEW_PIECES = {
    "pass-through-part": (lambda b, s: torch.slice_scatter(b * 0, s, -1, 4, 16) + b, (2, 3, 5, 12)),
    "rotated-part": (lambda b, s: torch.slice_scatter(b * 0, s, -1, 0, 4) + b, (2, 3, 5, 4)),
    "half": (lambda b, s: torch.slice_scatter(b, -s, -1, 8, 16) * 2, (2, 3, 5, 8)),
}


def _special(shape) -> torch.Tensor:
    s = torch.randn(shape)
    s.view(-1)[:4] = torch.tensor([float("nan"), -0.0, float("inf"), float("-inf")])
    return s


def _kernel_kinds(prog) -> list[str]:
    return [s.kernel.kind for s in prog.steps if s.kind == "kernel"]


@pytest.mark.parametrize("name", sorted(FEW_PIECES))
def test_a_slice_scatter_of_few_pieces_is_read_in_place(dev, name):
    """No padded copy of src: base's parts and src are read in place by a loop, bit-equal
    to eager with NaN, signed zeros and infinities among the values moved."""
    fn, src = FEW_PIECES[name]
    torch.manual_seed(0)
    xs = [_special((2, 3, 5, 16)), _special(src)]
    got, _ = _run(fn, xs, dev)
    assert torch.equal(_bits(_one_nan(got.cpu())), _bits(_one_nan(fn(*xs))))
    prog = last_compiled().compiled.program
    kinds = _kernel_kinds(prog)
    assert "pad" not in kinds and "loop" in kinds, prog.to_text()


def test_a_slice_scatter_of_many_pieces_keeps_its_padded_copy():
    """Lengths 1, 8 and 7 share no divisor above 1: 16 pieces, each output element would
    read all of them. src is padded (a kernel of its own) and selected, as before."""
    fn = lambda b, s: torch.slice_scatter(b, s, -1, 1, 9) * 2  # noqa: E731
    xs = [_special((2, 3, 5, 16)), _special((2, 3, 5, 8))]
    got, _ = _run(fn, xs, "saturn:0")
    assert torch.equal(_bits(_one_nan(got.cpu())), _bits(_one_nan(fn(*xs))))
    prog = last_compiled().compiled.program
    assert _kernel_kinds(prog) == ["pad", "loop"], prog.to_text()
