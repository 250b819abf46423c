"""Recurrent layers on saturn tensors: PyTorch calls its fused LSTM/GRU cells for a
device tensor, kernels with no CPU version (the boxed fallback could not run them); saturn
registers them as their formulas. Outputs and gradients equal PyTorch's CPU layers (which
run the unfused cells) to float32 rounding, special values included."""

from __future__ import annotations

import copy

import pytest
import torch

import saturn

DEV = torch.device("saturn:0")


def run(module, x, hidden, device):
    m = copy.deepcopy(module).to(device)
    x = x.detach().to(device, copy=True).requires_grad_()
    hidden = tuple(h.detach().to(device, copy=True).requires_grad_() for h in hidden)
    out, state = m(x, hidden[0] if len(hidden) == 1 else hidden)
    state = state if isinstance(state, tuple) else (state,)
    # the loss reads the output and only the first final state: the other one's gradient is
    # undefined in the backward (an LSTM's cell state: grad_cy None in the last step)
    (out.pow(2).sum() + state[0].sum()).backward()
    grads = [x.grad, *(h.grad for h in hidden), *(p.grad for p in m.parameters())]
    return [out, *state], grads


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_layers_equal_the_cpu(kind, bias):
    torch.manual_seed(0)
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    module = cls(5, 7, num_layers=2, bidirectional=True, batch_first=True, bias=bias)
    x = torch.randn(3, 4, 5)
    x[0, 1, 2] = 40.0  # saturates gates: sigmoid 1, tanh 1 exactly
    hidden = tuple(torch.randn(4, 3, 7) for _ in range(2 if kind == "lstm" else 1))
    want, want_grads = run(module, x, hidden, "cpu")
    before = saturn.fallback_counts()
    got, got_grads = run(module, x, hidden, DEV)
    after = saturn.fallback_counts()
    ran = {k for k in after if after[k] != before.get(k, 0)}
    assert not any("_thnn_fused" in k for k in ran), ran  # the cells ran here, not a fallback
    for g, w in zip(got + got_grads, want + want_grads, strict=True):
        assert g.device == DEV
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)


def test_cells_and_nan():
    torch.manual_seed(1)
    cell = torch.nn.LSTMCell(4, 3)
    x = torch.randn(2, 4)
    x[1, 0] = float("nan")
    h = (torch.randn(2, 3), torch.randn(2, 3))
    want = cell(x, h)
    got = copy.deepcopy(cell).to(DEV)(x.to(DEV), tuple(t.to(DEV) for t in h))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.detach().cpu(), w.detach(), equal_nan=True)
    assert torch.isnan(got[0][1]).all() and not torch.isnan(got[0][0]).any()
    gru = torch.nn.GRUCell(4, 3)
    want = gru(x, h[0])
    got = copy.deepcopy(gru).to(DEV)(x.to(DEV), h[0].to(DEV))
    torch.testing.assert_close(got.detach().cpu(), want.detach(), equal_nan=True)
