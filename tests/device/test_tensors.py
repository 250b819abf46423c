"""Eager saturn tensors: factories, copies for every dtype, printing, views, resize_, set_."""

from __future__ import annotations

import pytest
import torch

import saturn

# Every dtype PyTorch has that a strided tensor can hold (quantized dtypes need quantizers
# and are not copied bitwise by any device; they are left out on purpose).
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]


def random_bits(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of random bit patterns (NaNs, infinities and -0.0 included)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(dev, dtype):
    x = random_bits((5, 7), dtype)
    y = x.to(dev)
    assert y.device == torch.device(dev) and y.dtype == dtype
    assert torch.equal(bits(y.cpu()), bits(x))
    # Strided (transposed) source: staged through the host on a GPU.
    t = x.t().to(dev)
    assert torch.equal(bits(t.cpu()), bits(x.t()))


def test_factories(dev):
    e = torch.empty(3, 4, device=dev)
    assert e.shape == (3, 4) and e.device == torch.device(dev)
    assert torch.equal(torch.zeros(2, 3, device=dev).cpu(), torch.zeros(2, 3))
    assert torch.equal(
        torch.ones(2, 3, device=dev, dtype=torch.int32).cpu(), torch.ones(2, 3, dtype=torch.int32)
    )
    assert torch.equal(torch.arange(2, 17, 3, device=dev).cpu(), torch.arange(2, 17, 3))
    assert torch.equal(torch.full((4,), 2.5, device=dev).cpu(), torch.full((4,), 2.5))
    torch.manual_seed(1234)
    r = torch.randn(64, device=dev).cpu()
    torch.manual_seed(1234)
    assert torch.equal(r, torch.randn(64)), "randn on saturn draws from the seeded host generator"
    assert r.std() > 0.5


FILLS = [
    (torch.bool, True),
    (torch.uint8, 200),
    (torch.int16, -3),
    (torch.bfloat16, -0.0),
    (torch.float32, float("nan")),
    (torch.float32, -float("inf")),
    (torch.float64, 1.0 / 3.0),  # two different 32-bit words
    (torch.int64, -(2**40) + 7),
    (torch.complex64, 1.5 - 2j),
    (torch.complex128, -0.25 + 3j),  # four words
]


@pytest.mark.parametrize("dtype,value", FILLS, ids=[f"{d}-{v}" for d, v in FILLS])
def test_fill_writes_the_values_bits_without_the_fallback(dev, dtype, value):
    """fill_ (ones_like, zeros, full, a backward seed) writes the value's bits on the
    device: every element, nothing beyond, no CPU-fallback op."""
    before = saturn.fallback_counts()
    base = torch.full((1031,), 7, dtype=torch.uint8 if dtype == torch.bool else dtype).to(dev)
    x = base[2:1029]  # an offset view: the bytes either side must survive
    x.fill_(value)
    zeros = torch.zeros(5, 3, dtype=dtype, device=dev)
    ones = torch.ones_like(zeros)
    assert saturn.fallback_counts() == before
    want = torch.full((1031,), 7, dtype=base.dtype)
    want[2:1029] = value
    assert torch.equal(bits(base.cpu()), bits(want))
    assert torch.equal(bits(zeros.cpu()), bits(torch.zeros(5, 3, dtype=dtype)))
    assert torch.equal(bits(ones.cpu()), bits(torch.ones(5, 3, dtype=dtype)))


def test_fill_of_strided_views_and_values_out_of_range(dev):
    x = torch.zeros(6, 5, device=dev)
    x[:, 1].fill_(2.0)  # a strided view: the rest of x is kept
    x.t()[3].fill_(-1.0)
    want = torch.zeros(6, 5)
    want[:, 1], want[:, 3] = 2.0, -1.0
    assert torch.equal(x.cpu(), want)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.empty(3, dtype=torch.int8, device=dev).fill_(1000)


def test_fill_with_a_tensor_value(dev):
    before = saturn.fallback_counts()
    x = torch.zeros(4, 3, device=dev)
    x.fill_(torch.tensor(2.5))  # a CPU scalar tensor
    x[1].fill_(torch.tensor(-1.0, dtype=torch.float64).to(dev))  # one on the device
    assert saturn.fallback_counts() == before
    want = torch.full((4, 3), 2.5)
    want[1] = -1.0
    assert torch.equal(x.cpu(), want)
    with pytest.raises(RuntimeError, match="0-dimension"):
        x.fill_(torch.ones(2))


def test_copy_converts_dtype_and_layout(dev):
    x = torch.randn(6, 5)
    y = torch.empty(5, 6, dtype=torch.float64, device=dev).t()  # strided destination
    y.copy_(x)
    assert torch.equal(y.cpu(), x.double())
    z = x.to(dev).to(torch.float16)
    assert torch.equal(z.cpu(), x.half())
    back = torch.empty(6, 5, dtype=torch.float64)
    back.copy_(y)
    assert torch.equal(back, x.double())
    # device to device on the same saturn device, dense and strided
    assert torch.equal(y.clone().cpu(), x.double())
    assert torch.equal(y.contiguous().cpu(), x.double())


def test_printing(dev):
    x = torch.tensor([[1.5, -2.0], [float("nan"), float("inf")]], device=dev)
    s = repr(x)
    assert f"device='{dev}'" in s
    assert "1.5000" in s and "nan" in s and "inf" in s


def test_views_share_storage_and_write_through(dev):
    base_cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = base_cpu.to(dev)
    v = base.view(6, 4)
    p = base.permute(1, 0)
    s = base[1:3, 2:5]
    e = base[0:1].expand(3, 6)
    ptr = base.untyped_storage().data_ptr()
    for view in (v, p, s, e):
        assert view.untyped_storage().data_ptr() == ptr
    s.mul_(-1)  # in place through a slice
    p[0, 0] = 100.0  # through a permutation
    expect = base_cpu.clone()
    expect[1:3, 2:5] *= -1
    expect[0, 0] = 100.0
    assert torch.equal(base.cpu(), expect)
    assert torch.equal(v.cpu(), expect.view(6, 4))
    assert torch.equal(e.cpu(), expect[0:1].expand(3, 6))
    assert torch.equal(base.reshape(2, 12).cpu(), expect.reshape(2, 12))


def test_views_with_per_device_kernels_are_views(dev):
    """unfold and view_as_real/complex have per-device kernels in PyTorch: saturn registers
    them (a fallback would hand back a copy, and a write through it would be lost)."""
    base_cpu = torch.arange(10, dtype=torch.float32)
    base = base_cpu.to(dev)
    before = saturn.fallback_counts()
    u = base.unfold(0, 3, 2)
    assert u.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    u[1, 0] = -1.0  # element 2 of the base
    expect = base_cpu.clone()
    expect[2] = -1.0
    assert torch.equal(base.cpu(), expect) and torch.equal(u.cpu(), expect.unfold(0, 3, 2))
    c_cpu = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)
    c = c_cpu.to(dev)
    r = torch.view_as_real(c)
    assert r.shape == (2, 2) and r.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
    r[1, 1] = 7.0
    assert torch.equal(c.cpu(), torch.tensor([1 + 2j, -3 + 7j], dtype=torch.complex64))
    back = torch.view_as_complex(r)
    assert back.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
    assert saturn.fallback_counts() == before  # no op went through the fallback


def test_resize_keeps_contents(dev):
    x = torch.arange(6, dtype=torch.float32).to(dev)
    x.resize_(2, 5)
    assert x.shape == (2, 5)
    assert torch.equal(x.flatten()[:6].cpu(), torch.arange(6, dtype=torch.float32))
    x.resize_(2)
    assert torch.equal(x.cpu(), torch.tensor([0.0, 1.0]))
    with pytest.raises(RuntimeError, match="negative"):
        x.resize_(-1)


def test_set_variants(dev):
    src = torch.arange(10, dtype=torch.float32).to(dev)
    t = torch.empty(0, device=dev)
    t.set_(src)
    assert t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    u = torch.empty(0, device=dev).set_(src.untyped_storage(), 2, (2, 3), (3, 1))
    assert torch.equal(u.cpu(), torch.arange(10.0)[2:].as_strided((2, 3), (3, 1)))
    w = torch.empty(0, device=dev).set_(src.untyped_storage())
    assert w.shape == (10,)
    z = torch.ones(3, device=dev).set_()
    assert z.shape == (0,)


def test_local_scalar(dev):
    x = torch.tensor([3.25, -1.0], device=dev)
    assert x[0].item() == 3.25
    assert torch.tensor(7, dtype=torch.int64, device=dev).item() == 7
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        x.item()
