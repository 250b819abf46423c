"""Eager convolutions on saturn tensors: PyTorch's CPU kernels on host copies, counted.

``aten::convolution`` picks its backend from the device: for a PrivateUse1 tensor it calls
``convolution_overrideable`` (and autograd ``convolution_backward_overrideable``), which
have no CPU kernel, so the boxed CPU fallback cannot run them and every ``F.conv2d`` on a
saturn tensor raised. These two kernels run ``aten::convolution`` and
``aten::convolution_backward`` on host copies instead, with PyTorch's checks and errors,
and count each call in ``saturn.fallback_counts()`` under the overrideable op's name, as
the fallback counts what it runs. Compiled graphs do not come here: their convolutions
are cuDNN plans on the GPU (``codegen.conv``) or host steps.
"""

from __future__ import annotations

import torch

from .eager_pointwise import _cpu
from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")


def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    args = (x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return _cpu("convolution_overrideable", torch.ops.aten.convolution.default, args, {}, False)


def convolution_backward(
    grad_out, x, weight, stride, padding, dilation, transposed, output_padding, groups, mask
):
    # the bias gradient is the sum of grad_out over all but the channel axis, whatever the
    # bias was; its size is the output's channel count
    args = (grad_out, x, weight, [grad_out.shape[1]], stride, padding, dilation, transposed)
    args += (output_padding, groups, mask)
    op = torch.ops.aten.convolution_backward.default
    return _cpu("convolution_backward_overrideable", op, args, {}, False)


impl(_lib, "convolution_overrideable", convolution)
impl(_lib, "convolution_backward_overrideable", convolution_backward)
