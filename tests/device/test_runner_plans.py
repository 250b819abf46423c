"""The runner's library-plan helpers that need no GPU: the channels-last view a convolution
plan hands cuDNN (decision 0109)."""

from __future__ import annotations

import torch

from saturn.runner_plans import channels_last_view


def test_a_channels_last_operand_gets_canonical_strides_on_the_same_memory():
    """A packed [K, C, 1, 1] weight and a packed depthwise [C, 1, 7, 7] one lie NHWC with
    NCHW strides: cuDNN gets PyTorch's channels-last strides over the same memory. A 3x3
    NCHW weight, a channels-last tensor and a tensor of another rank are left alone."""
    for shape in ((160, 40, 1, 1), (40, 1, 7, 7)):
        w = torch.randn(shape)
        v = channels_last_view(w)
        want = torch.empty(shape, memory_format=torch.channels_last).stride()
        assert v.stride() == want and v.stride() != w.stride()
        assert v.data_ptr() == w.data_ptr() and torch.equal(v, w)
    dense = torch.randn(8, 4, 3, 3)
    assert channels_last_view(dense) is dense  # NCHW memory: not channels-last at all
    cl = torch.randn(2, 4, 5, 5).contiguous(memory_format=torch.channels_last)
    assert channels_last_view(cl).stride() == cl.stride()
    flat = torch.randn(3, 4)
    assert channels_last_view(flat) is flat
    # a slice (storage offset) keeps its offset
    part = torch.randn(2, 160, 40, 1, 1)[1]
    assert channels_last_view(part).data_ptr() == part.data_ptr()
