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
