"""Shapes that arrive with the call: one symbolic compile serves every size."""

from __future__ import annotations

import pytest
import torch

from saturn import backend
from saturn.eqsat.program import Kernel, Operand, Program, Step
from saturn.importer import MARKERS
from saturn.symbolic import SymbolicRecipe, instantiate, substitute

M0, M1 = MARKERS[:2]


def test_substitute_replaces_marker_factors_and_nothing_else():
    sizes = {M0: 5, M1: 7}
    assert substitute(3 * M0 * M1, sizes) == 105
    assert substitute(M0 * M0, sizes) == 25
    assert substitute(512, sizes) == 512
    assert substitute(M0 + 1, sizes) == M0 + 1  # not a product of markers: left alone
    assert substitute(4611686018427387904, sizes) == 4611686018427387904  # 2.0's bits


def test_instantiate_rewrites_extents_not_constants():
    body = ("mul", ("in", 0), ("const", 4611686018427387904, "f32"))
    k = Kernel("loop", "v1", "f32", (2, M0), [Operand("v0", "f32", (2, M0), "same")], body, (2, M0))
    prog = Program(
        [
            Step("input", "v0", dtype="f32", shape=(2, M0)),
            Step("kernel", "v1", dtype="f32", shape=(2, M0), kernel=k, place="device"),
            Step("view", "v2", "View", ("v1",), ((2 * M0,),), "f32", (2 * M0,)),
        ],
        ["v2"],
        {"x": "v0"},
    )
    got = instantiate(prog, {M0: 9})
    assert got.steps[1].kernel.domain == (2, 9) and got.steps[1].kernel.body == body
    assert got.steps[2].attrs == ((18,),) and got.steps[2].shape == (18,)
    assert prog.steps[1].kernel.domain == (2, M0)  # the template is untouched


def test_instantiate_sizes_a_loop_groups_other_loops():
    """A loop group (``horizontal.group_loops``) over a symbolic length: the domain of each
    loop beside its own is an extent too."""
    from saturn.eqsat.horizontal import group_loops

    steps, outs = [], []
    for i, shape in enumerate(((M0,), (1, M0))):
        x, y = f"x{i}", f"y{i}"
        k = Kernel(
            "loop", y, "f32", shape, [Operand(x, "f32", shape, "same")], ("exp", ("in", 0)), shape
        )
        steps += [
            Step("input", x, dtype="f32", shape=shape),
            Step("kernel", y, dtype="f32", shape=shape, kernel=k, place="device"),
        ]
        outs.append(y)
    prog = group_loops(Program(steps, outs, {"a": "x0", "b": "x1"}))
    lead = next(s.kernel for s in prog.steps if s.kernel is not None and s.kernel.kind == "loop")
    assert lead.attrs["segments"] == ((1, M0),), prog.to_text()
    got = instantiate(prog, {M0: 5})
    lead = next(s.kernel for s in got.steps if s.kernel is not None and s.kernel.kind == "loop")
    assert lead.domain == (5,) and lead.attrs["segments"] == ((1, 5),)
    assert [s.shape for s in got.steps if s.kernel is not None] == [(5,), (1, 5)]


def test_instantiate_gives_an_arange_its_length():
    prog = Program(
        [
            Step("const", "v0", "Arange", (), (0, 1, M0, "i64"), "i64", (M0,), "device"),
            Step("const", "v1", "Arange", (), (3, 2, 4, "i64"), "i64", (4,), "device"),
        ],
        ["v0", "v1"],
        {},
    )
    got = instantiate(prog, {M0: 6})
    assert got.steps[0].attrs == (0, 1, 6, "i64") and got.steps[0].shape == (6,)
    assert got.steps[1].attrs == (3, 2, 4, "i64")


def test_positions_from_arange_of_a_symbolic_length(dev):
    """arange over the sequence length (positions, a one-hot of them): an Arange constant
    whose length is the symbol's marker, made per size seen, not a reason to run the graph
    uncompiled."""

    def f(x):
        pos = torch.arange(x.shape[1], device=x.device)
        return x * pos[None, :, None].to(x.dtype) + (pos == 2)[None, :, None].to(x.dtype)

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    before = len(backend.CACHE.fallbacks)
    for n in (3, 5, 8):
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(fn(x.to(dev)).cpu(), f(x), rtol=1e-5, atol=1e-5)
    assert backend.CACHE.fallbacks[before:] == []
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    assert isinstance(recipe, SymbolicRecipe) and recipe.built == 3
    prog = recipe.template.program
    (length,) = [s.attrs[2] for s in prog.steps if s.kind == "const" and s.op == "Arange"]
    assert length in MARKERS  # the sequence length's symbol
    assert [s for s in prog.steps if s.kind in ("host", "crossing")] == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_positions_from_arange_of_a_symbolic_length(dev, dtype):
    """Rotary-style tables: float positions over the sequence length are the cast of the
    integer Arange (PyTorch rounds each i once, as the cast does), compiled once for every
    length, the table's sin/cos included."""

    def f(x):
        pos = torch.arange(x.shape[1], dtype=dtype, device=x.device)
        ang = torch.outer(pos, torch.tensor([1.0, 0.01], dtype=dtype, device=x.device))
        return x * ang.cos()[None] + ang.sin()[None]

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    before = len(backend.CACHE.fallbacks)
    for n in (3, 6, 11):
        x = torch.randn(2, n, 2, dtype=dtype)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(fn(x.to(dev)).cpu(), f(x), rtol=tol, atol=tol)
    assert backend.CACHE.fallbacks[before:] == []
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    assert isinstance(recipe, SymbolicRecipe) and recipe.built == 3
    prog = recipe.template.program
    (arange,) = [s for s in prog.steps if s.kind == "const" and s.op == "Arange"]
    assert arange.attrs[2] in MARKERS and arange.attrs[3] == "i64"


def test_half_positions_from_a_symbolic_arange_run_uncompiled_with_a_reason(dev, caplog):
    """Half positions are not taken (PyTorch rounds a float32 position to the half type;
    that the integer cast does the same for every length is not shown): the graph runs as
    it is, with the reason logged."""

    def f(x):
        return x * torch.arange(x.shape[1], dtype=torch.bfloat16, device=x.device)

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    before = len(backend.CACHE.fallbacks)
    for n in (3, 7):
        x = torch.randn(2, n, dtype=torch.bfloat16)
        assert torch.equal(fn(x.to(dev)).cpu(), f(x))
    reasons = " ".join(str(r) for r in backend.CACHE.fallbacks[before:])
    assert "arange" in reasons and "size" in reasons


def test_twenty_sequence_lengths_compile_at_most_twice(dev):
    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    model.load_state_dict(ref.state_dict())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    fn = torch.compile(model.to(dev), backend="saturn")
    fallbacks = len(backend.CACHE.fallbacks)
    lengths = list(range(3, 23))
    after_second = None
    # grad enabled: under no_grad the layer takes PyTorch's fused encoder path, which dynamo
    # in torch 2.11 does not trace with dynamic shapes (it runs that frame eagerly)
    for i, n in enumerate(lengths):
        x = torch.randn(2, n, 32)
        got = fn(x.to(dev))
        torch.testing.assert_close(got.detach().cpu(), ref(x).detach(), rtol=1e-5, atol=1e-5)
        if i == 1:
            after_second = backend.CACHE.compiles
    # dynamo compiled twice (static, then symbolic; each may hand saturn a forward and a
    # backward graph), and saturn compiled nothing after the second length
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert backend.CACHE.compiles == after_second
    assert len(backend.CACHE.fallbacks) == fallbacks, backend.CACHE.fallbacks[fallbacks:]
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    recipes = [cg.recipe for cg in backend.CACHE.items.values()]
    symbolic = [
        r for r in recipes if isinstance(r, SymbolicRecipe) and r.device == torch.device(dev)
    ]
    # the forward recipe built one concrete recipe per size after the first (the backward's
    # symbolic recipe is never called here)
    assert symbolic and max(r.built for r in symbolic) == len(lengths) - 1
    del recipe


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_sizes_used_as_values_are_inputs_made_per_call(dev, dtype):
    """``x * n``, a mean written by hand, ``n - 1``: each size used as a value is an int64
    0-d input of the program, computed from the call's sizes; one compile serves them all."""

    def f(x):
        n = x.shape[1]
        return x * n, x.sum(1) * n if dtype == torch.int64 else x.sum(1) / n, x + (n - 1)

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    before, compiles = len(backend.CACHE.fallbacks), backend.CACHE.compiles
    for n in (3, 5, 9):
        x = (torch.randn(2, n) * 10).to(dtype)
        for got, want in zip(fn(x.to(dev)), f(x), strict=True):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert backend.CACHE.fallbacks[before:] == []
    assert backend.CACHE.compiles - compiles == 1
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    assert isinstance(recipe, SymbolicRecipe) and recipe.built == 3
    assert len(recipe.size_values) == 2  # n and n - 1
    assert [s.dtype for s in recipe.template.inputs[:2]] == [torch.int64, torch.int64]
    # made once per size, not per call: a repeated size reuses its tensors
    assert len(recipe.value_inputs) == 3
    last = next(reversed(recipe.value_inputs))  # the sizes of the last call (n = 9)
    made = [id(t) for t in recipe.value_inputs[last]]
    assert sorted(int(t) for t in recipe.value_inputs[last]) == [8, 9]
    fn(x.to(dev))
    assert len(recipe.value_inputs) == 3
    assert [id(t) for t in recipe.value_inputs[last]] == made


def test_a_size_passed_to_a_host_call_runs_uncompiled_with_a_reason():
    """Floor division stays PyTorch's op (a host call), whose arguments are kept as they
    are: a size among them is not taken."""

    def f(x):
        return x // x.shape[0]

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    before = len(backend.CACHE.fallbacks)
    for n in (3, 5):
        x = torch.arange(4 * n).reshape(n, 4)
        assert torch.equal(fn(x.to("saturn:0")).cpu(), f(x))
    reasons = backend.CACHE.fallbacks[before:]
    assert any("takes size" in r for r in reasons), reasons


def test_inconsistent_sizes_raise():
    def f(x, y):
        return x + y

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=True)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    fn(a.to("saturn:0"), b.to("saturn:0"))
    recipe = next(reversed(backend.CACHE.items.values())).recipe
    assert isinstance(recipe, SymbolicRecipe)
    tensors = [i for i, s in enumerate(recipe.template.inputs) if s.dtype is not None]
    args = [4] * len(recipe.template.inputs)
    for i in tensors:
        args[i] = torch.randn(4, 6).to("saturn:0")
    args[tensors[-1]] = torch.randn(4, 7).to("saturn:0")  # the other operand's size differs
    with pytest.raises(RuntimeError, match="compiled for"):
        recipe(args)


def test_backward_through_symbolic_graphs_matches_eager():
    """The backward graph of a symbolic compile takes sizes the forward returns."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model.load_state_dict(ref.state_dict())
    model = model.to("saturn:0")
    torch._dynamo.reset()
    fn = torch.compile(model, backend="saturn")
    fallbacks = len(backend.CACHE.fallbacks)
    for n in (5, 7, 9, 12):
        x = torch.randn(n, 16)
        ref.zero_grad()
        model.zero_grad()
        ref(x).square().mean().backward()
        fn(x.to("saturn:0")).square().mean().backward()
        for p, q in zip(ref.parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)
    assert len(backend.CACHE.fallbacks) == fallbacks, backend.CACHE.fallbacks[fallbacks:]
    assert any(isinstance(cg.recipe, SymbolicRecipe) for cg in backend.CACHE.items.values())
