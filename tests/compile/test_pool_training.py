"""Pools in training graphs, compiled with no host op. max_pool2d with its indices (what a
training forward saves) and its backward: the values bit for bit and the indices equal to
eager's on the CPU (special values: NaN, -inf windows, ties, both zeros), the input's
gradient as eager's (exact where windows do not overlap; overlapping windows add in the
row add's order). avg_pool2d's backward: a quotient per output added over its window."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from saturn import backend

# kernel, stride, padding, dilation, ceil mode, input shape
POOLS = {
    "resnet-stem": (3, 2, 1, 1, False, (2, 3, 9, 9)),
    "tiles": (2, 2, 0, 1, False, (1, 2, 6, 6)),
    "dilated": (3, 1, 1, 2, False, (1, 2, 9, 8)),
    "ceil-mode": (3, 2, 0, 1, True, (1, 2, 8, 8)),
    "rectangular": ((2, 3), (1, 2), (1, 1), 1, False, (1, 1, 5, 7)),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def _input(shape, dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(shape)
    plane = x[0, 0]
    plane[0, 0] = plane[0, 1] = float("nan")  # two NaNs in a window: the last wins
    plane[2, 2] = plane[2, 3] = 5.0  # equal maxima: the first wins
    plane[1:4, 4:7] = float("-inf")  # a window of -inf alone: its first element
    plane[4, 0], plane[4, 1] = -0.0, 0.0  # both zeros, maxima where all else is negative
    plane[3:6, 0:3] = torch.minimum(plane[3:6, 0:3], torch.tensor(-1.0))
    plane[4, 0], plane[4, 1] = -0.0, 0.0
    return x.to(dtype)


def _pool(x, name):
    k, s, p, d, ceil, _ = POOLS[name]
    return functional.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


def _programs(dev):
    return [
        g.compiled.program
        for g in backend.CACHE.items.values()
        if g.recipe.device == torch.device(dev)
    ]


def _host_steps(prog, dev: str, dtype: str) -> int:
    """None, but for bfloat16 on saturn:0, which runs half types' elementwise steps through
    PyTorch's CPU ops (the CPU reference has no half kernels): there, no opaque op."""
    if dtype == "f32" or dev != "saturn:0":
        return 0
    opaque = [s.op for s in prog.steps if s.kind == "host" and s.op.startswith("aten.")]
    assert opaque == [], opaque
    return prog.count("host")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(POOLS))
def test_max_pool_indices_are_pytorchs(dev, name, dtype):
    x = _input(POOLS[name][5], DTYPES[dtype])
    want_v, want_i = _pool(x, name)
    torch._dynamo.reset()
    backend.CACHE.clear()
    g = torch.compile(lambda t: _pool(t, name), backend="saturn", options={"device": dev})
    got_v, got_i = g(x.to(dev))
    assert torch.equal(got_i.cpu(), want_i)
    got_v, nan = got_v.cpu(), want_v.isnan()
    assert nan.any() and torch.equal(got_v.isnan(), nan)
    # bit for bit but NaN's payload (PyTorch's CPU pool writes a half type's canonical NaN)
    assert torch.equal(_bits(got_v)[~nan], _bits(want_v)[~nan])
    (prog,) = _programs(dev)
    assert prog.count("host") == _host_steps(prog, dev, dtype), prog.to_text()


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(POOLS))
def test_max_pool_backward_runs_on_the_device(dev, name, dtype):
    x = _input(POOLS[name][5], DTYPES[dtype])  # the loss is NaN; its gradient is weight
    torch.manual_seed(1)
    weight = torch.randn_like(_pool(x, name)[0])

    def loss(t, wt):
        return (_pool(t, name)[0] * wt).sum()

    want = x.clone().requires_grad_()
    loss(want, weight).backward()
    got = x.to(dev).requires_grad_()
    torch._dynamo.reset()
    backend.CACHE.clear()
    fallbacks = len(backend.CACHE.fallbacks)
    torch.compile(loss, backend="saturn", options={"device": dev})(got, weight.to(dev)).backward()
    assert backend.CACHE.fallbacks[fallbacks:] == []
    tol = {"f32": 1e-6, "bf16": 1e-2}[dtype]
    torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=tol, atol=tol)
    if name == "tiles":  # one gradient per element: exact
        assert torch.equal(got.grad.cpu(), want.grad)
    progs = _programs(dev)
    assert len(progs) == 2
    for prog in progs:
        assert prog.count("host") == _host_steps(prog, dev, dtype), prog.to_text()


def _grads(loss, x: torch.Tensor, weight: torch.Tensor, dev: str):
    """``x``'s gradient of ``loss(x, weight)`` compiled on ``dev`` (fresh caches) and in
    eager on the CPU."""
    want = x.clone().requires_grad_()
    loss(want, weight).backward()
    got = x.to(dev).requires_grad_()
    torch._dynamo.reset()
    backend.CACHE.clear()
    torch.compile(loss, backend="saturn", options={"device": dev})(got, weight.to(dev)).backward()
    return got.grad.cpu(), want.grad


# kernel, stride, padding, input shape
AVG_POOLS = {
    "densenet-transition": (2, 2, 0, (2, 3, 8, 8)),
    "overlapping-padded": (3, 1, 1, (1, 2, 6, 7)),
    "strided-padded": (3, 2, 1, (2, 2, 9, 9)),
    "rectangular": ((2, 3), (2, 1), (1, 1), (1, 1, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(AVG_POOLS))
def test_avg_pool_backward_runs_on_the_device(dev, name):
    """Each output's gradient divided by the window's size and added over its window:
    exact where windows do not overlap (a quotient per element), else within float32's
    rounding of the sum; no host op either way."""
    k, s, p, shape = AVG_POOLS[name]
    torch.manual_seed(0)
    x = torch.randn(shape)
    weight = torch.randn_like(functional.avg_pool2d(x, k, s, p))

    def loss(t, wt):
        return (functional.avg_pool2d(t, k, s, p) * wt).sum()

    got, want = _grads(loss, x, weight, dev)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if name == "densenet-transition":
        assert torch.equal(got, want)
    for prog in _programs(dev):
        assert prog.count("host") == 0, prog.to_text()


def test_an_avg_pool_backward_leaving_padding_out_of_the_count_stays_pytorchs_op():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 6)

    def fn(t):
        return functional.avg_pool2d(t, 3, 1, 1, count_include_pad=False)

    want = x.clone().requires_grad_()
    fn(want).sum().backward()
    got = x.to("saturn:0").requires_grad_()
    torch._dynamo.reset()
    backend.CACHE.clear()
    torch.compile(fn, backend="saturn")(got).sum().backward()
    torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-6, atol=1e-6)
    hosts = [s.op.split("#")[0] for p in _programs("saturn:0") for s in p.steps if s.kind == "host"]
    assert "aten.avg_pool2d_backward.default" in hosts, hosts


def test_a_max_pool_whose_window_is_too_large_keeps_its_indices_call():
    """Past POOL_WINDOW_LIMIT window elements (a 9x9 window: 81) the fold declines: the
    op stays PyTorch's call, indices and values as eager's."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 12, 12)
    want_v, want_i = functional.max_pool2d(x, 9, 1, 0, return_indices=True)
    torch._dynamo.reset()
    backend.CACHE.clear()
    g = torch.compile(
        lambda t: functional.max_pool2d(t, 9, 1, 0, return_indices=True), backend="saturn"
    )
    got_v, got_i = g(x.to("saturn:0"))
    assert torch.equal(got_i.cpu(), want_i) and torch.equal(got_v.cpu(), want_v)
    (prog,) = _programs("saturn:0")
    hosts = [s.op.split("#")[0] for s in prog.steps if s.kind == "host" and s.op != "Item"]
    assert hosts == ["aten.max_pool2d_with_indices.default"], prog.to_text()


def _pool_gradient_adds(prog) -> list:
    """The program's row adds (the pool gradient's scatter) and whether each is bounded."""
    from saturn.eqsat.kinds import Kind
    from saturn.eqsat.ranges import indices_in_range

    return [
        indices_in_range(prog, s)
        for s in prog.steps
        if s.kernel is not None and s.kernel.kind == Kind.SCATTER
    ]


def test_saved_pool_indices_need_no_check_in_the_backward(dev):
    """Decision 0133: the indices a compiled forward's pool saves are clamped into their
    plane where its backward reads them (the same values): the backward's row add is
    bounded, so no error word is read back after the call (which waits for the device),
    and the gradient is eager's."""
    x = _input(POOLS["resnet-stem"][5], torch.float32)
    x = torch.nan_to_num(x, nan=0.5, neginf=-3.0)
    torch.manual_seed(1)
    weight = torch.randn_like(_pool(x, "resnet-stem")[0])

    def loss(t, wt):
        return (_pool(t.relu(), "resnet-stem")[0] * wt).sum()

    got, want = _grads(loss, x, weight, dev)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    _, backward = _programs(dev)
    assert _pool_gradient_adds(backward) == [True], backward.to_text()
    runner = getattr(
        next(g.recipe for g in backend.CACHE.items.values() if g.compiled.program is backward),
        "runner",
        None,
    )
    if runner is not None:  # a GPU's: the call stays asynchronous
        assert not runner._unbounded_indices


def test_pool_gradient_of_other_indices_is_checked(dev):
    """Indices that are not a compiled forward's saved ones (a direct call of the pool's
    backward) keep the row add's check: an index past the input fails the compiled call
    (which then runs PyTorch's op, as a failed call does)."""
    x = torch.randn(1, 1, 4, 4)
    grad = torch.ones(1, 1, 2, 2)
    op = torch.ops.aten.max_pool2d_with_indices_backward.default

    def f(g, t, idx):
        return op(g, t, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)

    torch._dynamo.reset()
    backend.CACHE.clear()
    g = torch.compile(f, backend="saturn", options={"device": dev})
    ok = torch.tensor([[[[0, 3], [9, 15]]]])
    torch.testing.assert_close(g(grad.to(dev), x.to(dev), ok.to(dev)).cpu(), f(grad, x, ok))
    (prog,) = _programs(dev)
    assert _pool_gradient_adds(prog) == [False], prog.to_text()
    bad = torch.tensor([[[[0, 3], [9, 16]]]])  # past the input's last element
    failed = len(backend.CACHE.failed_calls)
    g(grad.to(dev), x.to(dev), bad.to(dev))  # PyTorch's CPU op does not raise: its result
    assert "out of" in " ".join(backend.CACHE.failed_calls[failed:])  # the check fired
