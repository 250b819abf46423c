"""cat in the forms real models write it: empty pieces (a key/value cache before its first
step is PyTorch's legacy 1-D empty tensor; a zero-length slice), pieces of unequal sizes,
computed pieces, any dimension, mixed dtypes. Each runs compiled on saturn:0 with no host
op, equal to eager, into memory of its own."""

from __future__ import annotations

import pytest
import torch

from saturn.codegen.concat import ConcatLauncher

from .helpers import last_compiled

CASES = {
    "legacy-empty-cache": (
        lambda k, x: torch.cat([k, x], dim=-2),
        lambda: [torch.tensor([]), torch.randn(2, 3, 4)],
    ),
    "legacy-empty-computed": (
        lambda k, x: torch.cat([k, x * 2], dim=-2) + 1,
        lambda: [torch.tensor([]), torch.randn(2, 3, 4)],
    ),
    "zero-length-pieces": (
        lambda k, x: torch.cat([k, x, k], dim=1) - x.sum(),
        lambda: [torch.randn(2, 0, 4), torch.randn(2, 3, 4)],
    ),
    "empty-promotes": (
        lambda k, x: torch.cat([k, x], dim=0),
        lambda: [torch.zeros(0, 4, dtype=torch.float64), torch.randn(3, 4)],
    ),
    "unequal-negated": (
        lambda a, b: torch.cat([a, -b, a[:1]], dim=0),
        lambda: [torch.randn(5, 3), torch.randn(2, 3)],
    ),
    "last-dim": (
        lambda a, b: torch.cat([a, b.exp()], dim=-1),
        lambda: [torch.randn(2, 3, 5), torch.randn(2, 3, 7)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cat_runs_on_the_device(name):
    fn, make = CASES[name]
    xs = make()
    mine = [x.to("saturn:0") for x in xs]
    torch._dynamo.reset()
    g = torch.compile(fn, backend="saturn", options={"device": "saturn:0"}, dynamic=False)
    got = g(*mine)
    want = fn(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    prog = last_compiled().compiled.program
    assert prog.count("host") == 0, prog.to_text()
    ptr = got.untyped_storage().data_ptr()
    assert all(ptr != x.untyped_storage().data_ptr() for x in mine if x.numel())


GPU_CASES = {
    **CASES,
    # feature maps joined along channels (DenseNet), bfloat16: packed rows, 8-byte words
    "feature-maps-bf16": (
        lambda a, b, c: torch.cat([a, b, c], dim=1),
        lambda: [torch.randn(4, n, 8, 8).bfloat16() for n in (6, 2, 3)],
    ),
    # a transposed piece: the general kernel
    "transposed-piece": (
        lambda a, b: torch.cat([a, b.t()], dim=0),
        lambda: [torch.randn(3, 5), torch.randn(5, 4)],
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_cat_on_a_gpu(name):
    """The same forms on saturn:1 against eager on the CPU (a computed piece within float32's
    1e-5: the GPU's exp is not the CPU's): pieces with packed rows run the row kernel
    (``row_concat_arguments``), others the general one."""
    fn, make = GPU_CASES[name]
    xs = make()
    mine = [x.to("saturn:1") for x in xs]
    torch._dynamo.reset()
    g = torch.compile(fn, backend="saturn", dynamic=False)
    for _ in range(3):  # the first call, then replays
        got = g(*mine)
    want = fn(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    c = last_compiled()
    assert c.compiled.program.count("host") == 0, c.compiled.program.to_text()
    runner = c.recipe.runner
    concats = [la.kernel for la in runner.launchers.values() if isinstance(la, ConcatLauncher)]
    plans = [p for k in concats for p in k._row_plans.values()]
    if name == "transposed-piece":
        assert plans and all(p is None for p in plans)
    elif name == "feature-maps-bf16":
        assert plans and all(p is not None and p[0] == 8 for p in plans)
