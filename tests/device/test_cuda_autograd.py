"""CUDA autograd after ``import saturn`` (decision 0094): a backward whose roots are CUDA
tensors runs with CUDA as torch's accelerator; saturn's and the CPU's backwards, and the
device's name, are unchanged around it."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest
import torch

import saturn  # noqa: F401
from saturn import cuda_autograd as ca

FOUND = platform.machine() == "x86_64" and torch.backends.cuda.is_built()


def _fake_cuda(*shape):
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(*shape, device="cuda")


@pytest.mark.skipif(not FOUND, reason="the flag is looked for in x86-64 builds with CUDA")
def test_the_flag_is_found_and_each_context_restores_it():
    assert ca.status() == "", ca.status()
    assert torch.accelerator.current_accelerator().type == "saturn"
    with ca.cuda_is_the_accelerator():
        assert torch.accelerator.current_accelerator().type == "cuda"
        with ca.cuda_is_the_accelerator():  # a hook's own backward, nested
            assert torch.accelerator.current_accelerator().type == "cuda"
        assert torch.accelerator.current_accelerator().type == "cuda"  # still the outer's
    assert torch.accelerator.current_accelerator().type == "saturn"
    assert (
        torch.device("saturn:0").type == "saturn"
        and str(torch.ones(1, device="saturn:0").device) == "saturn:0"
    )
    with pytest.raises(RuntimeError, match="in the backward"), ca.cuda_is_the_accelerator():
        raise RuntimeError("an error in the backward restores the flag too")
    assert torch.accelerator.current_accelerator().type == "saturn"


@pytest.mark.skipif(not FOUND, reason="the flag is looked for in x86-64 builds with CUDA")
def test_only_backwards_rooted_on_cuda_see_cuda_as_the_accelerator():
    seen = []

    def run(outputs, *args, **kwargs):
        seen.append(torch.accelerator.current_accelerator().type)
        return ()

    wrapped = ca._wrap(run)
    wrapped((_fake_cuda(2),), None)
    wrapped(_fake_cuda(2), None)
    wrapped((torch.ones(2),), None)
    wrapped((torch.ones(2, device="saturn:0"),), None)
    assert seen == ["cuda", "cuda", "saturn", "saturn"]
    assert torch.autograd._engine_run_backward._saturn  # what backward() and grad() call
    assert torch.autograd.graph._engine_run_backward._saturn


def test_saturn_and_cpu_backwards_are_unchanged():
    seen = []
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    xs = x.detach().to("saturn:0").requires_grad_()
    for t in (x, xs):
        y = (t * t).sum()
        y.register_hook(lambda g: seen.append(torch.accelerator.current_accelerator().type))
        y.backward()
    assert seen == ["saturn", "saturn"]
    torch.testing.assert_close(xs.grad.cpu(), x.grad, rtol=0, atol=0)
    (g,) = torch.autograd.grad((xs * 3).sum(), xs)
    torch.testing.assert_close(g.cpu(), torch.full((3,), 3.0), rtol=0, atol=0)


def test_a_byte_that_is_not_the_flag_is_not_used(monkeypatch):
    """Where the function's code is not the load saturn knows, nothing is written."""
    monkeypatch.setattr(ca, "_why", ca._why)  # restored after the test
    monkeypatch.setattr(ca.ctypes, "string_at", lambda addr, n: b"\x55\x48\x89\xe5\x00\x00\x00")
    assert ca._find_flag() is None
    assert "not one byte load" in ca._why


GPU_SCRIPT = textwrap.dedent(
    """
    import torch, saturn
    from saturn import cuda_autograd
    assert cuda_autograd.status() == "", cuda_autograd.status()
    # saturn used first: a compile on saturn:1
    f = torch.compile(lambda a: torch.relu(a) * 2, backend="saturn")
    a = torch.randn(64, device="saturn:1")
    assert torch.equal(f(a).cpu(), torch.relu(a.cpu()) * 2)
    # then CUDA autograd, as a user's training loop would
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    ref.load_state_dict(model.state_dict())
    model = model.cuda()
    x = torch.randn(32, 8)
    for m, inp in ((model, x.cuda()), (ref, x)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            m(inp).square().mean().backward()
            opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
    y = torch.randn(4, 4, device="cuda", requires_grad=True)
    (g,) = torch.autograd.grad((y * y).sum(), y)
    torch.testing.assert_close(g, 2 * y.detach())
    assert torch.accelerator.current_accelerator().type == "saturn"
    print("ok")
    """
)


@pytest.mark.gpu
def test_cuda_training_after_a_saturn_compile_in_one_process():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    out = subprocess.run(
        [sys.executable, "-c", GPU_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
