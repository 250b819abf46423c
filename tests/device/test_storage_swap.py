"""``saturn_rt.swap_storage_data``: two storages exchange their memory; every tensor and view
over either follows. The GPU runner uses it to give a lent output memory of its own."""

from __future__ import annotations

import pytest
import torch

import saturn  # noqa: F401 - registers the device

DEV = "saturn:0"


def test_swap_moves_every_view_and_keeps_the_bytes():
    a = torch.arange(12, dtype=torch.float32, device=DEV)
    b = torch.full((12,), -1.0, device=DEV)
    view = a[3:7]
    pa, pb = a.data_ptr(), b.data_ptr()
    torch.ops.saturn_rt.swap_storage_data(a, b)
    assert (a.data_ptr(), b.data_ptr()) == (pb, pa)
    assert view.data_ptr() == pb + 3 * 4  # the view follows its storage
    assert torch.equal(a.cpu(), torch.full((12,), -1.0))
    assert torch.equal(b.cpu(), torch.arange(12, dtype=torch.float32))
    assert torch.equal(view.cpu(), torch.full((4,), -1.0))


def test_swap_refuses_storages_of_different_sizes():
    a = torch.zeros(4, device=DEV)
    with pytest.raises(RuntimeError, match="swap_storage_data of 16 and 12 bytes"):
        torch.ops.saturn_rt.swap_storage_data(a, torch.zeros(3, device=DEV))
    assert a.data_ptr() != 0 and torch.equal(a.cpu(), torch.zeros(4))


def test_swap_refuses_storages_of_different_devices():
    with pytest.raises(RuntimeError, match="across devices"):
        torch.ops.saturn_rt.swap_storage_data(torch.zeros(4, device=DEV), torch.zeros(4))
