"""``torch.autocast("saturn")``: CUDA's op policy on saturn tensors (products in the lower
precision, precision-sensitive ops in float32, mixed-type ops promoted), eager and
compiled, and ``torch.amp.GradScaler("saturn")``. Each result equals the same ops with
the casts written out on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from saturn import backend

DEV = torch.device("saturn:0")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_policy_per_op(dtype):
    torch.manual_seed(0)
    a, b, w = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    da, db, dw = a.to(DEV), b.to(DEV), w.to(DEV)
    with torch.autocast("saturn", dtype=dtype):
        y = da @ db  # lower precision
        s = torch.softmax(y, -1)  # float32
        p = torch.addcmul(dw, y, y)  # promoted to the widest operand type
        e = y + 1  # not listed: runs in its operands' type
    want = a.to(dtype) @ b.to(dtype)
    assert y.dtype == dtype and y.device == DEV and torch.equal(y.cpu(), want)
    assert s.dtype == torch.float32 and torch.equal(s.cpu(), torch.softmax(want.float(), -1))
    assert p.dtype == torch.float32
    torch.testing.assert_close(p.cpu(), torch.addcmul(w, want.float(), want.float()))
    assert e.dtype == dtype
    assert (da @ db).dtype == torch.float32  # outside the region nothing is cast


def test_cpu_tensors_are_not_cast_by_the_saturn_region():
    a = torch.randn(2, 2)
    with torch.autocast("saturn", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.float32


def test_a_compiled_region_matches_the_written_out_casts():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dm = copy.deepcopy(m).to(DEV)
    x = torch.randn(5, 8)

    def f(mod, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return mod(x).softmax(-1)

    def written_out(x):
        bf = torch.bfloat16
        h = torch.relu(torch.addmm(m[0].bias.to(bf), x.to(bf), m[0].weight.to(bf).t()))
        return torch.addmm(m[2].bias.to(bf), h, m[2].weight.to(bf).t()).float().softmax(-1)

    torch._dynamo.reset()
    fallbacks = len(backend.CACHE.fallbacks)
    with torch.no_grad():
        got = torch.compile(lambda x: f(dm, x), backend="saturn", dynamic=False)(x.to(DEV))
        eager = f(dm, x.to(DEV))
        want = written_out(x)
    assert backend.CACHE.fallbacks[fallbacks:] == []  # the region compiled
    assert got.dtype == torch.float32 and got.device == DEV
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(eager.cpu(), want)


def test_grad_scaler_skips_a_step_with_infinite_gradients():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2).to(DEV)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("saturn", init_scale=2.0**10)
    x = torch.randn(3, 4).to(DEV)
    with torch.autocast("saturn", dtype=torch.float16):
        loss = lin(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    before = lin.weight.detach().cpu().clone()
    grad = lin.weight.grad.detach().cpu() / 2.0**10
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(lin.weight.detach().cpu(), before - 0.1 * grad)
    assert scaler.get_scale() == 2.0**10  # growth needs 2000 good steps
    opt.zero_grad()
    with torch.autocast("saturn", dtype=torch.float16):
        loss = lin(x * float("inf")).float().sum()
    scaler.scale(loss).backward()
    before = lin.weight.detach().cpu().clone()
    scaler.step(opt)  # skipped: a gradient is not finite
    scaler.update()
    assert torch.equal(lin.weight.detach().cpu(), before)
    assert scaler.get_scale() == 2.0**9  # backed off
