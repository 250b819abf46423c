"""torch.saturn and torch.accelerator, the allocator's counters, the fallback counter,
torch.save/load, and errors on bad input."""

from __future__ import annotations

import io

import pytest
import torch

import saturn


def index(dev: str) -> int:
    return torch.device(dev).index


def test_device_module_and_accelerator(dev):
    i = index(dev)
    assert torch.saturn.is_available()
    assert torch.saturn.device_count() == 1 + torch.saturn.gpu_count()
    assert torch.accelerator.current_accelerator().type == "saturn"
    assert torch.accelerator.device_count() == torch.saturn.device_count()
    prev = torch.saturn.current_device()
    with torch.saturn.device(dev):
        assert torch.saturn.current_device() == i
        assert torch.accelerator.current_device_index() == i
        assert torch.empty(2, device="saturn").device.index == i  # no index: the current device
    assert torch.saturn.current_device() == prev
    torch.saturn.set_device(dev)
    assert torch.saturn.current_device() == i
    torch.saturn.set_device(prev)
    torch.saturn.synchronize(dev)
    torch.accelerator.synchronize(i)
    assert isinstance(torch.saturn.get_device_name(dev), str)


def test_seeding_does_not_recurse(dev):
    torch.manual_seed(77)  # calls torch.saturn.manual_seed_all, which must not call back
    assert torch.saturn.initial_seed(dev) == 77
    torch.saturn.manual_seed(5, dev)
    assert torch.saturn.initial_seed(dev) == 5
    state = torch.saturn.get_rng_state(dev)
    torch.saturn.set_rng_state(state, dev)
    torch.saturn.manual_seed_all(2**64 - 1)
    assert torch.saturn.initial_seed(dev) == 2**64 - 1 - 2**64  # same 64 bits, signed


def test_allocator_counts_a_hit_on_reuse(dev):
    i = index(dev)
    torch.saturn.synchronize(dev)
    before = torch.saturn.memory_stats(dev)
    t = torch.empty(1000, dtype=torch.float32, device=dev)  # 4000 bytes -> 4096 class
    mid = torch.saturn.memory_stats(dev)
    assert mid["allocated"] - before["allocated"] == 4096
    assert torch.accelerator.memory_allocated(i) == mid["allocated"]
    assert t.data_ptr() % 512 == 0
    del t
    after_free = torch.saturn.memory_stats(dev)
    assert after_free["allocated"] == before["allocated"]
    assert after_free["reserved"] == mid["reserved"], "freed block stays cached"
    t = torch.empty(1000, dtype=torch.float32, device=dev)
    again = torch.saturn.memory_stats(dev)
    assert again["hits"] - after_free["hits"] == 1
    assert again["misses"] == after_free["misses"]
    assert again["allocated"] - before["allocated"] == 4096
    assert torch.accelerator.max_memory_allocated(i) >= again["allocated"]
    del t


def test_size_classes():
    assert torch.saturn.size_class(1) == 512
    assert torch.saturn.size_class(4000) == 4096
    assert torch.saturn.size_class((1 << 20) - 1) == 1 << 20
    assert torch.saturn.size_class((1 << 20) + 1) == 2 << 20
    assert torch.saturn.size_class(5 << 20) == 6 << 20


def test_empty_cache_releases(dev):
    t = torch.empty(3 << 20, dtype=torch.uint8, device=dev)
    del t
    reserved = torch.saturn.memory_reserved(dev)
    released = torch.saturn.empty_cache(dev)
    assert released >= 4 << 20
    assert torch.saturn.memory_reserved(dev) == reserved - released
    torch.accelerator.empty_cache()


def test_fallback_counter_moves_for_op_without_kernel(dev):
    x = torch.randn(8)
    y = x.to(dev)
    before = saturn.fallback_counts()
    z = torch.sin(y)
    after = saturn.fallback_counts()
    assert after.get("aten::sin.out", 0) + after.get("aten::sin", 0) > before.get(
        "aten::sin.out", 0
    ) + before.get("aten::sin", 0)
    assert z.device == torch.device(dev)
    torch.testing.assert_close(z.cpu(), torch.sin(x), rtol=1e-5, atol=0)
    # A native kernel (a view) does not go through the fallback.
    before = saturn.fallback_counts()
    y.view(2, 4)
    assert saturn.fallback_counts() == before


def test_autograd_mlp_matches_cpu(dev):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).to(dev)
    model.load_state_dict(cpu_model.state_dict())
    x = torch.randn(8, 16)
    target = torch.randn(8, 4)
    torch.nn.functional.mse_loss(cpu_model(x), target).backward()
    loss = torch.nn.functional.mse_loss(model(x.to(dev)), target.to(dev))
    loss.backward()
    for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters(), strict=True):
        assert p.grad.device == torch.device(dev), name
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-7)


def test_save_load_and_map_location(dev):
    x = torch.randn(4, 5)
    buf = io.BytesIO()
    torch.save({"x": x.to(dev), "t": x.t().to(dev)}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["x"].device == torch.device(dev)
    assert torch.equal(loaded["x"].cpu(), x)
    assert torch.equal(loaded["t"].cpu(), x.t())
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["x"].device.type == "cpu" and torch.equal(on_cpu["x"], x)
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    moved = torch.load(buf, map_location=dev)
    assert moved.device == torch.device(dev) and torch.equal(moved.cpu(), x)


def test_bad_input_raises_and_process_keeps_working(dev):
    with pytest.raises(IndexError, match="saturn:9 does not exist"):
        torch.empty(3, device="saturn:9")
    with pytest.raises(RuntimeError, match="must match the existing size"):
        torch.empty(3, device=dev).copy_(torch.empty(4))
    with pytest.raises(RuntimeError, match="cannot be pinned"):
        torch.empty(3, device=dev, pin_memory=True)
    # still usable afterwards
    assert torch.equal(torch.ones(3, device=dev).cpu(), torch.ones(3))


def test_pinned_memory_and_a_pinning_data_loader_work_without_a_gpu():
    """saturn makes itself the accelerator; with only saturn:0, pinning is plain host
    memory (nothing to pin for), so DataLoader(pin_memory=True) gives the batches it gives
    without saturn."""
    from torch.utils.data import DataLoader, TensorDataset

    if torch.saturn.gpu_count() > 0:
        pytest.skip("this machine has a GPU: pinning is real there (tests/device/test_gpu.py)")
    x = torch.randn(10, 3)
    p = x.pin_memory()
    assert p.is_pinned() and torch.equal(p, x) and p.data_ptr() != x.data_ptr()
    assert torch.empty(4, pin_memory=True).is_pinned()
    batches = [b for (b,) in DataLoader(TensorDataset(x), batch_size=4, pin_memory=True)]
    assert torch.equal(torch.cat(batches), x) and [len(b) for b in batches] == [4, 4, 2]
    assert torch.equal(p.to("saturn:0").cpu(), x)  # a copy from it works as from any memory


def test_saturn1_without_gpu_is_a_clear_error():
    if torch.saturn.gpu_count() > 0:
        pytest.skip("this machine has a GPU, so saturn:1 exists")
    with pytest.raises(IndexError, match=r"only saturn:0.*no GPU"):
        torch.empty(3, device="saturn:1")
    with pytest.raises(IndexError, match="only saturn:0"):
        torch.saturn.set_device(1)
    assert torch.saturn.current_device() == 0
    assert torch.ones(2, device="saturn:0").sum().item() == 2.0
