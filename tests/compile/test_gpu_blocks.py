"""Compiled blocks on the GPU (marker gpu): nvmath GEMMs, cuDNN convolutions and
CUDA-graph replay, against eager PyTorch on the CPU, with proof of where the work ran."""

from __future__ import annotations

import copy

import pytest
import torch

import saturn
from saturn import backend

from .blocks import WORKLOADS, make

pytestmark = pytest.mark.gpu
GPU = "saturn:1"


def compiled_on_gpu(model, options=None):
    torch._dynamo.reset()
    dev_model = copy.deepcopy(model).to(GPU)
    return torch.compile(dev_model, backend="saturn", options=options or {}, dynamic=False)


def recipes_of(before: int) -> list:
    """The recipes compiled since ``before`` compiles (most recent last)."""
    n = backend.CACHE.compiles - before
    items = list(backend.CACHE.items.values())
    return [cg.recipe for cg in items[-n:]] if n > 0 else []


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_block_matches_eager_and_replays(name):
    model, x = make(name)
    with torch.no_grad():
        want = model(x)
        compiles = backend.CACHE.compiles
        fn = compiled_on_gpu(model)
        xd = x.to(GPU)
        # compiling may run an op without a meta kernel on zeros (fake-tensor fallback)
        outs = [fn(xd)]  # compiled, then run step by step
        fb = saturn.fallback_counts()
        outs += [fn(xd) for _ in range(2)]  # captured, replayed
        assert saturn.fallback_counts() == fb, "a compiled call used the CPU fallback"
    (recipe,) = recipes_of(compiles)
    prog = recipe.program
    kinds = [k.kind for k in prog.kernels]
    lib = "conv" if name.startswith("resnet") else "gemm"
    assert lib in kinds, kinds
    # every GEMM and convolution on the device, nothing on the host, no crossing: the input
    # and the output are saturn tensors already
    assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
    assert recipe.last.crossings == 0
    runner = recipe.runner
    assert runner.captures >= 1 and runner.replays >= 2, (runner.captures, runner.replays)
    for got in outs:
        assert got.device == torch.device(GPU)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)


def test_replay_sees_inputs_changed_in_place_and_new_addresses():
    model, _ = make("mlp-8x128x512")
    x = torch.randn(3, 40, 512)  # a shape no other test compiles: a recipe of its own
    with torch.no_grad():
        compiles = backend.CACHE.compiles
        fn = compiled_on_gpu(model)
        xd = x.to(GPU)
        fn(xd)
        fn(xd)  # captured
        (recipe,) = recipes_of(compiles)
        runner = recipe.runner
        captures, replays = runner.captures, runner.replays
        assert (captures, replays) == (1, 1)
        xd.mul_(-0.5).add_(0.25)  # same address, new values
        got = fn(xd)
        torch.testing.assert_close(got.cpu(), model(xd.cpu()), rtol=1e-5, atol=1e-4)
        assert (runner.captures, runner.replays) == (captures, replays + 1)
        y = torch.randn(x.shape)
        got = fn(y.to(GPU))  # a new address: staged, captured once more
        torch.testing.assert_close(got.cpu(), model(y), rtol=1e-5, atol=1e-4)
        z = torch.randn(x.shape)
        got = fn(z.to(GPU))  # staged: copied in, no new capture
        torch.testing.assert_close(got.cpu(), model(z), rtol=1e-5, atol=1e-4)
        assert (runner.captures, runner.replays) == (captures + 1, replays + 3)


def test_replay_off_by_option_gives_the_same_results():
    model, x = make("encoder-8x128x512")
    with torch.no_grad():
        fn = compiled_on_gpu(model, {"replay": False})
        xd = x.to(GPU)
        outs = [fn(xd) for _ in range(3)]
        runner = recipes_of(backend.CACHE.compiles - 1)[-1].runner
        assert runner.captures == 0 and runner.replays == 0
        for got in outs:
            torch.testing.assert_close(got.cpu(), model(x), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("approximate,epilogue", [("tanh", "gelu_bias"), ("none", "bias")])
def test_gelu_epilogue_folds_only_for_tanh(approximate, epilogue):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(approximate=approximate))
    x = torch.randn(64, 256)
    with torch.no_grad():
        fn = compiled_on_gpu(model)
        got = fn(x.to(GPU))
        torch.testing.assert_close(got.cpu(), model(x), rtol=1e-5, atol=1e-5)
    prog = recipes_of(backend.CACHE.compiles - 1)[-1].program
    gemms = [k for k in prog.kernels if k.kind == "gemm"]
    assert [k.attrs["epilogue"] for k in gemms] == [epilogue]
    loops = [k for k in prog.kernels if k.kind == "loop"]
    assert bool(loops) == (approximate == "none")  # exact GELU stays a loop after the GEMM


def test_tf32_option_is_looser_than_float32():
    torch.manual_seed(2)
    a, b = torch.randn(512, 1024), torch.randn(1024, 512)
    want = a.double() @ b.double()
    errs = {}
    for tf32 in (False, True):
        torch._dynamo.reset()
        fn = torch.compile(
            lambda a, b: a @ b, backend="saturn", options={"tf32": tf32}, dynamic=False
        )
        got = fn(a.to(GPU), b.to(GPU)).cpu().double()
        errs[tf32] = (got - want).abs().max().item()
    assert errs[False] < 1e-3 < errs[True], errs
