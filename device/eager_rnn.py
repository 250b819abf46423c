"""The fused LSTM and GRU cells PyTorch's recurrent layers call on a device, for saturn
tensors.

``nn.LSTM``/``nn.GRU`` (and their cells) take the fused-cell path for PrivateUse1 tensors,
as for CUDA: ``_thnn_fused_lstm_cell`` and ``_thnn_fused_gru_cell``, with backward kernels
of their own. Those have no CPU kernel, so the boxed fallback could not run them and every
recurrent layer on a saturn tensor raised. Here each is its formula in ATen ops on the
operands' device (saturn's eager kernels where it has them, the counted fallback where
not). The workspace is this module's own (the backward below is its only reader): the
activated gates, and for the GRU also ``hx`` and the hidden state's candidate term, as
PyTorch's CUDA kernels keep them.
"""

from __future__ import annotations

import torch

from .eager_registry import impl

_lib = torch.library.Library("aten", "IMPL")


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    g = input_gates + hidden_gates
    if input_bias is not None:
        g = g + input_bias
    if hidden_bias is not None:
        g = g + hidden_bias
    return g


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    with torch.no_grad():  # autograd sees the fused op (its own backward below)
        i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        cy = f * cx + i * g
        hy = o * cy.tanh()
        return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    with torch.no_grad():
        i, f, g, o = workspace.chunk(4, 1)
        tanh_cy = cy.tanh()
        d_cy = torch.zeros_like(cy) if grad_cy is None else grad_cy
        if grad_hy is not None:
            d_o = grad_hy * tanh_cy
            d_cy = d_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
        else:
            d_o = torch.zeros_like(o)
        grad_gates = torch.cat(
            [
                d_cy * g * i * (1 - i),
                d_cy * cx * f * (1 - f),
                d_cy * i * (1 - g * g),
                d_o * o * (1 - o),
            ],
            1,
        )
        grad_bias = grad_gates.sum(0) if has_bias else None
        return grad_gates, d_cy * f, grad_bias


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    with torch.no_grad():
        if input_bias is not None:
            input_gates = input_gates + input_bias
        if hidden_bias is not None:
            hidden_gates = hidden_gates + hidden_bias
        ir, iz, in_ = input_gates.chunk(3, 1)
        hr, hz, hn = hidden_gates.chunk(3, 1)
        r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
        n = (in_ + r * hn).tanh()
        hy = n + z * (hx - n)
        return hy, torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(grad_hy, workspace, has_bias):
    with torch.no_grad():
        r, z, n, hx, hn = workspace.chunk(5, 1)
        d_n = grad_hy * (1 - z) * (1 - n * n)
        d_z = grad_hy * (hx - n) * z * (1 - z)
        d_r = d_n * hn * r * (1 - r)
        grad_input = torch.cat([d_r, d_z, d_n], 1)
        grad_hidden = torch.cat([d_r, d_z, d_n * r], 1)
        biases = (grad_input.sum(0), grad_hidden.sum(0)) if has_bias else (None, None)
        return grad_input, grad_hidden, grad_hy * z, *biases


impl(_lib, "_thnn_fused_lstm_cell", lstm_cell)
impl(_lib, "_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward)
impl(_lib, "_thnn_fused_gru_cell", gru_cell)
impl(_lib, "_thnn_fused_gru_cell_backward", gru_cell_backward)
