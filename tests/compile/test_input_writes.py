"""A graph's writes to its inputs, made by the recipe (decision 0127): an
optimizer's compiled step updates the parameters and momentum buffers in place, as eager
does, with no eager copy per input on a GPU (the replayed graph writes them); a call that
fails writes nothing; inputs that are not packed, that moved, or whose new value is an
input or a view of one are still written as eager writes them."""

from __future__ import annotations

import copy

import pytest
import torch

from saturn import backend
from saturn.import_writes import split_input_writes


def _sync(dev: str) -> None:
    if dev != "saturn:0":
        torch.saturn.synchronize(dev)


def _recipes():
    return [hit.recipe for hit in backend.CACHE.items.values()]


def _fresh():
    torch._dynamo.reset()
    backend.CACHE.clear()
    backend.CACHE.fallbacks.clear()


def test_a_compiled_sgd_step_updates_parameters_and_buffers_as_eager_does(dev):
    """Three steps of SGD with momentum (the first makes the buffers, the next two update
    them in place): parameters equal eager CPU's at 1e-5, every write made by the recipe,
    none run uncompiled; on a GPU the replayed graph writes every one (no eager copy)."""
    _fresh()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    m = copy.deepcopy(ref).to(dev)
    x = torch.randn(5, 8)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, foreach=False)
    step = torch.compile(opt.step, backend="saturn", dynamic=False)
    for _ in range(4):
        for model, o, xs, st in ((ref, ropt, x, ropt.step), (m, opt, x.to(dev), step)):
            o.zero_grad()
            model(xs).square().mean().backward()
            st()
    _sync(dev)
    for p, q in zip(ref.parameters(), m.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
        buf, want = opt.state[q]["momentum_buffer"], ropt.state[p]["momentum_buffer"]
        torch.testing.assert_close(buf.cpu(), want, rtol=1e-5, atol=1e-6)
    assert backend.CACHE.fallbacks == []
    written = [r for r in _recipes() if r.writes]
    # the second step's graph writes four parameters and their four buffers
    assert max(len(r.writes) for r in written) == 8
    if dev != "saturn:0":
        r = next(r for r in written if len(r.writes) == 8)
        assert r.runner.wrote == {i for i, _ in r.writes}
        assert r.last.replayed and r.last.writes_copied == 0


def test_writes_turned_off_leave_them_to_aotautograd(dev, monkeypatch):
    """``KEEP_INPUT_WRITES = False`` (the A/B): the graph has no writes, and AOTAutograd
    copies each updated input back itself; the result is the same."""
    _fresh()
    monkeypatch.setattr(backend, "KEEP_INPUT_WRITES", False)

    def f(p, g):
        p.add_(g, alpha=-0.5)

    p, g = torch.randn(6, 3), torch.randn(6, 3)
    want = p - 0.5 * g
    pd = p.to(dev)
    torch.compile(f, backend="saturn", dynamic=False)(pd, g.to(dev))
    torch.testing.assert_close(pd.cpu(), want)
    assert all(not r.writes for r in _recipes())


def test_an_input_not_packed_is_written_where_it_lies(dev):
    """A transposed parameter: the recipe reads a packed copy, and the new values reach
    the caller's tensor (its strides kept), twice."""
    _fresh()

    def f(p, g):
        p.mul_(0.5).add_(g)

    base = torch.randn(4, 6)
    g = torch.randn(6, 4)
    want = base.t() * 0.5 + g
    want = want * 0.5 + g
    bd = base.to(dev)
    pd = bd.t()
    fn = torch.compile(f, backend="saturn", dynamic=False)
    fn(pd, g.to(dev))
    fn(pd, g.to(dev))
    torch.testing.assert_close(pd.cpu(), want)
    torch.testing.assert_close(bd.cpu(), want.t())
    assert [len(r.writes) for r in _recipes()] == [1]


def test_a_value_that_is_an_input_or_a_view_of_the_written_one(dev):
    """``p.copy_(q)`` writes an input's values; ``p.copy_(p.flip(0))`` reads the input it
    writes (the recipe reads it before overwriting it)."""
    _fresh()

    def f(p, q, r):
        p.copy_(q)
        r.copy_(r.flip(0))

    p, q, r = torch.randn(5), torch.randn(5), torch.arange(6.0)
    pd, qd, rd = p.to(dev), q.to(dev), r.to(dev)
    torch.compile(f, backend="saturn", dynamic=False)(pd, qd, rd)
    assert torch.equal(pd.cpu(), q) and torch.equal(qd.cpu(), q)
    assert torch.equal(rd.cpu(), r.flip(0))
    assert [len(r.writes) for r in _recipes()] == [2] and backend.CACHE.fallbacks == []


def test_an_input_at_a_new_address_is_written_there(dev):
    """The same compiled update on a second tensor (a new address): on a GPU the graph is
    captured again writing there (a written input is never staged), and the first tensor
    keeps its values."""
    _fresh()

    def f(p, g):
        p.sub_(g)

    fn = torch.compile(f, backend="saturn", dynamic=False)
    a, b, g = torch.randn(7), torch.randn(7), torch.randn(7)
    ad, bd, gd = a.to(dev), b.to(dev), g.to(dev)
    for _ in range(3):  # first call, capture, replay
        fn(ad, gd)
    fn(bd, gd)
    fn(bd, gd)
    torch.testing.assert_close(ad.cpu(), a - 3 * g)
    torch.testing.assert_close(bd.cpu(), b - 2 * g)
    if dev != "saturn:0":
        (r,) = _recipes()
        assert r.runner.staged == {} and r.last.writes_copied == 0


def test_a_call_that_fails_writes_nothing(dev):
    """An index out of range after the update is computed: PyTorch's exception, and the
    input keeps its values (the compiled call wrote nothing before failing, and its rerun
    uncompiled raised before writing)."""
    _fresh()

    def f(p, x, i):
        p.add_(x[i].sum(0))

    fn = torch.compile(f, backend="saturn", dynamic=False)
    p, x = torch.randn(3), torch.randn(4, 3)
    pd, xd = p.to(dev), x.to(dev)
    fn(pd, xd, torch.tensor([1]).to(dev))
    _sync(dev)
    torch.testing.assert_close(pd.cpu(), p + x[1])
    assert [len(r.writes) for r in _recipes()] == [1] and backend.CACHE.fallbacks == []
    with pytest.raises((IndexError, RuntimeError), match="out of"):
        fn(pd, xd, torch.tensor([9]).to(dev))
        _sync(dev)
    torch.testing.assert_close(pd.cpu(), p + x[1])


def _graph(body) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    p, v = g.placeholder("p"), g.placeholder("v")
    body(g, p, v)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_writes_split_off_and_declined():
    """A trailing ``copy_`` into an input becomes a return; one whose result is read, one
    into a value that is not an input, or two into one input leave the graph as it is."""
    copy_ = torch.ops.aten.copy_.default
    add = torch.ops.aten.add.Tensor

    def plain(g, p, v):
        s = g.call_function(add, (p, v))
        g.call_function(copy_, (p, s))
        g.output((v,))

    gm, writes = split_input_writes(_graph(plain))
    assert writes == (("p", 1),)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [add]
    out = gm(torch.ones(2), torch.full((2,), 2.0))
    assert torch.equal(out[1], torch.full((2,), 3.0))

    def read(g, p, v):
        c = g.call_function(copy_, (p, v))
        g.output((c,))

    def not_input(g, p, v):
        s = g.call_function(add, (p, v))
        g.call_function(copy_, (s, v))
        g.output((s,))

    def twice(g, p, v):
        g.call_function(copy_, (p, v))
        g.call_function(copy_, (p, v))
        g.output((v,))

    for body in (read, not_input, twice):
        gm = _graph(body)
        again, writes = split_input_writes(gm)
        assert again is gm and writes == ()


def test_batch_norm_statistics_of_a_training_forward_are_written(dev):
    """A training forward's buffer updates (batch norm's running statistics and its step
    count, which require no gradient) reach the graph too: after three steps they equal
    eager CPU's, written by the forward's recipe."""
    _fresh()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    m = copy.deepcopy(ref).to(dev).train()
    fn = torch.compile(m, backend="saturn", dynamic=False)
    x = torch.randn(4, 3, 8, 8)
    for _ in range(3):
        fn(x.to(dev)).sum().backward()
        ref(x).sum().backward()
    _sync(dev)
    bn, want = m[1], ref[1]
    torch.testing.assert_close(bn.running_mean.cpu(), want.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var.cpu(), want.running_var, rtol=1e-5, atol=1e-6)
    assert bn.num_batches_tracked.item() == 3
    assert [len(r.writes) for r in _recipes() if r.writes] == [3]
    assert backend.CACHE.fallbacks == []
