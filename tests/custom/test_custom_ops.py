"""saturn.custom_op: definition checks, the three shipped examples (a Numba kernel, an
expression, a kernel replacing softmax) against their references on saturn:0 and (gpu)
saturn:1 with per-op fallback counts, fusion of the expression, the RMSNorm pattern finding
a block written in plain PyTorch, a registered autograd formula in training."""

from __future__ import annotations

import numba
import pytest
import torch
from numba import cuda

import saturn
import saturn.library as lib
from saturn import backend
from saturn.custom_ops import CustomOpError, custom_op, fallback_counts


def last_program():
    return next(reversed(backend.CACHE.items.values())).compiled.program


def counts_delta(before: dict) -> dict:
    after = fallback_counts()
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


# --- definition checks ----------------------------------------------------------------


def _ref(x):
    return x


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"name": "noname", "schema": "(Tensor x) -> Tensor"}, "namespace::op"),
        ({"schema": "(Tensor x -> Tensor"}, "does not parse"),
        ({"schema": "(Tensor y) -> Tensor"}, "the reference takes ['x']"),
        ({"schema": "(Tensor x) -> Tensor", "expression": None}, "exactly one of"),
        ({"schema": "(Tensor x) -> Tensor", "host": _ref}, "exactly one of"),
        ({"schema": "(Tensor x) -> Tensor", "expression": "(Mul x (Scalar 2.0))"}, "expression"),
        ({"schema": "(Tensor x) -> Tensor", "expression": "(Frob x)"}, "expression"),
        ({"schema": "(Tensor(a!) x) -> Tensor"}, "mutates_args [] but the schema writes ['x']"),
        ({"schema": "(Tensor x) -> (Tensor, Tensor)"}, "exactly one tensor"),
    ],
)
def test_bad_definitions_raise_naming_the_op(kwargs, message):
    args = {"name": "saturn_test::bad", "reference": _ref, "expression": "(Neg x)", **kwargs}
    name, schema = args.pop("name"), args.pop("schema")
    with pytest.raises(CustomOpError, match=r"custom op " + name.replace(":", r"\:") + ".*"):
        try:
            custom_op(name, schema, **args)
        except CustomOpError as e:
            assert message in str(e), str(e)
            raise


def _host_copy(out, x, y):
    out.copy_(x + y)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"host": _host_copy, "packed": ("z",)}, "not tensor arguments"),
        ({"host": _host_copy, "packed": ("alpha",)}, "not tensor arguments"),
        ({"expression": "(Add x y)", "packed": ("x",)}, "packed is for host functions"),
    ],
)
def test_packed_names_tensor_arguments_of_a_host_function(kwargs, message):
    with pytest.raises(CustomOpError, match=message):
        custom_op(
            "saturn_test::badpack",
            "(Tensor x, Tensor y, float alpha) -> Tensor",
            reference=lambda x, y, alpha: x + y,
            **kwargs,
        )


def test_a_written_argument_is_not_handed_over_packed():
    with pytest.raises(CustomOpError, match="cannot be handed over as a packed copy"):
        custom_op(
            "saturn_test::badpackw",
            "(Tensor(a!) x, Tensor y) -> Tensor",
            reference=lambda x, y: x + y,
            host=_host_copy,
            mutates_args=("x",),
            packed=("x",),
        )


def test_kernel_needs_a_launch_function():
    with pytest.raises(CustomOpError, match="launch function"):
        custom_op("saturn_test::nolaunch", "(Tensor x) -> Tensor", reference=_ref, kernel=object())


# --- the shipped examples, eagerly ----------------------------------------------------


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randn(6, 300, dtype=dtype), torch.randn(300, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_examples_match_their_references(dev, dtype):
    x, w = _inputs(dtype)
    xs, ws = x.to(dev), w.to(dev)
    gpu = dev != "saturn:0"
    cases = [
        ("saturn::rmsnorm", lambda: lib.rmsnorm(xs, ws, 1e-6), lib._rmsnorm_reference(x, w, 1e-6)),
        ("saturn::gelu_fast", lambda: lib.gelu_fast(xs), lib._gelu_reference(x)),
        ("saturn::softmax", lambda: torch.softmax(xs, -1), torch.softmax(x, -1)),
    ]
    for name, run, want in cases:
        before = fallback_counts()
        fb = saturn.fallback_counts()
        got = run()
        assert got.device == torch.device(dev)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        op = saturn.custom_ops.REGISTRY[name]
        # the kernel runs for its dtypes on a GPU; an expression runs wherever saturn does
        ran_kernel = op.kind == "expression" or (gpu and dtype in op.dtypes)
        assert counts_delta(before) == ({} if ran_kernel else {name: 1}), name
        assert saturn.fallback_counts() == fb  # never saturn's generic CPU fallback


# --- compiled ---------------------------------------------------------------------------


def test_expression_fuses_with_its_neighbours_without_a_graph_break(dev):
    x, _ = _inputs()

    def f(x):
        return lib.gelu_fast(x * 2.0) + 1.0

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(x.to(dev)).graph_break_count == 0
    torch._dynamo.reset()
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to(dev))
    torch.testing.assert_close(got.cpu(), f(x), rtol=1e-5, atol=1e-6)
    kernels = last_program().kernels
    assert [k.kind for k in kernels] == ["loop"], kernels


def test_kernel_op_is_one_device_kernel_in_a_compiled_graph(dev):
    x, w = _inputs()

    def f(x, w):
        return lib.rmsnorm(x, w, 1e-5) * 3.0

    want = f(x, w)  # on CPU tensors: the reference (counted)
    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=False)
    before = fallback_counts()
    got = fn(x.to(dev), w.to(dev))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    prog = last_program()
    assert [k.kind for k in prog.kernels] == ["custom", "loop"]
    assert prog.count("host") == 0 and prog.count("crossing") == 0
    # saturn:0 has no kernel: its reference ran (counted); the GPU ran the Numba kernel
    assert counts_delta(before) == ({} if dev != "saturn:0" else {"saturn::rmsnorm": 1})


class Block(torch.nn.Module):
    """RMSNorm + Linear + tanh-GELU written in plain PyTorch."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.lin = torch.nn.Linear(d, 2 * d)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return torch.nn.functional.gelu(self.lin(h), approximate="tanh")


def test_rmsnorm_pattern_gives_no_more_kernels_and_the_same_results(dev):
    torch.manual_seed(0)
    model = Block(64).eval()
    x = torch.randn(4, 16, 64)
    with torch.no_grad():
        want = model(x)
        kinds = {}
        for rewrites in ([], ["rmsnorm"]):
            torch._dynamo.reset()
            m = Block(64)
            m.load_state_dict(model.state_dict())
            m = torch.compile(
                m.to(dev), backend="saturn", options={"rewrites": rewrites}, dynamic=False
            )
            got = m(x.to(dev))
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
            kinds[tuple(rewrites)] = [k.kind for k in last_program().kernels]
    assert "custom" in kinds[("rmsnorm",)] and "custom" not in kinds[()]
    if "rows" in kinds[()]:  # GPU: the written-out form is one rows kernel too (fuse_rows)
        assert len(kinds[("rmsnorm",)]) == len(kinds[()]), kinds
    else:
        assert len(kinds[("rmsnorm",)]) < len(kinds[()]), kinds


def test_pattern_declines_when_a_value_inside_it_escapes():
    """A training forward returns the normalisation's intermediates for the backward: the
    pattern must not drop them, and since the program computes them anyway it declines
    (the kernel would recompute them) and the computation stays written out."""
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    w = torch.rand(64) + 0.5

    def f(x, w):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r * w, r

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", options={"rewrites": ["rmsnorm"]}, dynamic=False)
    y, r = fn(x.to("saturn:0"), w.to("saturn:0"))
    wy, wr = f(x, w)
    torch.testing.assert_close(y.cpu(), wy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.cpu(), wr, rtol=1e-5, atol=1e-6)
    prog = last_program()
    assert len(prog.outputs) == 2 and prog.count("host") == 0
    assert "custom" not in [k.kind for k in prog.kernels]


def test_training_with_the_pattern_matches_eager():
    torch.manual_seed(0)
    ref = Block(32)
    got = Block(32)
    got.load_state_dict(ref.state_dict())
    got = got.to("saturn:0")
    torch._dynamo.reset()
    fn = torch.compile(got, backend="saturn", options={"rewrites": ["rmsnorm"]}, dynamic=False)
    compiles = backend.CACHE.compiles
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-3, foreach=False)
    opt_g = torch.optim.AdamW(got.parameters(), lr=1e-3, foreach=False)
    for i in range(20):
        torch.manual_seed(100 + i)
        x, y = torch.randn(8, 32), torch.randn(8, 64)
        for m, o, xx, yy in ((ref, opt_r, x, y), (fn, opt_g, x.to("saturn:0"), y.to("saturn:0"))):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(xx), yy).backward()
            o.step()
    for p, q in zip(ref.parameters(), got.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    # the forward returns the normalisation's intermediates for the backward: it declines
    graphs = list(backend.CACHE.items.values())[-(backend.CACHE.compiles - compiles) :]
    assert len(graphs) == 2
    assert all(k.kind != "custom" for g in graphs for k in g.compiled.program.kernels)


def test_registered_autograd_formula_is_used_by_training_graphs():
    calls = []

    def backward(ctx, grad):
        calls.append(1)
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    if "saturn_test::cube" not in saturn.custom_ops.REGISTRY:
        custom_op(
            "saturn_test::cube",
            "(Tensor x) -> Tensor",
            reference=lambda x: x * x * x,
            dtypes=(torch.float32,),
            expression="(Mul x (Mul x x))",
            backward=backward,
            setup_context=setup_context,
        )
    cube = saturn.custom_ops.REGISTRY["saturn_test::cube"]
    x = torch.randn(5, 7)
    xs = x.to("saturn:0").requires_grad_(True)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: cube(t).sum(), backend="saturn", dynamic=False)
    fn(xs).backward()
    torch.testing.assert_close(xs.grad.cpu(), 3 * x * x, rtol=1e-5, atol=1e-6)


def test_replacing_a_composite_op_is_refused_with_the_op_to_replace():
    with pytest.raises(CustomOpError, match=r"aten::softmax.int is CompositeImplicitAutograd"):
        try:
            custom_op(
                "saturn_test::sm",
                "(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
                reference=lambda self, dim, dtype: torch.softmax(self, dim),
                kernel=object(),
                launch=lambda *a: None,
                replaces="aten::softmax.int",
            )
        except CustomOpError as e:
            assert "aten::_softmax" in str(e), str(e)  # the op it decomposes into
            raise


def test_replacement_needs_the_replaced_op_arguments():
    with pytest.raises(CustomOpError, match="whose arguments are"):
        custom_op(
            "saturn_test::sm2",
            "(Tensor self) -> Tensor",
            reference=lambda self: self,
            kernel=object(),
            launch=lambda *a: None,
            replaces="aten::_softmax",
        )


def test_softmax_replacement_in_eager_and_compiled_graphs(dev):
    """Eager softmax on saturn tensors runs the replacement (its kernel on a GPU for the last
    axis in float32, the reference otherwise); a compiled graph for a GPU places it as one
    custom kernel, and on saturn:0 the decomposition stays (fused reductions)."""
    x, _ = _inputs()
    xs = x.to(dev)
    gpu = dev != "saturn:0"
    before = fallback_counts()
    fb = saturn.fallback_counts()
    torch.testing.assert_close(torch.softmax(xs, -1).cpu(), torch.softmax(x, -1))
    torch.testing.assert_close(torch.softmax(xs, 0).cpu(), torch.softmax(x, 0))  # not last axis
    assert counts_delta(before) == {"saturn::softmax": 1 if gpu else 2}
    assert saturn.fallback_counts() == fb

    def f(x):
        return torch.softmax(x * 0.5, -1) + 1.0

    torch._dynamo.reset()
    got = torch.compile(f, backend="saturn", dynamic=False)(xs)
    torch.testing.assert_close(got.cpu(), f(x), rtol=1e-5, atol=1e-6)
    kinds = [k.kind for k in last_program().kernels]
    assert ("custom" in kinds) == gpu, kinds


@pytest.mark.parametrize(
    "dtype,dim", [(torch.float64, -1), (torch.float32, 0)], ids=["float64", "not-last-axis"]
)
def test_rmsnorm_pattern_declines_near_misses(dtype, dim):
    """The guards: float32 only (the kernel's dtype), the mean over the last axis only."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 8, dtype=dtype), torch.rand(8, dtype=dtype) + 0.5

    def f(x, w):
        return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + 1e-6) * w

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", options={"rewrites": ["rmsnorm"]}, dynamic=False)
    got = fn(x.to("saturn:0"), w.to("saturn:0"))
    torch.testing.assert_close(got.cpu(), f(x, w), rtol=1e-5, atol=1e-6)
    assert "custom" not in [k.kind for k in last_program().kernels]


def test_kernel_op_outside_its_dtypes_stays_a_host_call():
    """The generated placement rule is made only for nodes whose dtypes the kernel takes: a
    float64 call stays an opaque call of the op (its reference, counted)."""
    x, w = _inputs(torch.float64)

    def f(x, w):
        return lib.rmsnorm(x, w, 1e-5) * 3.0

    want = f(x, w)
    torch._dynamo.reset()
    before = fallback_counts()
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to("saturn:0"), w.to("saturn:0"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    prog = last_program()
    assert "custom" not in [k.kind for k in prog.kernels] and prog.count("host") == 1
    assert counts_delta(before) == {"saturn::rmsnorm": 1}


# --- mutation -------------------------------------------------------------------------


@cuda.jit
def _scale_add_kernel(out, x, y, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = x[i] * numba.float32(2.0)
        out[i] = x[i] + y[i]


def _scale_add_reference(x, y):
    x.mul_(2.0)
    return x + y


SCALE_ADD = custom_op(
    "saturn_test::scale_add",
    "(Tensor(a!) x, Tensor y) -> Tensor",
    reference=_scale_add_reference,
    kernel=_scale_add_kernel,
    launch=lambda x, y: ((x.numel() + 255) // 256, 256, 0, (x.numel(),)),
    mutates_args=("x",),
)


def test_expression_op_cannot_mutate():
    with pytest.raises(CustomOpError, match="writes its arguments needs a kernel or a host"):
        custom_op(
            "saturn_test::mut_expr",
            "(Tensor(a!) x) -> Tensor",
            reference=_ref,
            expression="(Neg x)",
            mutates_args=("x",),
        )


def test_mutation_reaches_the_callers_tensor_eagerly(dev):
    # a strided argument: the kernel writes a packed copy, which is copied back
    torch.manual_seed(0)
    base, y = torch.randn(8, 6), torch.randn(8, 3)
    want_base = base.clone()
    want = _scale_add_reference(want_base[:, ::2], y)
    bs = base.to(dev)
    before = fallback_counts()
    got = SCALE_ADD(bs[:, ::2], y.to(dev))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(bs.cpu(), want_base, rtol=1e-6, atol=0)  # odd columns untouched
    # the kernel ran on the GPU; saturn:0 ran the reference on host copies (counted)
    assert counts_delta(before) == ({} if dev != "saturn:0" else {"saturn_test::scale_add": 1})


def test_mutation_in_a_compiled_graph_updates_the_input(dev):
    torch.manual_seed(0)
    base, y = torch.randn(4, 6), torch.randn(4, 3)

    def f(base, y):
        r = SCALE_ADD(base[:, 1:4], y)
        return r.tanh() + base.sum()  # reads the base after the op wrote into it

    want_base = base.clone()
    want = f(want_base, y)
    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(base.to(dev), y.to(dev)).graph_break_count == 0
    torch._dynamo.reset()
    bs = base.to(dev)
    before = fallback_counts()
    got = torch.compile(f, backend="saturn", dynamic=False)(bs, y.to(dev))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bs.cpu(), want_base, rtol=1e-6, atol=0)
    # compiled (not run uncompiled), the write kept as one host step running the reference
    prog = last_program()
    host = [s.op.split("#")[0] for s in prog.steps if s.kind == "host" and s.op != "Item"]
    assert host == ["higher_order.auto_functionalized_v2.__call__"]
    assert [k.kind for k in prog.kernels] == ["reduce", "loop"]
    assert counts_delta(before) == {"saturn_test::scale_add": 1}


# --- host functions in replayed graphs (gpu) ------------------------------------------

_SEEN: list[tuple[bool, bool]] = []  # (x packed, y packed) per call of the host function


def _host_sees(out, x, y):
    _SEEN.append((x.is_contiguous(), y.is_contiguous()))
    out.copy_(y)  # nothing allocated: a captured call may not allocate


packed_host = custom_op(
    "saturn_test::packed_host",
    "(Tensor x, Tensor y) -> Tensor",
    reference=lambda x, y: y.clone(),
    host=_host_sees,
    packed=("y",),
)


def _host_waits(out, x):
    out.copy_(x * float(x.abs().amax().item()))  # reads a value back: waits for the device


waiting_host = custom_op(
    "saturn_test::waiting_host",
    "(Tensor x) -> Tensor",
    reference=lambda x: x * x.abs().amax(),
    host=_host_waits,
)


@pytest.mark.gpu
def test_a_host_function_gets_the_operands_it_names_packed_and_replays():
    gpu = torch.device("saturn:1")
    x, y = torch.randn(8, 16), torch.randn(16)

    def f(x, y):
        return packed_host(x.t(), y[:, None].expand(16, 8)) + 1

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=False)
    _SEEN.clear()
    for _ in range(4):
        got = fn(x.to(gpu), y.to(gpu))
    torch.testing.assert_close(got.cpu(), f(x, y), rtol=1e-5, atol=1e-5)
    runner = next(reversed(backend.CACHE.items.values())).recipe.runner
    assert runner.replays >= 2  # captured with the packed copy's buffer made before
    # the call with x strided as the program has it, y as a packed copy (not its expand)
    assert _SEEN and set(_SEEN) == {(False, True)}, _SEEN


@pytest.mark.gpu
def test_a_host_function_that_waits_turns_replay_off_and_stays_compiled():
    gpu = torch.device("saturn:1")
    x = torch.randn(6, 10)

    def f(x):
        return waiting_host(x + 1) - 1

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=False)
    fallbacks = len(backend.CACHE.fallbacks)
    for _ in range(3):
        got = fn(x.to(gpu))
    torch.testing.assert_close(got.cpu(), f(x), rtol=1e-5, atol=1e-5)
    assert backend.CACHE.fallbacks[fallbacks:] == []  # never ran uncompiled
    runner = next(reversed(backend.CACHE.items.values())).recipe.runner
    assert not runner.replay and runner.replays == 0


# --- torch.library ops with a saturn kernel --------------------------------------------

_LIB_CALLS: list[str] = []


@torch.library.custom_op("saturn_test::lib_scaled_add", mutates_args=())
def lib_scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + 2 * y


@lib_scaled_add.register_kernel("saturn")
def _lib_scaled_add_saturn(x, y):
    _LIB_CALLS.append(str(x.device))
    return x + 2 * y


@lib_scaled_add.register_fake
def _lib_scaled_add_fake(x, y):
    return torch.empty_like(x)


@torch.library.custom_op("saturn_test::lib_cpu_only", mutates_args=(), device_types="cpu")
def lib_cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@lib_cpu_only.register_fake
def _lib_cpu_only_fake(x):
    return torch.empty_like(x)


def test_a_torch_library_op_with_a_saturn_kernel_is_a_device_step(dev):
    x, y = torch.randn(4, 6), torch.randn(4, 6)

    def f(x, y):
        return torch.tanh(lib_scaled_add(x * 2, y)) + 1

    torch._dynamo.reset()
    fn = torch.compile(f, backend="saturn", dynamic=False)
    _LIB_CALLS.clear()
    fallbacks = len(backend.CACHE.fallbacks)
    with torch.no_grad():
        got = fn(x.to(dev), y.to(dev))
    torch.testing.assert_close(got.cpu(), f(x, y), rtol=1e-5, atol=1e-5)
    assert backend.CACHE.fallbacks[fallbacks:] == []
    prog = last_program()
    assert "custom" in [k.kind for k in prog.kernels], prog.to_text()
    assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
    assert _LIB_CALLS == [dev]  # the user's saturn kernel ran, on the graph's device


def test_a_torch_library_op_without_a_saturn_kernel_stays_a_host_step():
    torch._dynamo.reset()
    x = torch.randn(5)

    def f(x):
        return lib_cpu_only(x + 1) - 1

    with torch.no_grad():
        got = torch.compile(f, backend="saturn", dynamic=False)(x.to("saturn:0"))
    torch.testing.assert_close(got.cpu(), f(x), rtol=1e-5, atol=1e-5)
    prog = last_program()
    assert "custom" not in [k.kind for k in prog.kernels]
    assert prog.count("host") == 1
