"""A saturn ``torch.Generator`` passed to random ops: the numbers a CPU generator seeded
alike draws, the generator's state advanced (what PyTorch's CPU kernels compute, through
the counted fallback)."""

from __future__ import annotations

import torch


def test_a_saturn_generator_draws_what_a_cpu_one_seeded_alike_draws(dev):
    g = torch.Generator(device=dev)
    g.manual_seed(3)
    c = torch.Generator()
    c.manual_seed(3)
    a = torch.randn(3, 4, generator=g, device=dev)
    b = torch.randn(3, 4, generator=g, device=dev)  # the state advanced
    assert a.device == torch.device(dev)
    assert torch.equal(a.cpu(), torch.randn(3, 4, generator=c))
    assert torch.equal(b.cpu(), torch.randn(3, 4, generator=c))
    x = torch.empty(5, device=dev).uniform_(generator=g)
    assert torch.equal(x.cpu(), torch.empty(5).uniform_(generator=c))
    p = torch.randperm(7, generator=g, device=dev)
    assert torch.equal(p.cpu(), torch.randperm(7, generator=c))
    assert torch.equal(g.get_state(), c.get_state())


def test_a_reseeded_saturn_generator_repeats_itself(dev):
    g = torch.Generator(device=dev).manual_seed(11)
    first = torch.rand(16, generator=g, device=dev).cpu()
    g.manual_seed(11)
    assert torch.equal(torch.rand(16, generator=g, device=dev).cpu(), first)
