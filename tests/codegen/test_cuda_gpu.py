"""CUDA kernels on the GPU (marker gpu): every kernel kind against the reference, outputs
poisoned before each launch, dtypes float32/float64/int32/int64/bool, NaN/inf/-0.0, odd
sizes with tails; the strided copy kernel through clone/contiguous; a compiled graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import saturn
from saturn.codegen import cuda as cg
from saturn.codegen import cuda_reads
from saturn.dtypes import TORCH_DTYPES
from saturn.eqsat import evaluate as ev
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

pytestmark = pytest.mark.gpu
GPU = "saturn:1"

LOOPS = {
    "f32": "(let r (Sigmoid (Relu (Add (Mul a b) c))))",
    "f64": "(let r (Div (Exp (Neg a)) (Add (Abs b) (Scalar 1.5 f64))))",
    "i32": "(let r (Maximum (Add a b) (Neg c)))",
    "i64": "(let r (Where (Gt a b) (Sub a c) (Mul b (Scalar -3.0 i64))))",
    "bool": "(let r (Where a b c))",
}


def rand(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("i32", "i64"):
        return rng.integers(-1000, 1000, size=shape).astype(ev.np_dtype(dtype))
    x = rng.standard_normal(shape) * 2
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])
    x = np.where(rng.random(shape) < 0.02, rng.choice(special, size=shape), x)
    return x.astype(ev.np_dtype(dtype))


def run_on_gpu(graph_text: str, seed: int = 0):
    graph = parse_graph(graph_text)
    prog = compile_graph(graph, machine="gpu", io_on_device=True).program
    rng = np.random.default_rng(seed)
    inputs = {n.name: rand(rng, n.shape, n.dtype) for n in graph.inputs()}
    cc = torch.saturn.get_device_capability(GPU)
    stream = torch.saturn.stream_handle(GPU)
    env = {}
    by_input = {v: k for k, v in prog.inputs.items()}
    launched = 0
    for s in prog.steps:
        if s.kind == "input":
            env[s.output] = torch.from_numpy(inputs[by_input[s.output]]).to(GPU)
        elif s.kind == "view":
            from saturn.host_ops import run_host

            env[s.output] = run_host(s.op, [env[s.args[0]]], s.attrs, {})
        elif s.kind == "kernel":
            k = s.kernel
            dtype = TORCH_DTYPES[s.dtype]
            poison = (
                float("nan") if dtype.is_floating_point else (True if dtype == torch.bool else -7)
            )
            out = torch.full(s.shape, poison, dtype=dtype).to(GPU)
            ops = [env[o.value] for o in k.inputs]
            ops = [
                t if o.indexing == "strided" or t.is_contiguous() else t.contiguous()
                for o, t in zip(k.inputs, ops, strict=True)
            ]
            with torch.saturn.device(GPU):
                kern = cg.CudaKernel(k, cc)
                ws = torch.empty(max(kern.workspace_bytes(), 1), dtype=torch.uint8, device=GPU)
                kern.launch(
                    stream,
                    out.data_ptr(),
                    [t.data_ptr() for t in ops],
                    [tuple(t.shape) for t in ops],
                    [tuple(t.stride()) for t in ops],
                    workspace=lambda n, ws=ws: ws.data_ptr(),
                )
            env[s.output] = out
            launched += 1
        else:
            raise AssertionError(f"unexpected step {s.kind}")
    want = ev.eval_graph(graph, inputs)
    got = [env[o].cpu().numpy() for o in prog.outputs]
    return want, got, launched


@pytest.mark.parametrize("dtype", list(LOOPS))
@pytest.mark.parametrize("n", [1, 1000, 1_000_003, 9_000_011])  # the last strides and unrolls
def test_fused_loop(dtype, n):
    cond = "bool" if dtype == "bool" else dtype
    text = (
        f"(input a {cond} [{n}])\n(input b {dtype} [{n}])\n(input c {dtype} [{n}])\n"
        f"{LOOPS[dtype]}\n(output r)\n"
    )
    want, got, launched = run_on_gpu(text)
    assert launched == 1
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize(
    "text",
    [
        # softmax rows of 512 (4-lane vectors) and of 33 (scalar), float64 (2 lanes)
        "(input x f32 [64 8 512])\n(let r (Softmax x 2))\n(output r)",
        "(input x f32 [300 33])\n(let r (Softmax x 1))\n(output r)",
        "(input x f64 [40 96])\n(let r (LogSoftmax x 1))\n(output r)",
        # layer norm with a bias read per lane, rows of 1024 (long rows: several steps)
        "(input x f32 [96 1024])\n(param w f32 [1024])\n(param b f32 [1024])\n"
        "(let r (LayerNorm x w b [1] 1e-05))\n(output r)",
        # few long rows: a block per row
        "(input x f32 [8 4096])\n(let r (Softmax x 1))\n(output r)",
        # a permuted (strided) input: scalar reads through strides
        "(input x f32 [130 70])\n(let r (Softmax (Permute x [1 0]) 1))\n(output r)",
        # a causal mask broadcast over heads (strided, each row's offset found once)
        "(input x f32 [4 6 96 96])\n(input m f32 [4 1 96 96])\n"
        "(let r (Softmax (Add x (Expand m [4 6 96 96])) 3))\n(output r)",
    ],
)
def test_rows_kernels(text):
    want, got, launched = run_on_gpu(text + "\n")
    assert launched == 1  # the reductions and the loop in one kernel
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_vector_variant_only_for_aligned_operands(offset):
    """Whole tensors take 16-byte accesses; a view one element in falls back to the scalar
    kernel, and both agree with the reference (the tail included)."""
    n = 100_003
    text = (
        f"(input a f32 [{n}])\n(input b f32 [{n}])\n(input c f32 [{n}])\n"
        f"{LOOPS['f32']}\n(output r)\n"
    )
    (k,) = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program.kernels
    rng = np.random.default_rng(offset)
    host = [torch.from_numpy(rand(rng, (n + offset,), "f32")) for _ in range(3)]
    ops = [t.to(GPU)[offset:] for t in host]
    out = torch.full((n,), float("nan")).to(GPU)
    with torch.saturn.device(GPU):
        kern = cg.CudaKernel(k, torch.saturn.get_device_capability(GPU))
        ptrs = [out.data_ptr(), *(t.data_ptr() for t in ops)]
        assert kern.variant(ptrs)[0].lanes == (4 if offset == 0 else 1)
        kern.launch(torch.saturn.stream_handle(GPU), ptrs[0], ptrs[1:], [(n,)] * 3, [(1,)] * 3)
    a, b, c = (t[offset:] for t in host)
    want = torch.sigmoid(torch.relu(a * b + c))
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize(
    "shape,bias,indexing",
    [
        ((513, 1031), "[1031]", "trailing"),
        ((513, 1031), "[513 1]", "leading"),
        ((7, 129, 33), "[1 129 1]", "middle"),
        ((7, 130, 36), "[1 130 1]", "middle"),  # runs of 36: vector steps stay in one run
        ((7, 129, 33), "[7 1 33]", "strided"),
    ],
)
def test_broadcast_operands(shape, bias, indexing):
    dims = " ".join(map(str, shape))
    text = f"(input x f32 [{dims}])\n(input b f32 {bias})\n(let r (Tanh (Add x b)))\n(output r)\n"
    graph = parse_graph(text)
    (k,) = compile_graph(graph, machine="gpu", io_on_device=True).program.kernels
    assert [o.indexing for o in k.inputs] == ["same", indexing]
    want, got, _ = run_on_gpu(text)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("narrow", [True, False])
def test_permuted_operand_reads_through_strides(monkeypatch, narrow):
    """Both index-arithmetic variants of a strided loop: 32-bit where every index fits (as
    here), 64-bit otherwise (forced), each shown to be the one that ran."""
    made = []
    real = cg.generate

    def spy(k, lanes=None, narrow=False):
        made.append(narrow)
        return real(k, lanes, narrow)

    monkeypatch.setattr(cg, "generate", spy)
    if not narrow:
        monkeypatch.setattr(cg, "fits_narrow", lambda *a: False)
    text = "(input x f32 [301 257])\n(let r (Exp (Permute x [1 0])))\n(output r)\n"
    want, got, _ = run_on_gpu(text)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (True in made) == narrow, made


@pytest.mark.parametrize(
    "shape,perm,lanes",
    [
        ((4, 130, 6, 64), (0, 2, 1, 3), 4),  # attention's heads: rows of 64 stay contiguous
        ((4, 130, 6, 66), (0, 2, 1, 3), 1),  # rows of 66: a vector step would cross a row
        ((130, 64), (1, 0), 1),  # a transpose: no contiguous rows
    ],
)
def test_strided_loops_read_contiguous_rows_as_vectors(monkeypatch, shape, perm, lanes):
    """A loop over a permuted operand whose last axis stays contiguous reads it 16 bytes at a
    time (offsets worked out once per vector); other layouts take the scalar variant."""
    made = []
    real = cg.generate

    def spy(k, lanes=None, narrow=False):
        g = real(k, lanes, narrow)
        made.append(g.lanes)
        return g

    monkeypatch.setattr(cg, "generate", spy)
    dims = " ".join(map(str, shape))
    p = " ".join(map(str, perm))
    text = (
        f"(input x f32 [{dims}])\n(input b f32 [{shape[perm[-1]]}])\n"
        f"(let r (Add (Mul (Permute x [{p}]) (Scalar 0.125 f32)) b))\n(output r)\n"
    )
    want, got, _ = run_on_gpu(text)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert made[-1] == lanes, made  # the variant launched (compiled last)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Amax", "Amin", "Prod"])
@pytest.mark.parametrize(
    "shape,dims",
    [
        ((37, 1500), "[1]"),  # long rows: a block per row
        ((1031, 77), "[1]"),  # short rows: a warp per row
        ((70_001, 4), "[1]"),  # very short rows (pooling windows): a thread per row
        ((3, 5, 7, 2, 2), "[3 4]"),
        ((50_000, 16), "[1]"),
        ((9, 17), "[1]"),  # one past the thread-per-row limit: a warp
        ((1500, 33), "[0]"),  # columns
        ((9, 300, 17), "[1]"),  # middle axis
        ((6, 5, 701), "[1 2]"),  # a run of axes
    ],
)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
def test_reductions(op, shape, dims, dtype):
    if op == "Mean" and dtype in ("i32", "i64"):
        pytest.skip("mean of an integer tensor is an error in PyTorch")
    dims_s = " ".join(map(str, shape))
    prologue = "(Mul x (Scalar 0.5 {d}))" if op != "Prod" else "(Div x (Abs x))"
    if dtype in ("i32", "i64"):
        prologue = "x" if op != "Sum" else "(Mul x x)"
    body = prologue.format(d=dtype)
    text = f"(input x {dtype} [{dims_s}])\n(let r ({op} {body} {dims} 0))\n(output r)\n"
    want, got, launched = run_on_gpu(text)
    assert launched == 1
    (k,) = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program.kernels
    red = cg.reduce_layout(k)[1] if cg.reduce_layout(k)[2] == 1 else None
    style = cg.reduce_source(k, "f")[2]
    assert (style == "row-thread") == (red is not None and red <= cuda_reads.ROW_THREAD_LIMIT)
    assert got[0].dtype == want[0].dtype
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize(
    "shape,op,dims,dtype",
    [
        ((4_000_037,), "Sum", "[0]", "f32"),  # a loss: one output, a row split
        ((20_000, 1000), "Sum", "[0]", "f32"),  # a bias gradient: columns split
        ((3, 5000, 70), "Mean", "[1]", "f64"),  # a middle axis, mean's division
        ((3, 700_001), "Amax", "[1]", "f32"),  # a NaN in one row only
        ((5_000_000,), "Sum", "[0]", "i32"),  # widening to int64: exact
    ],
)
def test_narrow_reductions_split(shape, op, dims, dtype):
    """A reduction with few outputs and a long axis runs as partials per chunk and a fold:
    its values as the reference's, the same bits at every launch (the order of the
    additions is fixed by the sizes)."""
    text = f"(input x {dtype} [{' '.join(map(str, shape))}])\n(let r ({op} x {dims} 0))\n"
    text += "(output r)\n"
    (k,) = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program.kernels
    rng = np.random.default_rng(3)
    if dtype == "i32":
        x = rng.integers(-1000, 1000, size=shape).astype(np.int32)
    else:
        x = rng.standard_normal(shape).astype(ev.np_dtype(dtype))
    if op == "Amax":
        x[1, 123_456] = np.nan
    t = torch.from_numpy(x).to(GPU)
    want = ev.eval_graph(parse_graph(text), {"x": x})[0]
    with torch.saturn.device(GPU):
        kern = cg.CudaKernel(k, torch.saturn.get_device_capability(GPU))
        assert kern.split is not None and kern.split[0] > 1
        ws = torch.empty(kern.workspace_bytes(), dtype=torch.uint8, device=GPU)
        outs = []
        for _ in range(2):
            out = torch.full(want.shape, 7, dtype=TORCH_DTYPES[k.dtype]).to(GPU)
            kern.launch(
                torch.saturn.stream_handle(GPU),
                out.data_ptr(),
                [t.data_ptr()],
                [shape],
                [t.stride()],
                workspace=lambda n: ws.data_ptr(),
            )
            outs.append(out.cpu())
    assert torch.equal(outs[0].nan_to_num(), outs[1].nan_to_num())  # NaN where NaN was
    got = outs[0].numpy()
    if dtype == "i32":
        assert got.dtype == np.int64 and (got == want).all()
    elif op == "Amax":
        np.testing.assert_array_equal(got, want)  # NaN in row 1 only
    else:  # float sums in another order: within 1e-5 of the sum of magnitudes
        axes = tuple(int(d) for d in dims.strip("[]").split())
        bound = 1e-5 * np.abs(x).sum(axis=axes) / (x.size / want.size if op == "Mean" else 1)
        assert (np.abs(got - want) <= bound + 1e-6).all()


def test_integer_sum_widens_and_bool_sums():
    want, got, _ = run_on_gpu("(input x i32 [4099])\n(let r (Sum x [0] 0))\n(output r)\n")
    assert got[0].dtype == np.int64 and got[0] == want[0]
    want, got, _ = run_on_gpu("(input x bool [3 4099])\n(let r (Sum x [1] 0))\n(output r)\n")
    assert got[0].dtype == np.int64 and (got[0] == want[0]).all()


def test_max_propagates_nan():
    x = np.random.default_rng(1).standard_normal((4, 3000)).astype(np.float32)
    x[1, 2999] = np.nan
    x[3, 0] = np.nan
    t = torch.from_numpy(x).to(GPU)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(lambda t: t.amax(1), backend="saturn", dynamic=False)(t).cpu()
    assert torch.isnan(got[1]) and torch.isnan(got[3]) and not torch.isnan(got[0])
    torch.testing.assert_close(got, torch.from_numpy(x).amax(1), equal_nan=True)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int64,
        torch.complex128,
    ],
)
@pytest.mark.parametrize("rank", [1, 2, 3, 5, 8])
def test_copy_kernel_through_contiguous(dtype, rank):
    shape = [3, 5, 2, 4, 3, 2, 3, 2][:rank]
    x = (torch.randn(*shape) * 5).to(dtype)
    perm = list(reversed(range(rank)))
    xs = x.to(GPU).permute(*perm)
    before = saturn.fallback_counts()
    y = xs.contiguous()
    assert saturn.fallback_counts() == before, "no trip through the host fallback"
    assert y.is_contiguous()
    assert torch.equal(y.cpu(), x.permute(*perm).contiguous())


@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.float16, torch.float32, torch.int64, torch.complex128]
)
@pytest.mark.parametrize("shape", [(1001, 37), (4, 64)])
def test_expanded_scalars_copy_as_fills(monkeypatch, dtype, shape):
    """A copy of an expanded scalar (every stride 0) is a fill: the element read once per
    thread, 16-byte stores where the width allows, the tail one element at a time."""
    fills = []
    real = cg.CopyKernel._fill

    def spy(self, *args):
        fills.append(args[-1])
        return real(self, *args)

    monkeypatch.setattr(cg.CopyKernel, "_fill", spy)
    value = torch.tensor(-3.5 + 2j if dtype == torch.complex128 else 7).to(dtype)
    y = value.to(GPU).expand(*shape).contiguous()
    assert fills == [shape[0] * shape[1]]
    assert torch.equal(y.cpu(), value.expand(*shape).contiguous())


def test_compiled_pointwise_and_reduction_graph_on_the_gpu():
    torch._dynamo.reset()
    x = torch.randn(257, 1031)
    fn = torch.compile(
        lambda x: (torch.sigmoid(x * 2 + 1).sum(1), torch.softmax(x, -1)),
        backend="saturn",
        options={"device": GPU},
        dynamic=False,
    )
    with torch.no_grad():
        before = saturn.fallback_counts()
        s, p = fn(x.to(GPU))
        assert saturn.fallback_counts() == before
    torch.testing.assert_close(s.cpu(), torch.sigmoid(x * 2 + 1).sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(p.cpu(), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    from saturn.backend import CACHE

    recipe = next(reversed(CACHE.items.values())).recipe
    # softmax is reductions + a loop, or one kernel where saturn.library (its replacement) is
    # loaded in this process: either way every kernel launched and nothing ran on the host
    kernels = recipe.program.kernels
    assert recipe.on_gpu and len(kernels) >= 2 and recipe.last.launches == len(kernels)
    assert recipe.last.host_ops == 0 and recipe.last.crossings == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16])
@pytest.mark.parametrize("offset", [0, 1])
def test_head_permute_copies(dtype, offset):
    """[B, L, H, D] -> [B, H, L, D]: contiguous rows, copied as vectors where the rows
    split into aligned vectors (16 bytes for float32 and int64, 8 for float16, at offset 0),
    element by element otherwise (a view starting one element in)."""
    from saturn.codegen import cuda as cg

    x = (torch.randn(2 * 16 * 4 * 32 + offset) * 9).to(dtype)
    xs = x.to(GPU)[offset:].view(2, 16, 4, 32).permute(0, 2, 1, 3)
    want = x[offset:].view(2, 16, 4, 32).permute(0, 2, 1, 3).contiguous()
    strides = list(xs.stride())
    fits = cg.row_copy_fits(xs.element_size(), list(xs.shape), strides, (0, xs.data_ptr()))
    assert fits == (offset == 0)
    before = saturn.fallback_counts()
    y = xs.contiguous()
    assert saturn.fallback_counts() == before
    assert torch.equal(y.cpu(), want)
