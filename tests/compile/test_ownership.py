"""No lost data: compiled outputs own their memory where eager's do, every write to an
input reaches the next call, Python ints take any value, and indexing out of range fails
as PyTorch fails (decisions 0049 and 0050)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from saturn import backend
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.ownership import output_ownership
from saturn.eqsat.pipeline import compile_graph

from .helpers import last_compiled

# one step of a view/copy chain: what a user writes between input and output
STEPS = {
    "clone": lambda x: x.clone(),
    "contiguous": lambda x: x.contiguous(),
    "reshape": lambda x: x.reshape(-1, x.shape[-1]),
    "t": lambda x: x.transpose(0, 1),
    "rows": lambda x: x[1:],
    "cols": lambda x: x[:, 1:],
    "permute": lambda x: x.permute(1, 0),
    "same_cast": lambda x: x.to(torch.float32),
    "cast": lambda x: x.to(torch.float64),
    "times_one": lambda x: x * 1,
}
CHAINS = (
    [(a,) for a in STEPS]
    + list(itertools.permutations(["clone", "t", "rows"], 2))
    + [
        ("t", "contiguous"),
        ("t", "clone"),
        ("rows", "clone"),
        ("cols", "contiguous"),
        ("t", "times_one", "contiguous"),
        ("permute", "reshape"),
        ("t", "reshape", "clone"),
        ("cols", "t", "contiguous"),
        ("cast", "t", "contiguous"),
        ("same_cast", "t"),
        ("t", "same_cast", "contiguous"),
    ]
)


def _chain(names):
    def f(x):
        for n in names:
            x = STEPS[n](x)
        return x

    return f


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _check_owned(got, want, x_dev, x_cpu):
    """got shares x_dev's memory exactly when want shares x_cpu's; eager's strides where
    eager is contiguous; a write to got reaches x_dev only where eager's would."""
    assert _shares(got, x_dev) == _shares(want, x_cpu), (got.stride(), want.stride())
    if want.is_contiguous():
        assert got.is_contiguous(), (got.stride(), want.stride())
        got.view(-1)  # what eager allows on a contiguous result
    torch.testing.assert_close(got.cpu(), want)
    got.mul_(100)
    want.mul_(100)  # where eager's output views x_cpu, x_cpu changes as x_dev must
    assert torch.equal(x_dev.cpu(), x_cpu)


@pytest.mark.parametrize("names", CHAINS, ids=["-".join(c) for c in CHAINS])
def test_an_output_shares_an_input_exactly_when_eager_s_does(dev, names):
    f = _chain(names)
    torch._dynamo.reset()
    g = torch.compile(f, backend="saturn", dynamic=False)
    x_cpu = torch.arange(12.0).reshape(3, 4)
    x_dev = x_cpu.to(dev)
    with torch.no_grad():
        for _ in range(3):  # the first call, and (on a GPU) the captured and replayed ones
            _check_owned(g(x_dev), f(x_cpu), x_dev, x_cpu)


@pytest.mark.parametrize("names", [("t", "contiguous"), ("rows", "clone"), ("clone",)])
def test_cpu_inputs_are_never_handed_back(names):
    f = _chain(names)
    torch._dynamo.reset()
    g = torch.compile(f, backend="saturn", options={"device": "saturn:0"}, dynamic=False)
    x = torch.arange(12.0).reshape(3, 4)
    with torch.no_grad():
        _check_owned(g(x), f(x.clone()), x, x.clone())


@pytest.mark.parametrize(
    "names",
    [("t", "times_one"), ("t", "cast"), ("permute", "times_one"), ("t", "times_one", "t")],
    ids="-".join,
)
def test_outputs_of_transposed_cpu_inputs_are_laid_out_as_eager_s(dev, names):
    """A CPU input that is a transpose is copied packed to where the program reads it, so
    the program computes in the other layout: ``x.t() * 1`` is packed in eager and a
    transposed view in the program, which a crossing back to the CPU kept (found by the
    fuzzer on the GPU). The output is handed out packed, as eager's."""
    f = _chain(names)
    torch._dynamo.reset()
    g = torch.compile(f, backend="saturn", options={"device": dev}, dynamic=False)
    x = torch.arange(12.0).reshape(4, 3).t()  # (3, 4), strides (1, 3)
    with torch.no_grad():
        for _ in range(3):
            _check_owned(g(x), f(x.clone()), x, x.clone())


def test_a_module_returning_its_weight_transposed_cannot_be_zeroed_through_it(dev):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            return self.w.t().contiguous(), x @ self.w.t()

    m = M().to(dev)
    w = m.w.detach().cpu().clone()
    torch._dynamo.reset()
    g = torch.compile(m, backend="saturn", dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            wt, _ = g(torch.randn(2, 4, device=dev))
            assert wt.is_contiguous() and not _shares(wt, m.w)
            wt.zero_()
            assert torch.equal(m.w.detach().cpu(), w)


def test_equal_values_are_still_two_outputs(dev):
    """x + 1 and (x + 1).clone() are one e-class: the program writes one buffer, and the
    second output gets memory of its own."""
    torch._dynamo.reset()
    g = torch.compile(lambda x: (x + 1, (x + 1).clone()), backend="saturn", dynamic=False)
    x = torch.ones(4, device=dev)
    with torch.no_grad():
        for _ in range(3):
            a, b = g(x)
            assert not _shares(a, b)
            a.zero_()
            assert torch.equal(b.cpu(), torch.full((4,), 2.0))
    assert last_compiled().compiled.ownership.copy == (1,)


def test_a_constant_output_is_fresh_at_every_call():
    torch._dynamo.reset()
    g = torch.compile(
        lambda x: (x * 2, torch.zeros(3, device=x.device)), backend="saturn", dynamic=False
    )
    x = torch.ones(3, device="saturn:0")
    with torch.no_grad():
        _, z = g(x)
        z.fill_(7.0)
        _, z2 = g(x)
    assert torch.equal(z2.cpu(), torch.zeros(3))


def test_ownership_from_text_graphs_and_its_declines():
    """The analysis itself, torch-free: a view of an input that eager copies is copied; a
    view that eager also returns, a kernel's own buffer and a graph that returns one node
    twice are not."""
    text = """
    (input x f32 [3 4])
    (let a (Cast (Permute x [1 0]) f32))
    (let b (Permute x [1 0]))
    (let c (Add x (Scalar 1.0 f32)))
    (let d (Cast c f32))
    (output a b c d c)
    """
    compiled = compile_graph(parse_graph(text))
    own = compiled.ownership
    assert own.copy == (0, 3), own
    assert "view of input x" in own.why[0]
    assert own == output_ownership(compiled.graph, compiled.program)


# --- input freshness -------------------------------------------------------------------


def _writers(on_cpu: bool):
    out = {
        "in_place": lambda x: x.add_(4.0),
        "data": lambda x: x.data.add_(4.0),
        "detach": lambda x: x.detach().add_(4.0),
    }
    if on_cpu:
        out["numpy"] = lambda x: np.add(x.numpy(), 4.0, out=x.numpy())
        out["dlpack"] = lambda x: torch.from_dlpack(x).add_(4.0)
    return out


@pytest.mark.parametrize("where", ["cpu", "saturn"])
@pytest.mark.parametrize("layout", ["packed", "transposed"])
def test_every_write_to_an_input_reaches_the_next_call(dev, where, layout):
    torch._dynamo.reset()
    f = lambda x: x * 2 + 1  # noqa: E731
    g = torch.compile(f, backend="saturn", options={"device": dev}, dynamic=False)
    base = torch.ones(4, 3) if layout == "packed" else torch.ones(3, 4).t()
    x = base if where == "cpu" else base.to(dev) if layout == "packed" else base.t().to(dev).t()
    with torch.no_grad():
        g(x)
        for name, write in _writers(x.device.type == "cpu").items():
            write(x)
            torch.testing.assert_close(g(x).cpu(), f(x.cpu()), msg=name)


def test_a_host_op_s_operand_sees_writes_too():
    """cumsum stays PyTorch's op on saturn:0: its operand is copied at every call."""
    torch._dynamo.reset()
    f = lambda x: torch.cumsum(x * 2, 0)  # noqa: E731
    g = torch.compile(f, backend="saturn", options={"device": "saturn:0"}, dynamic=False)
    x = torch.ones(5)
    with torch.no_grad():
        g(x)
        x.data.fill_(3.0)
        torch.testing.assert_close(g(x), f(x))
        x.numpy()[:] = 5.0
        torch.testing.assert_close(g(x), f(x))


def test_a_write_through_data_of_a_strided_saturn_view():
    torch._dynamo.reset()
    f = lambda x: x * 3  # noqa: E731
    g = torch.compile(f, backend="saturn", options={"device": "saturn:0"}, dynamic=False)
    base = torch.zeros(4, 6, device="saturn:0")
    view = base[:, ::2]
    with torch.no_grad():
        g(view)
        base.data[:, ::2] = 2.0
        torch.testing.assert_close(g(view).cpu(), torch.full((4, 3), 6.0))


# --- Python ints ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [(3, 4, 1, 0, -1, 2**40), (1, 0, 2, -7, 5), (-2, 3, 1)], ids=["a", "b", "c"]
)
def test_a_python_int_of_any_value_changing_between_calls(dev, values):
    torch._dynamo.reset()
    f = lambda x, k: x * k + k  # noqa: E731
    g = torch.compile(f, backend="saturn", options={"device": dev})
    x = torch.arange(6.0)
    for k in values:
        torch.testing.assert_close(g(x.to(dev), k).cpu(), f(x, k))


def test_closure_ints_of_any_value(dev):
    x = torch.arange(6.0)
    torch._dynamo.reset()

    def make(k):
        def f(x):
            return x - k

        return f

    for k in (3, 4, 1, 0, -1, 9):
        g = torch.compile(make(k), backend="saturn", options={"device": dev})
        torch.testing.assert_close(g(x.to(dev)).cpu(), x - k)
    state = [3]

    def h(x):
        return x * state[0]

    gh = torch.compile(h, backend="saturn", options={"device": dev})
    for k in (3, 4, 1, 0, -1):
        state[0] = k
        torch.testing.assert_close(gh(x.to(dev)).cpu(), x * k)


def test_an_int_used_as_an_extent_below_two_runs_that_call_uncompiled():
    torch._dynamo.reset()
    f = lambda x, k: torch.ones(k, device=x.device) * x.sum()  # noqa: E731
    g = torch.compile(f, backend="saturn", options={"device": "saturn:0"})
    x = torch.arange(4.0, device="saturn:0")
    for k in (3, 4, 1, 0, 5):
        torch.testing.assert_close(g(x, k).cpu(), f(x.cpu(), k))


def test_symbolic_sums_and_quotients_are_refused_at_import_not_at_the_call():
    """A size s + 1 or s // 2 would keep a marker-sized extent: the graph runs uncompiled
    with that reason instead of failing at the call."""
    torch._dynamo.reset()
    before = len(backend.CACHE.fallbacks)
    f = lambda x: torch.cat([x, x[:1]]) * 2  # noqa: E731
    g = torch.compile(f, backend="saturn", options={"device": "saturn:0"}, dynamic=True)
    for n in (5, 7):
        x = torch.arange(float(n))
        torch.testing.assert_close(g(x), f(x))
    assert any("not a product of symbols" in r for r in backend.CACHE.fallbacks[before:])


# --- indices -------------------------------------------------------------------------

INDEXING = {
    "index": lambda x, i: x[i] * 1,
    "index_select": lambda x, i: torch.index_select(x, 0, i) * 1,
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x) * 1,
    "gather": lambda x, i: torch.gather(x, 0, i[:, None].expand(3, 2)) * 1,
    "scatter_add": lambda x, i: (
        torch.scatter_add(x, 0, i[:, None].expand(3, 2), torch.ones(3, 2, device=x.device)) * 1
    ),
    "scatter": lambda x, i: torch.scatter(x, 0, i[:, None].expand(3, 2), 7.0) * 1,
    "index_add": lambda x, i: x.index_add(0, i, torch.ones(3, 2, device=x.device)) * 1,
    "index_put_acc": lambda x, i: (
        x.index_put((i,), torch.ones(3, 2, device=x.device), accumulate=True) * 1
    ),
    "index_put": lambda x, i: x.index_put((i,), torch.ones(3, 2, device=x.device)) * 1,
    "index_copy": lambda x, i: x.index_copy(0, i, torch.ones(3, 2, device=x.device)) * 1,
    "take_along_dim": lambda x, i: torch.take_along_dim(x, i[:, None].expand(3, 2), 0) * 1,
    "take": lambda x, i: torch.take(x, i) * 1,
}
INDICES = [[-1, 0, 2], [4, 3, 1], [5, 0, 1], [-6, 0, 1], [10, 0, -11]]


def _outcome(f, *args):
    try:
        return "ok", f(*args).cpu()
    except Exception as e:  # the exception type and PyTorch's message
        return type(e).__name__, str(e).split("\n")[0]


@pytest.mark.parametrize("op", sorted(INDEXING))
def test_negative_and_out_of_range_indices_behave_as_eager(dev, op):
    f = INDEXING[op]
    x = torch.arange(10.0).reshape(5, 2)
    failed = len(backend.CACHE.failed_calls)
    for ids in INDICES:
        i = torch.tensor(ids)
        want = _outcome(f, x, i)
        torch._dynamo.reset()
        got = _outcome(torch.compile(f, backend="saturn", dynamic=False), x.to(dev), i.to(dev))
        if want[0] == "ok":
            assert got[0] == "ok", (ids, got)
            assert torch.equal(got[1], want[1]), ids
        else:
            assert got == want, ids  # the type, and the message with the user's index
    # saturn never raised where PyTorch did not (that would be logged as a failed call)
    assert backend.CACHE.failed_calls[failed:] == []


def test_an_index_error_is_pytorch_s_own_and_the_device_ran_the_take():
    """The take runs as saturn's (on saturn:0 its host runner): the bad index is found
    there, and the rerun uncompiled raises PyTorch's IndexError with the user's index."""
    torch._dynamo.reset()
    g = torch.compile(lambda x, i: x[i] * 2, backend="saturn", dynamic=False)
    x, good = torch.randn(5, 2, device="saturn:0"), torch.tensor([-1, 4], device="saturn:0")
    torch.testing.assert_close(g(x, good).cpu(), x.cpu()[[-1, 4]] * 2)
    recipe = last_compiled().recipe
    assert any(s.kind == "kernel" and s.kernel.kind == "gather" for s in recipe.program.steps)
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        g(x, torch.tensor([7, 0], device="saturn:0"))
    assert recipe.failed_calls == 1


# --- float to int -----------------------------------------------------------------------

OUT_OF_RANGE = [
    float("inf"),
    float("-inf"),
    float("nan"),
    1e30,
    -1e30,
    3e9,
    -3e9,
    2.0**31,
    -(2.0**31) - 200,
    2.0**63,
    300.7,
    -129.5,
    65536.5,
    40000.0,
    -40000.0,
    2.5,
    -2.5,
]


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    "dst", [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool]
)
def test_fused_float_to_int_casts_of_values_that_do_not_fit_as_eager_cpu(src, dst):
    """saturn:0 converts as PyTorch's CPU kernels do (x86: the integer indefinite, narrow
    types through int32), written out so that no optimiser can pick another result."""
    f = lambda x: (x * 1).to(dst) + 0 if dst != torch.bool else (x * 1).to(dst)  # noqa: E731
    x = torch.tensor(OUT_OF_RANGE).to(src)
    torch._dynamo.reset()
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to("saturn:0"))
    assert torch.equal(got.cpu(), f(x))
    if src != torch.bfloat16 and dst in (torch.int32, torch.int64, torch.bool):
        kernels = last_compiled().compiled.program.kernels
        assert len(kernels) == 1 and kernels[0].kind == "loop"  # fused, not PyTorch's cast


def test_the_cast_helpers_truth_tables():
    """Both platforms' conversions, run as plain Python (the CUDA simulator's way): x86's
    integer indefinite, CUDA's saturation with NaN to 0, the narrow types through int32."""
    from saturn.codegen.expr import cast_helpers

    tables = {}
    for semantics in ("x86", "cuda"):
        scope = {"np": np}
        exec(cast_helpers("", semantics), scope)
        tables[semantics] = scope
    x86, cuda = tables["x86"], tables["cuda"]
    for v, want in [(np.inf, -(2**31)), (np.nan, -(2**31)), (3e9, -(2**31)), (-2.5, -2)]:
        assert x86["to_i32_f64"](np.float64(v)) == want, v
    for v, want in [(np.inf, 2**31 - 1), (np.nan, 0), (-3e9, -(2**31)), (2.5, 2)]:
        assert cuda["to_i32_f32"](np.float32(v)) == want, v
    assert x86["to_i64_f32"](np.float32(2.0**63)) == -(2**63)
    assert cuda["to_i64_f64"](np.float64(2.0**63)) == 2**63 - 1
    assert cuda["to_i64_f32"](np.float32(np.nan)) == -(2**63)
    assert cuda["to_i32_f64"](np.float64(np.nan)) == -(2**31)
    assert x86["to_i8_f32"](np.float32(300.7)) == 44 and x86["to_u8_f64"](-40000.0) == 192
    assert x86["to_i32_f64"](np.float64(-2147483648.9)) == -(2**31)  # truncates, fits


@pytest.mark.gpu
@pytest.mark.parametrize("src", [torch.float32, torch.float64])
@pytest.mark.parametrize("dst", [torch.int32, torch.int64, torch.bool])
def test_fused_float_to_int_casts_of_values_that_do_not_fit_as_eager_cuda(src, dst):
    """saturn:1 converts as PyTorch's CUDA kernels do (saturation, NaN to 0), compared
    with eager CUDA in this process (no autograd is involved)."""
    f = lambda x: (x * 1).to(dst)  # noqa: E731
    x = torch.tensor(OUT_OF_RANGE).to(src)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="saturn", dynamic=False)(x.to("saturn:1"))
        want = f(x.to("cuda")).cpu()
    assert last_compiled().compiled.program.kernels[0].kind == "loop"
    assert torch.equal(got.cpu(), want), (got.cpu().tolist(), want.tolist())
