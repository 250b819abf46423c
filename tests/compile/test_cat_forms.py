"""cat in the forms real models write it: empty pieces (a key/value cache before its first
step is PyTorch's legacy 1-D empty tensor; a zero-length slice), pieces of unequal sizes,
computed pieces, any dimension, mixed dtypes. Each runs compiled on saturn:0 with no host
op, equal to eager, into memory of its own."""

from __future__ import annotations

import pytest
import torch

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
