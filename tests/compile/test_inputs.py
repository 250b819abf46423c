"""Inputs that break backends: mixed dtypes, integer reductions, NaN/inf/-0.0, a transposed
input where a packed one was compiled, a view as an output, a constant first operand."""

from __future__ import annotations

import copy

import torch

from saturn import backend

from .helpers import DEV, compile_and_compare, last_compiled


def test_mixed_dtypes_in_one_expression():
    a = torch.randint(-5, 5, (4, 7), dtype=torch.int32)
    b = torch.randn(4, 7, dtype=torch.float32)
    c = torch.randn(7, dtype=torch.float64)
    compile_and_compare(lambda a, b, c: (a * b + c).relu(), a, b, c)
    ops = last_compiled().imported.graph.nodes.values()
    assert any(n.op == "Cast" for n in ops), "promotion is explicit in the imported graph"


def test_integer_reductions_widen():
    x = torch.randint(-100, 100, (5, 9), dtype=torch.int32)
    out = compile_and_compare(lambda x: (x.sum(1), x.amax(0), x.sum()), x)
    assert out[0].dtype == torch.int64 and out[2].dtype == torch.int64


def test_a_mean_over_every_axis_is_a_device_reduction():
    """``x.mean()`` (aten.mean.default, a loss's last op) reduces every axis on the
    device, as ``x.sum()`` does; NaN propagates."""
    x = torch.randn(4, 6, 5)
    out = compile_and_compare(lambda x: (x * 2).mean(), x)
    assert out.shape == () and out.dtype == torch.float32
    prog = last_compiled().compiled.program
    assert prog.count("host") == 0, prog.to_text()
    x[1, 2, 3] = float("nan")
    assert torch.isnan(compile_and_compare(lambda x: x.mean() + 1, x).cpu())


def test_a_mean_in_another_dtype_stays_pytorchs_op():
    """``mean(dtype=...)`` accumulates in the dtype asked for: the handler declines it."""
    x = torch.randn(4, 6)
    compile_and_compare(lambda x: x.mean(dtype=torch.float64) + 1, x)
    prog = last_compiled().compiled.program
    assert [s.op.split("#")[0] for s in prog.steps if s.kind == "host"] == ["aten.mean.default"], (
        prog.to_text()
    )


def test_nan_inf_and_negative_zero():
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.5, -2.0]])
    y = torch.tensor([[1.0, -1.0, 2.0, 0.0, -0.0, float("nan"), 3.0]])
    out = compile_and_compare(
        lambda x, y: (torch.maximum(x, y), torch.relu(x) * y, x + y, (x * y).amax(1)), x, y
    )
    # -0.0 survives relu as in eager
    assert torch.signbit(out[1].cpu()).tolist() == torch.signbit(torch.relu(x) * y).tolist()


def test_transposed_input_where_packed_was_compiled():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.exp(x) * 2 - 1, backend="saturn", dynamic=False)
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    with torch.no_grad():
        # an absolute tolerance too: exp(x) * 2 - 1 cancels near x = -ln 2, where one
        # rounding of exp is a large relative error (an unseeded run once drew x = -0.6877)
        got = fn(x.to(DEV))
        torch.testing.assert_close(got.cpu(), torch.exp(x) * 2 - 1, rtol=1e-5, atol=1e-6)
        xt = torch.randn(4, 6).t()  # same shape, transposed strides
        got = fn(xt.to(DEV))
    torch.testing.assert_close(got.cpu(), torch.exp(xt) * 2 - 1, rtol=1e-5, atol=1e-6)


def test_view_as_output():
    x = torch.randn(4, 6)
    out = compile_and_compare(lambda x: ((x + 1).view(24), (x * 2).t()), x)
    assert out[0].shape == (24,) and out[1].shape == (6, 4)


def test_constant_first_operand():
    x = torch.randn(10)
    compile_and_compare(lambda x: 1 - x, x)
    body = str(last_compiled().compiled.program.kernels[0].body)
    assert body.startswith("('sub', ('const'"), body


def test_cpu_inputs_compile_too():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.tanh(x) + x, backend="saturn", dynamic=False)
    x = torch.randn(5)
    with torch.no_grad():
        got = fn(x)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, torch.tanh(x) + x, rtol=1e-5, atol=1e-6)
    assert last_compiled().compiled.program.count("crossing") >= 2  # in and out of saturn:0


def test_cpu_inputs_are_copied_at_every_call_and_see_every_write():
    """No input copy is reused (decision 0049): writes that bump no version counter
    (``.data``, numpy) reach the next call."""
    torch._dynamo.reset()
    w = torch.randn(8, 8)
    fn = torch.compile(lambda x, w: torch.relu(x @ w + 1.0), backend="saturn", dynamic=False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        fn(x, w)
        recipe = last_compiled().recipe
        w.data.add_(1.0)
        got = fn(x, w)
        torch.testing.assert_close(got, torch.relu(x @ w + 1.0), rtol=1e-5, atol=1e-5)
        assert recipe.last.crossings >= 3  # x and w in, the result out
        w.numpy()[:] = 0.5
        got = fn(x, w)
        torch.testing.assert_close(got, torch.relu(x @ w + 1.0), rtol=1e-5, atol=1e-5)


def test_alias_full_and_scalar_tensor_are_imported_not_opaque():
    """Ops AOTAutograd emits in backward graphs: alias is its input, full and scalar_tensor
    are broadcast scalars, so none becomes a host call."""
    from saturn import backend

    def f(x):
        a = torch.ops.aten.alias.default(x)
        z = torch.ops.aten.full.default([4, 6], 0.5, device=x.device)
        s = torch.ops.aten.scalar_tensor.default(2.0, device=x.device)
        return a * z + s

    x = torch.randn(4, 6)
    torch._dynamo.reset()
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to("saturn:0"))
    torch.testing.assert_close(got.cpu(), f(x), rtol=1e-6, atol=1e-6)
    prog = next(reversed(backend.CACHE.items.values())).compiled.program
    assert prog.count("host") == 0, prog.to_text()


def _counting_copies(monkeypatch) -> list:
    """The shapes of the inputs copied from now on: packed by ``Recipe._copy`` (a call's
    strided inputs) or given a region of their own by ``Window.packed``."""
    from saturn.input_windows import Window
    from saturn.recipe import Recipe

    copies, real, real_packed = [], Recipe._copy, Window.packed

    def spy(t, want, stats):
        copies.append(tuple(t.shape))
        return real(t, want, stats)

    def spy_packed(w, t, device):
        copies.append(tuple(t.shape))
        return real_packed(w, t, device)

    monkeypatch.setattr(Recipe, "_copy", staticmethod(spy))
    monkeypatch.setattr(Window, "packed", spy_packed)
    return copies


def test_a_transposed_input_is_read_through_its_permutation(monkeypatch):
    """Decision 0130: an input traced as a permutation of a packed tensor (a saved
    transposed weight) is declared packed and permuted back in the graph, and read in
    place at every call; a packed tensor of the same shape handed to that recipe later
    is copied into the packed order, and still gives eager's result."""
    copies = _counting_copies(monkeypatch)
    x, w = torch.randn(3, 6), torch.randn(5, 6)
    compile_and_compare(lambda x, wt: (x @ wt, wt.t() * 2), x, w.t())
    cg = last_compiled()
    window = cg.recipe.inputs[1].window
    assert cg.recipe.inputs[0].window is None
    assert (window.region, window.gaps, window.order) == ((5, 6), (), (1, 0))
    assert copies == []
    ops = cg.imported.graph.nodes.values()
    assert [n.shape for n in ops if n.op == "Input"] == [(3, 6), (5, 6)]
    with torch.no_grad():
        got = cg.recipe([x.to(DEV), w.t().contiguous().to(DEV)])
    assert copies == [(6, 5)]  # laid out otherwise: copied into a region of its own
    torch.testing.assert_close(got[0].cpu(), x @ w.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1].cpu(), w * 2)


def test_a_slice_is_read_in_its_region_or_copied_where_the_region_leaves_storage(monkeypatch):
    """A slice of a larger tensor (attention's k out of a fused projection, strides
    (15, 1) at offset 5) is read as a window of its region [4, 3, 5] with a gap axis at
    index 1; a tensor of the same layout whose storage ends before the region would
    gets a packed region of its own instead, with the same result."""
    copies = _counting_copies(monkeypatch)
    base = torch.randn(4, 3, 5)
    torch._dynamo.reset()
    fn = torch.compile(lambda k: k * 2 + 1, backend="saturn", dynamic=False)
    with torch.no_grad():
        k = base.to(DEV)[:, 1]  # moved first: a slice moves as a packed copy
        fn(k)
        got = fn(k)
    torch.testing.assert_close(got.cpu(), base[:, 1] * 2 + 1)
    cg = last_compiled()
    window = cg.recipe.inputs[0].window
    assert (window.region, window.gaps, window.rel) == ((4, 3, 5), ((1, 1),), 5)
    assert copies == []
    want = torch.randn(4, 5)
    short = torch.empty_strided((4, 5), (15, 1), device=DEV).copy_(want)  # storage: 50
    assert short.stride() == window.strides and not window.fits(short)
    with torch.no_grad():
        got = cg.recipe([short])
    assert copies == [(4, 5)]
    torch.testing.assert_close(got[0].cpu(), want * 2 + 1)


def test_a_window_fits_whatever_its_unit_axes_strides(monkeypatch):
    """A transposed weight traced with a unit axis (strides (1, 1, 3) for [3, 1, 4]) is
    read in place when a call's tensor gives that axis another stride (PyTorch's views
    do): only the axes of more than one element are compared; another stride on a real
    axis is copied into a region of its own, with the same result."""
    copies = _counting_copies(monkeypatch)
    w = torch.randn(4, 1, 3)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: t * 3, backend="saturn", dynamic=False)
    traced = w.to(DEV).permute(2, 1, 0)  # [3, 1, 4], strides (1, 3, 3)
    with torch.no_grad():
        fn(traced)
    window = last_compiled().recipe.inputs[0].window
    assert window is not None and copies == []
    other = torch.as_strided(w.to(DEV), (3, 1, 4), (1, 7, 3))  # the unit axis: stride 7
    assert other.stride() != window.strides and window.fits(other)
    with torch.no_grad():
        got = last_compiled().recipe([other])
    assert copies == []
    torch.testing.assert_close(got[0].cpu(), w.permute(2, 1, 0) * 3)
    wide = torch.randn(4, 1, 6, device=DEV)[:, :, ::2].permute(2, 1, 0)  # (2, ., 6)
    assert not window.fits(wide)
    with torch.no_grad():
        got = last_compiled().recipe([wide])
    assert copies == [(3, 1, 4)]
    torch.testing.assert_close(got[0].cpu(), wide.cpu() * 3)


def test_windows_declined(monkeypatch):
    """What ``window_of`` declines: a packed tensor, an expanded one (stride 0 over more
    than one element), a region that would leave the storage, and an input the graph
    writes (its writes go through the packed path, decision 0127)."""
    from saturn.input_windows import window_of

    x = torch.randn(4, 6)
    assert window_of(x) is None and window_of(torch.randn(4, 1).expand(4, 6)) is None
    assert window_of(torch.randn(9)[::2]) is None  # the region [5, 2] needs 10 elements
    assert window_of(torch.randn(10)[1::2]).region == (5, 2)
    assert window_of(torch.randn(2, 3, 4).permute(2, 0, 1)).order == (2, 0, 1)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: t.mul_(2).sum(), backend="saturn", dynamic=False)
    xt = torch.randn(6, 4).t()
    want = (xt * 2).sum()
    dev = xt.to(DEV)
    assert not dev.is_contiguous()
    with torch.no_grad():
        got = fn(dev)
    assert [s.window for s in last_compiled().recipe.inputs] == [None]
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(dev.cpu(), xt * 2)


def test_a_training_step_copies_no_saved_transposed_weight(monkeypatch):
    """The backward graph of linear layers takes each transposed weight the forward saved:
    read in place, no packed copy at any call after the first (decision 0130)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    ref = copy.deepcopy(model)
    dev = model.to(DEV)
    x = torch.randn(5, 6)
    torch._dynamo.reset()
    step = torch.compile(lambda x: dev(x).square().sum(), backend="saturn", dynamic=False)
    step(x.to(DEV)).backward()
    dev.zero_grad()
    copies = _counting_copies(monkeypatch)
    step(x.to(DEV)).backward()
    assert copies == []
    ref(x).square().sum().backward()
    for p, q in zip(dev.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    windows = [s.window for cg in backend.CACHE.items.values() for s in cg.recipe.inputs]
    assert any(w is not None and w.order == (1, 0) for w in windows)


class _Heads(torch.nn.Module):
    """A fused projection split into heads, attention written out, an output projection
    and a head on the first token (a class token): the backward takes the transposed
    weights and the first token's row, windows of the forward's values."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.softmax(q @ k.transpose(-2, -1) * 0.35, -1) @ v
        h = self.proj(a.transpose(1, 2).reshape(b, s, 16)).relu()
        return self.head(h[:, 0])


def test_a_training_step_reads_its_saved_windows_in_place(dev, monkeypatch):
    """Decision 0130 on both devices: after the first steps, no saved tensor is copied
    at a call (neither packed by the recipe nor given a region of its own), the gradients
    are eager's, and on a GPU every graph's calls take the one-pass replay."""
    torch.manual_seed(0)
    model = _Heads()
    ref = copy.deepcopy(model)
    x = torch.randn(3, 5, 16)
    model.to(dev)
    xd = x.to(dev)
    torch._dynamo.reset()
    backend.CACHE.clear()
    step = torch.compile(lambda x: model(x).square().sum(), backend="saturn", dynamic=False)
    for _ in range(3):
        model.zero_grad()
        step(xd).backward()
    runners = [cg.recipe.runner for cg in backend.CACHE.items.values() if cg.recipe.runner]
    fast = [r.fast_replays for r in runners]
    copies = _counting_copies(monkeypatch)
    for _ in range(2):
        model.zero_grad()
        step(xd).backward()
    assert copies == []
    assert [r.fast_replays for r in runners] == [n + 2 for n in fast]
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4)
    windows = [s.window for cg in backend.CACHE.items.values() for s in cg.recipe.inputs]
    assert any(w is not None and w.gaps for w in windows)
