"""Tensor constants made inside a compiled function (``get_attr`` nodes) are the graph's
leading inputs: the graph compiles, and the values are the ones each graph holds."""

from __future__ import annotations

import torch

from saturn import backend
from saturn.constants import lift_constants

from .helpers import DEV, compile_and_compare, last_compiled


def test_a_constant_made_in_the_function_compiles():
    def f(x):
        w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, float("inf")]], device=x.device)
        return x @ w + torch.tensor([1.0, 2.0, 3.0], device=x.device)

    fallbacks = len(backend.CACHE.fallbacks)
    compile_and_compare(f, torch.randn(4, 2))
    assert backend.CACHE.fallbacks[fallbacks:] == []
    recipe = last_compiled().recipe
    assert len(recipe.inputs) == 3  # the two constants, then x
    assert last_compiled().compiled.program.kernels


def test_same_graph_with_other_constant_values_gives_its_own_values():
    """The cache key covers a constant's type, not its value: the values travel with each
    compiled function, so two functions sharing a recipe still give their own results."""

    def make(scale):
        def f(x):
            return x * torch.tensor([scale, -scale], device=x.device)

        return f

    x = torch.randn(3, 2)
    torch._dynamo.reset()
    f2, f5 = make(2.0), make(5.0)
    compiles = backend.CACHE.compiles
    a = torch.compile(f2, backend="saturn", dynamic=False)(x.to(DEV))
    b = torch.compile(f5, backend="saturn", dynamic=False)(x.to(DEV))
    assert backend.CACHE.compiles == compiles + 1  # the second graph was a cache hit
    assert torch.equal(a.cpu(), f2(x)) and torch.equal(b.cpu(), f5(x))


def test_a_graph_without_constants_is_left_as_it_is():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    same, consts = lift_constants(gm)
    assert same is gm and consts == []


def test_constants_lift_ahead_of_the_inputs():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k", torch.tensor([3.0]))

        def forward(self, x):
            return x * self.k

    gm = torch.fx.symbolic_trace(M())
    lifted, consts = lift_constants(gm)
    assert [n.op for n in lifted.graph.nodes] == [
        "placeholder",
        "placeholder",
        "call_function",
        "output",
    ]
    assert torch.equal(lifted(*consts, torch.ones(2)), torch.full((2,), 3.0))
    assert any(n.op == "get_attr" for n in gm.graph.nodes)  # the original is untouched


def _shifted_window_mask(x):
    """Swin's attention mask, built from shapes alone: a zero image, slice assignments of
    region numbers, pairwise differences, a masked fill."""
    m = x.new_zeros((7, 7))
    count = 0
    for h in (slice(0, 3), slice(3, 5), slice(5, 7)):
        for w in (slice(0, 3), slice(3, 7)):
            m[h, w] = count
            count += 1
    differ = (m.view(1, 49) - m.view(49, 1)) != 0
    return x + differ.float().masked_fill(differ, -100.0)


def test_values_built_from_no_input_are_computed_once_when_compiling():
    """Decision 0096: the mask's 25 kernels (pads, slice assignments, comparisons) are one
    constant; the call runs the one addition; the result is eager's to the bit."""
    from saturn import constant_folding

    x = torch.randn(49, 49)
    fallbacks = len(backend.CACHE.fallbacks)
    torch._dynamo.reset()
    compile_and_compare(_shifted_window_mask, x, rtol=0, atol=0)
    assert backend.CACHE.fallbacks[fallbacks:] == []
    folded = last_compiled()
    assert [k.kind for k in folded.compiled.program.kernels] == ["loop"]
    assert len(folded.recipe.inputs) == 2  # the mask, then x
    # the same function with folding held back computes the mask per call
    limit = constant_folding.FOLD_MAX_ELEMENTS
    constant_folding.FOLD_MAX_ELEMENTS = 0
    try:
        torch._dynamo.reset()
        compile_and_compare(_shifted_window_mask, x, rtol=0, atol=0)
        assert len(last_compiled().compiled.program.kernels) > 10
    finally:
        constant_folding.FOLD_MAX_ELEMENTS = limit


def test_folding_declines_what_is_not_the_same_bits_everywhere():
    """A sine (libm's rounding is the device's), a float-to-integer conversion (NaN and
    overflow convert as the device's instruction does), anything built from arange (the
    importer reads its structure) and a fill (read as a scalar, not from memory) stay
    computed per call (a value past the size limit too: the test above); the traced graph
    itself is never changed; pads of a fill fold."""
    from torch._functorch.aot_autograd import aot_function

    from saturn.constant_folding import fold_constants

    def f(x):
        t = torch.arange(8, device=x.device, dtype=torch.float32)
        z = torch.nn.functional.pad(torch.zeros(4, device=x.device), (2, 2), value=1.0)
        z = z.masked_fill(torch.arange(8, device=x.device) > 5, -1.0) + z
        w = torch.nn.functional.pad(torch.zeros(4, device=x.device), (3, 1), value=2.0)
        return x + torch.sin(t) + (t * 0.5).to(torch.int32) + torch.full((8,), 2.0) + z + w

    graphs = []

    def grab(g, _):
        graphs.append(g)
        return g

    aot_function(f, fw_compiler=grab)(torch.randn(8))
    gm = graphs[0]
    before = gm.code
    out = fold_constants(gm, torch.device("cpu"))
    assert gm.code == before  # the original is left for the uncompiled path
    ops = {n.target for n in out.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.sin.default in ops
    assert torch.ops.aten._to_copy.default in ops  # the float-to-int conversion
    assert torch.ops.aten.arange.start_step in ops or torch.ops.aten.arange.default in ops
    assert torch.ops.aten.full.default in ops  # a fill: read as a scalar
    # z's pad (read by a masked fill that reads arange) and w: pads of a fill, folded
    tables = [getattr(out, n.target) for n in out.graph.nodes if n.op == "get_attr"]
    assert all(t.device.type == "cpu" for t in tables)
    assert sorted(t.tolist() for t in tables) == [
        [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0],
        [2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 2.0],
    ]
    x = torch.randn(8)
    (got,) = out(x)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
