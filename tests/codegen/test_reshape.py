"""The copy order of reshapes GEMMs read (codegen/reshape.py), checked with CPU tensors."""

from __future__ import annotations

import pytest
import torch

from saturn.codegen.reshape import gemm_copy_order, reshape_groups


def copied(src: torch.Tensor, new_shape, order):
    """What the executor does: a packed copy of the source's axes in ``order``, seen back
    in the source's axis order and reshaped as a view (which must not copy again)."""
    buf = src.permute(order).contiguous()
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return buf, buf.permute(inverse).view(new_shape)


def test_attention_key_is_copied_by_rows_and_read_transposed():
    """k of [B, L, H, D] seen as [B*H, D, L]: copied in [B, H, L, D] order (D, the source's
    fastest axis, stays fastest), the result a transposed matrix per batch."""
    qkv = torch.randn(2, 5, 3 * 12)  # [B, L, 3E], E = H * D = 3 * 4
    k = qkv[:, :, 12:24].view(2, 5, 3, 4).permute(0, 2, 3, 1)  # [B, H, D, L]
    new = (6, 4, 5)
    order = gemm_copy_order(tuple(k.shape), k.stride(), new)
    assert order == (0, 1, 3, 2)
    buf, out = copied(k, new, order)
    assert out.stride() == (20, 1, 4)  # [B*H, D, L] column-major: the GEMM's transpose
    assert out.data_ptr() == buf.data_ptr() and torch.equal(out, k.reshape(new))


@pytest.mark.parametrize(
    "shape,perm,new",
    [
        ((2, 5, 3, 4), (0, 2, 1, 3), (6, 5, 4)),  # query / value: already rows
        ((2, 3, 4, 5), (0, 1, 2, 3), (6, 4, 5)),  # packed: nothing to reorder
        ((4, 6), (1, 0), (24,)),  # a vector is no matrix
        ((4, 6), (1, 0), (2, 12)),  # both matrix axes cut from one run of source axes
    ],
)
def test_declines_where_the_packed_copy_is_as_good_or_no_matrix_is_read(shape, perm, new):
    src = torch.randn(shape).permute(perm)
    assert gemm_copy_order(tuple(src.shape), src.stride(), new) is None


@pytest.mark.parametrize(
    "shape,perm,new",
    [
        ((3, 1, 4, 5), (0, 1, 3, 2), (3, 5, 4)),  # an extent-1 axis rides along
        ((2, 7, 3, 4), (0, 2, 3, 1), (6, 4, 7)),
        ((6, 4, 5), (0, 2, 1), (2, 3, 5, 4)),  # a split batch axis
        ((2, 3, 4, 5), (0, 3, 2, 1), (2, 5, 12)),  # the last new axis merges two
    ],
)
def test_every_order_it_gives_reshapes_to_the_same_values(shape, perm, new):
    src = torch.randn(shape).permute(perm)
    order = gemm_copy_order(tuple(src.shape), src.stride(), new)
    assert order is not None
    buf, out = copied(src, new, order)
    assert out.data_ptr() == buf.data_ptr() and torch.equal(out, src.reshape(new))
    assert out.stride()[-2] == 1  # a transposed matrix


def test_groups_of_a_reshape():
    assert reshape_groups((2, 1, 3, 4), (6, 1, 4)) == [([0, 1, 2], [0]), ([3], [2])]
    assert reshape_groups((6, 4), (2, 3, 4)) == [([0], [0, 1]), ([1], [2])]
    assert reshape_groups((2, 3), (7,)) is None


def test_a_broadcast_axis_is_no_runs_fastest():
    """Grouped-query attention's key, [B, L, Hkv, D] -> [B, Hkv, R, L, D] (R expanded with
    stride 0) read as [B*Hkv, R*L, D]: the rows run (R, L) is not faster than D because of
    R's zero stride, so the packed row copy stays (no transposing copy)."""
    k = torch.randn(2, 5, 3, 8).permute(0, 2, 1, 3)[:, :, None].expand(2, 3, 4, 5, 8)
    assert k.stride()[2] == 0
    assert gemm_copy_order(tuple(k.shape), k.stride(), (6, 20, 8)) is None
