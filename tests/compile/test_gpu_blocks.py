"""Compiled blocks on the GPU (marker gpu): nvmath GEMMs, cuDNN convolutions and
CUDA-graph replay, against eager PyTorch on the CPU, with proof of where the work ran."""

from __future__ import annotations

import copy
import time

import pytest
import torch

import saturn
from saturn import backend
from saturn.recipe import Recipe

from .blocks import WORKLOADS, make

pytestmark = pytest.mark.gpu
GPU = "saturn:1"


def compiled_on_gpu(model, options=None):
    torch._dynamo.reset()
    dev_model = copy.deepcopy(model).to(GPU)
    return torch.compile(dev_model, backend="saturn", options=options or {}, dynamic=False)


def recipes_of(before: int) -> list:
    """The recipes compiled since ``before`` compiles (most recent last)."""
    n = backend.CACHE.compiles - before
    items = list(backend.CACHE.items.values())
    return [cg.recipe for cg in items[-n:]] if n > 0 else []


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_block_matches_eager_and_replays(name):
    model, x = make(name)
    with torch.no_grad():
        want = model(x)
        compiles = backend.CACHE.compiles
        fn = compiled_on_gpu(model)
        xd = x.to(GPU)
        # compiling may run an op without a meta kernel on zeros (fake-tensor fallback)
        outs = [fn(xd)]  # compiled, then run step by step
        fb = saturn.fallback_counts()
        outs += [fn(xd) for _ in range(2)]  # captured, replayed
        assert saturn.fallback_counts() == fb, "a compiled call used the CPU fallback"
    (recipe,) = recipes_of(compiles)
    prog = recipe.program
    kinds = [k.kind for k in prog.kernels]
    lib = {"resnet": "conv", "embed": "rows"}.get(name.split("-")[0], "gemm")
    assert lib in kinds, kinds
    if lib == "rows":  # the token take is read inside the layer norm (fuse_row_takes)
        assert "gather" not in kinds and any("take" in k.attrs for k in prog.kernels), kinds
        assert recipe.runner.fused_takes == 1 and recipe.runner._unbounded_indices
    # float32 attention is one step, saturn's own kernel (codegen/flash_attention.py); a
    # block without attention has none (other custom steps may come from custom ops
    # earlier tests defined, which replace ATen ops for the rest of the process)
    fused = [k for k in prog.kernels if k.kind == "custom" and "attention" in k.attrs["name"]]
    assert len(fused) == (name.split("-")[0] == "encoder"), prog.to_text()
    # every GEMM and convolution on the device, nothing on the host, no crossing: the input
    # and the output are saturn tensors already
    assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
    assert recipe.last.crossings == 0
    runner = recipe.runner
    assert runner.captures >= 1 and runner.replays >= 2, (runner.captures, runner.replays)
    for got in outs:
        assert got.device == torch.device(GPU)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)
    if lib == "conv":  # cuDNN's ranked float32 plans were timed and the fastest kept
        # (a plan of a problem timed before takes that choice untimed: CONV_TUNINGS)
        plans = [plan for _, plan in runner.plans.values()]
        for plan in plans:
            assert plan.tuned is not None and (plan.candidates > 1 or plan.reused), (
                plan.candidates,
                plan.tuned,
            )
        # every convolution step reads one shared workspace, as large as the largest need
        convs = [k.output for k in prog.kernels if k.kind == "conv"]
        shared = {runner.workspaces[c].data_ptr() for c in convs}
        need = max(runner.plans[c][1].workspace_size for c in convs)
        assert len(convs) > 1 and len(shared) == 1, (len(convs), shared)
        assert runner.workspaces[convs[0]].numel() >= need


def test_replay_sees_inputs_changed_in_place_and_new_addresses():
    model, _ = make("mlp-8x128x512")
    x = torch.randn(3, 40, 512)  # a shape no other test compiles: a recipe of its own
    with torch.no_grad():
        compiles = backend.CACHE.compiles
        fn = compiled_on_gpu(model)
        xd = x.to(GPU)
        fn(xd)
        fn(xd)  # captured
        (recipe,) = recipes_of(compiles)
        runner = recipe.runner
        captures, replays = runner.captures, runner.replays
        assert (captures, replays) == (1, 1)
        xd.mul_(-0.5).add_(0.25)  # same address, new values
        got = fn(xd)
        torch.testing.assert_close(got.cpu(), model(xd.cpu()), rtol=1e-5, atol=1e-4)
        assert (runner.captures, runner.replays) == (captures, replays + 1)
        assert runner.fast_replays == 1  # the same tensors: the one-pass check took it
        y = torch.randn(x.shape)
        got = fn(y.to(GPU))  # a new address: staged, captured once more
        torch.testing.assert_close(got.cpu(), model(y), rtol=1e-5, atol=1e-4)
        z = torch.randn(x.shape)
        got = fn(z.to(GPU))  # staged: copied in, no new capture
        torch.testing.assert_close(got.cpu(), model(z), rtol=1e-5, atol=1e-4)
        assert (runner.captures, runner.replays) == (captures + 1, replays + 3)
        assert runner.fast_replays == 1  # staged inputs are copied in: the checked way


def test_fast_replay_declines_every_input_but_the_captured_one(monkeypatch):
    """The one-pass check of a replayed call takes only the captured inputs: another
    address, dtype, shape or layout at the same address, or a host tensor goes the
    checked way (which copies, stages or raises)."""
    model, _ = make("mlp-8x128x512")
    x = torch.randn(2, 24, 512)  # a shape no other test compiles: a recipe of its own
    seen = []
    call = Recipe.__call__

    def recording(self, a):
        seen.append(list(a))
        return call(self, a)

    monkeypatch.setattr(Recipe, "__call__", recording)
    with torch.no_grad():
        compiles = backend.CACHE.compiles
        fn = compiled_on_gpu(model)
        xd = x.to(GPU)
        outs = [fn(xd) for _ in range(3)]  # compiled, captured, replayed
        (recipe,) = recipes_of(compiles)
        runner = recipe.runner
        assert runner.fast_replays == 1
        args = seen[-1]
        (i,) = [k for k, a in enumerate(args) if a.data_ptr() == xd.data_ptr()]
        wrong = {
            "another address": xd.clone(),
            "another dtype": xd.view(torch.int32),
            "another shape": xd.view(2, 12, 1024),
            "not packed": xd.as_strided(xd.shape, (24 * 512, 1, 24)),
            "on the host": x,
        }
        for what, t in wrong.items():
            assert runner.replay_fast([*args[:i], t, *args[i + 1 :]]) is None, what
        assert runner.fast_replays == 1
        (got,) = runner.replay_fast(args)
        assert runner.fast_replays == 2
        with pytest.raises(RuntimeError, match="compiled for"):
            recipe([*args[:i], wrong["another shape"], *args[i + 1 :]])
        want = model(x)
        for out in [*outs, got]:
            torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-4)


def test_replay_off_by_option_gives_the_same_results():
    model, x = make("encoder-8x128x512")
    with torch.no_grad():
        fn = compiled_on_gpu(model, {"replay": False})
        xd = x.to(GPU)
        outs = [fn(xd) for _ in range(3)]
        runner = recipes_of(backend.CACHE.compiles - 1)[-1].runner
        assert runner.captures == 0 and runner.replays == 0
        for got in outs:
            torch.testing.assert_close(got.cpu(), model(x), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("approximate,epilogue", [("tanh", "gelu_bias"), ("none", "bias")])
def test_gelu_epilogue_folds_only_for_tanh(approximate, epilogue):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(approximate=approximate))
    x = torch.randn(64, 256)
    with torch.no_grad():
        fn = compiled_on_gpu(model)
        got = fn(x.to(GPU))
        torch.testing.assert_close(got.cpu(), model(x), rtol=1e-5, atol=1e-5)
    prog = recipes_of(backend.CACHE.compiles - 1)[-1].program
    gemms = [k for k in prog.kernels if k.kind == "gemm"]
    assert [k.attrs["epilogue"] for k in gemms] == [epilogue]
    loops = [k for k in prog.kernels if k.kind == "loop"]
    assert bool(loops) == (approximate == "none")  # exact GELU stays a loop after the GEMM


@pytest.mark.parametrize("way", ["fused", "separate", "timed"])
def test_gelu_epilogue_either_way_gives_eager_values(way, monkeypatch):
    """cuBLASLt's GELU+bias epilogue, or its bias epilogue then saturn's GELU pass: the same
    values as eager on the CPU, infinities and NaN included (gelu(-inf) is NaN); timed, the
    faster way is the one kept."""
    from saturn.gpu_runner import GpuRunner

    monkeypatch.setattr(GpuRunner, "gelu_epilogue", way)
    torch.manual_seed(5)
    # 515 features: the GELU pass's element count is not a multiple of 4 (its tail path)
    model = torch.nn.Sequential(torch.nn.Linear(256, 515), torch.nn.GELU(approximate="tanh"))
    # a batch size of its own per way: a cached recipe would bring its own plans
    x = torch.randn(41 + ["fused", "separate", "timed"].index(way), 256)
    x[3] = 0.0
    x[3, 0] = float("inf")  # one infinite term per product: +inf or -inf by the weight's sign
    x[7, 5] = float("nan")
    with torch.no_grad():
        want = model(x)
        compiles = backend.CACHE.compiles
        got = compiled_on_gpu(model)(x.to(GPU)).cpu()
    assert want[3].isinf().any() and want[3].isnan().any() and want[7].isnan().all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    ((_, plan),) = recipes_of(compiles)[-1].runner.plans.values()
    assert plan.epilogue == "gelu_bias"
    if way == "timed":
        t = plan.timings
        assert plan.gelu_separate == (t["gelu_separate"] < t["gelu_fused"]), t
    else:
        assert plan.gelu_separate == (way == "separate")


def test_gelu_epilogue_declines_float64(monkeypatch):
    """cuBLASLt's GELU epilogue is float32-accurate only (decision 0054): in float64 the
    product keeps a bias epilogue and the GELU is a loop of its own, at float64 accuracy."""
    from saturn.gpu_runner import GpuRunner

    monkeypatch.setattr(GpuRunner, "gelu_epilogue", "separate")
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(approximate="tanh"))
    model = model.double()
    x = torch.randn(16, 64, dtype=torch.float64)
    with torch.no_grad():
        compiles = backend.CACHE.compiles
        got = compiled_on_gpu(model)(x.to(GPU)).cpu()
        torch.testing.assert_close(got, model(x), rtol=1e-7, atol=1e-9)
    recipe = recipes_of(compiles)[-1]
    ((_, plan),) = recipe.runner.plans.values()
    assert plan.epilogue == "bias" and not plan.gelu_separate, plan.epilogue
    assert any(k.kind == "loop" for k in recipe.program.kernels), recipe.program.to_text()


def test_tf32_option_is_looser_than_float32():
    torch.manual_seed(2)
    a, b = torch.randn(512, 1024), torch.randn(1024, 512)
    want = a.double() @ b.double()
    errs = {}
    for tf32 in (False, True):
        torch._dynamo.reset()
        fn = torch.compile(
            lambda a, b: a @ b, backend="saturn", options={"tf32": tf32}, dynamic=False
        )
        got = fn(a.to(GPU), b.to(GPU)).cpu().double()
        errs[tf32] = (got - want).abs().max().item()
    assert errs[False] < 1e-3 < errs[True], errs


@pytest.fixture
def always_split(monkeypatch):
    """tf32x3 plans kept whatever their speed (by default the faster of it and float32)."""
    from saturn.gpu_runner import GpuRunner

    monkeypatch.setattr(GpuRunner, "choose_precision", False)


def test_tf32x3_is_as_accurate_as_float32_on_tensor_cores(always_split):
    """Split operands, three TF32 products: near float32's error against float64, where
    plain TF32 is a thousand times looser, through the bias+GELU epilogue too. Near, not
    equal: 3xTF32 drops lo*lo and rounds each lo to TF32 (about 2^-21 relative per product
    against float32's 2^-24), and cuBLASLt's timed algorithm choice changes the order of the
    sums (measured on the H200: float32 5.4e-5, tf32x3 3.9e-4, tf32 4.0e-2)."""
    torch.manual_seed(3)
    a, b = torch.randn(512, 1024), torch.randn(1024, 512)
    want = a.double() @ b.double()
    errs = {}
    for opts in ({}, {"tf32": True}, {"tf32x3": True}):
        torch._dynamo.reset()
        fn = torch.compile(lambda a, b: a @ b, backend="saturn", options=opts, dynamic=False)
        got = fn(a.to(GPU), b.to(GPU)).cpu().double()
        errs[tuple(opts)] = (got - want).abs().max().item()
    assert errs[()] < 1e-3 and errs[("tf32x3",)] < 1e-3 < errs[("tf32",)], errs
    assert 20 * errs[("tf32x3",)] < errs[("tf32",)], errs
    model, x = make("mlp-8x128x512")
    with torch.no_grad():
        compiles = backend.CACHE.compiles
        got = compiled_on_gpu(model, {"tf32x3": True})(x.to(GPU))
        torch.testing.assert_close(got.cpu(), model(x), rtol=1e-5, atol=1e-5)
        got = compiled_on_gpu(model, {"tf32x3": True})
        for _ in range(3):  # captured and replayed: the split kernels are in the graph
            torch.testing.assert_close(got(x.to(GPU)).cpu(), model(x), rtol=1e-5, atol=1e-5)
    (*_, recipe) = recipes_of(compiles)
    plans = [p for _, p in recipe.runner.plans.values()]
    assert len(plans) == 2 and all(p.precision == "tf32x3" and len(p.mms) == 3 for p in plans)
    assert recipe.runner.replays >= 1


def test_tf32x3_is_kept_only_where_timed_faster():
    torch.manual_seed(4)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    fn = torch.compile(lambda a, b: a @ b, backend="saturn", options={"tf32x3": True})
    got = fn(a.to(GPU), b.to(GPU)).cpu().double()
    exact = a.double() @ b.double()
    # float32-level either way: within a few times the CPU's own float32 error
    assert (got - exact).abs().max() <= 4 * ((a @ b).double() - exact).abs().max()
    ((_, plan),) = recipes_of(compiles)[-1].runner.plans.values()
    precisions = {k: plan.timings[k] for k in ("tf32x3", "fp32")}
    # and, against a float32 plan only, cuBLAS's own choice (decision 0131)
    assert set(plan.timings) - set(precisions) <= {"cublas", "cublaslt"}
    faster = min(precisions, key=precisions.get)
    assert plan.precision == faster and len(plan.mms) == (3 if faster == "tf32x3" else 1)
    assert faster == "fp32" or "cublas" not in plan.timings


def _conv_fn(opts, **kw):
    torch._dynamo.reset()
    return torch.compile(
        lambda x, w, b: torch.nn.functional.conv2d(x, w, b, **kw),
        backend="saturn",
        options=opts,
        dynamic=False,
    )


@pytest.mark.parametrize(
    "case",
    [
        dict(bias=False, kw=dict(padding=1)),
        dict(bias=True, kw=dict(padding=1)),
        dict(bias=True, kw=dict(stride=2, groups=2), channels_last=True),
        # channel counts that are not multiples of 4: the kernels' scalar paths
        dict(bias=True, kw=dict(padding=2, dilation=2), channels=(6, 10)),
    ],
)
def test_tf32x3_convolutions_are_as_accurate_as_float32(always_split, case):
    """Convolutions under tf32x3: two TF32 tensor-core cuDNN convolutions of the split
    operands' halves (channels-last, per group) and their sum: float32-level error against
    float64, with and without a bias, with groups, strides, dilation, a channels-last
    image and odd channel counts, and replayed."""
    from saturn.codegen.conv import SplitConvPlan

    torch.manual_seed(5)
    kw = case["kw"]
    cin, cout = case.get("channels", (32, 48))
    x, b = torch.randn(4, cin, 20, 20), torch.randn(cout)
    w = torch.randn(cout, cin // kw.get("groups", 1), 3, 3)
    if case.get("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    bias = b if case["bias"] else None
    b64 = None if bias is None else bias.double()
    want = torch.nn.functional.conv2d(x.double(), w.double(), b64, **kw)
    errs = {}
    for opts in ({}, {"tf32x3": True}):
        compiles = backend.CACHE.compiles
        fn = _conv_fn(opts, **kw)
        bb = None if bias is None else bias.to(GPU)
        for _ in range(3):  # the third call replays the captured graph
            got = fn(x.to(GPU), w.to(GPU), bb).cpu().double()
        errs[tuple(opts)] = (got - want).abs().max().item()
        if opts == {"tf32x3": True}:
            (recipe,) = recipes_of(compiles)
            ((_, plan),) = recipe.runner.plans.values()
            assert isinstance(plan, SplitConvPlan) and recipe.runner.replays >= 1
            assert plan.main.tuned is not None and plan.corr.tuned is not None
    assert errs[("tf32x3",)] < 4 * errs[()] < 1e-3, errs


def test_tf32x3_convolution_is_kept_only_where_timed_faster():
    """By default the split convolution and the float32 one are both timed (device time) on
    the first call's operands and the faster is kept; either way the result is float32's."""
    from saturn.codegen.conv import ConvPlan, SplitConvPlan

    torch.manual_seed(7)
    x, w = torch.randn(2, 16, 14, 14), torch.randn(16, 16, 3, 3)
    compiles = backend.CACHE.compiles
    got = _conv_fn({"tf32x3": True}, padding=1)(x.to(GPU), w.to(GPU), None).cpu()
    torch.testing.assert_close(
        got, torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5
    )
    ((_, plan),) = recipes_of(compiles)[-1].runner.plans.values()
    assert set(plan.timings) == {"tf32x3", "fp32"}
    faster = min(plan.timings, key=plan.timings.get)
    assert isinstance(plan, SplitConvPlan if faster == "tf32x3" else ConvPlan)


def test_plan_timing_counts_device_work_not_host_time():
    """``time_on_stream`` holds the stream busy while the timed calls are enqueued: a call
    that spends 5 ms on the host to enqueue 50 us of device work measures about 50 us (a
    hundredfold margin either side: this checks what is measured, not a speed)."""
    import numpy as np

    from saturn.codegen.gemm import _SPIN_SOURCE, raw_kernel, time_on_stream

    stream = torch.saturn.stream_handle(torch.device(GPU))
    spin = raw_kernel(_SPIN_SOURCE, "spin")

    def run(host_s: float, device_ns: int) -> None:
        import cupy

        time.sleep(host_s)
        with cupy.cuda.ExternalStream(stream):
            spin((1,), (1,), (np.int64(device_ns),))

    slow_host = time_on_stream(lambda: run(5e-3, 50_000), stream, reps=3)
    assert 0.04 <= slow_host < 0.5, slow_host  # ms: the device's 50 us, not the host's 5 ms
    slow_device = time_on_stream(lambda: run(0.0, 2_000_000), stream, reps=3)
    assert slow_device >= 1.9, slow_device  # 2 ms of device work is counted


def test_tf32x3_convolutions_keep_infinities_and_nan_as_float32_does(always_split):
    """An infinity or a NaN in the image reaches exactly the outputs whose window reads it
    (the corrections read hc, which has neither), as in a float32 convolution."""
    from saturn.codegen.conv import SplitConvPlan

    torch.manual_seed(6)
    x, w = torch.randn(2, 8, 12, 12), torch.rand(16, 8, 3, 3) + 0.1  # positive weights
    x[0, 2, 4, 4] = float("inf")
    x[1, 5, 7, 2] = float("nan")
    x[1, 1, 0, 0] = 3.4e38  # rounds up past float32's largest value: truncated instead
    w[:, 1] *= 0.5  # so that its products stay finite
    compiles = backend.CACHE.compiles
    got = _conv_fn({"tf32x3": True}, padding=1)(x.to(GPU), w.to(GPU), None).cpu()
    ((_, plan),) = recipes_of(compiles)[-1].runner.plans.values()
    assert isinstance(plan, SplitConvPlan)
    want = torch.nn.functional.conv2d(x, w, padding=1)
    assert want.isinf().any() and want.isnan().any()
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got.isnan(), want.isnan())
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-4)


def test_tf32x3_keeps_infinities_and_nan_as_float32_does(always_split):
    a = torch.randn(64, 64)
    b = torch.randn(64, 64).abs() + 0.1  # positive: a row of inf gives inf, not inf - inf
    a[3, :] = float("inf")
    a[5, 7] = float("nan")
    a[9, :] = 3.4e38  # rounds up past float32's largest value: truncated instead
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    fn = torch.compile(lambda a, b: a @ b, backend="saturn", options={"tf32x3": True})
    got = fn(a.to(GPU), b.to(GPU)).cpu()
    ((_, plan),) = recipes_of(compiles)[-1].runner.plans.values()
    assert plan.precision == "tf32x3" and len(plan.mms) == 3  # the split path ran
    want = a @ b
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got.isnan(), want.isnan())
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-4)


def test_key_reshape_copies_rows_and_the_gemm_reads_it_transposed():
    """Attention scores from a packed qkv: the key's reshape to [B*H, D, L] cannot be a view;
    it is copied in [B, H, L, D] order (a row copy, not a tiled transpose) and the batched
    GEMM reads the transposed matrix from its strides. Replayed calls agree after the input
    changes in place."""
    torch.manual_seed(3)
    x = torch.randn(2, 16, 96)

    def scores(qkv):
        q, k = qkv[..., :32], qkv[..., 32:64]
        q = q.reshape(2, 16, 4, 8).transpose(1, 2)
        k = k.reshape(2, 16, 4, 8).transpose(1, 2)
        return (q @ k.transpose(-1, -2)).softmax(-1)

    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    fn = torch.compile(scores, backend="saturn", dynamic=False)
    xd = x.to(GPU)
    for _ in range(3):
        got = fn(xd)
    torch.testing.assert_close(got.cpu(), scores(x), rtol=1e-5, atol=1e-6)
    xd.mul_(-0.5)  # in place: the replayed graph reads the new values
    torch.testing.assert_close(fn(xd).cpu(), scores(x * -0.5), rtol=1e-5, atol=1e-6)
    (recipe,) = recipes_of(compiles)
    assert recipe.program.count("host") == 0, recipe.program.to_text()
    runner = recipe.runner
    orders = [order for _, order in runner.view_copies.values()]
    assert (0, 1, 3, 2) in orders, orders
    assert runner.replays >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_depthwise_convolutions_admit_runtime_compiled_engines(dtype):
    """A depthwise convolution's cuDNN plan admits the engines cuDNN compiles while building
    plans (decision 0111: 1.5-14 times as fast there); a dense one's keeps the precompiled
    engines. Both give eager's values: float32 within the rounding bound of a sum of K
    products in any order (K u sum |x w|, u = 2^-24; against a float64 reference: the
    runtime-compiled engines sum in another order than the CPU, up to 3.4e-5 apart on
    values near 7), bfloat16 within its rounding of a float32 reference."""
    torch.manual_seed(11)
    x = torch.randn(4, 32, 20, 20)
    for weight, groups, compiled in (
        (torch.randn(32, 1, 7, 7), 32, True),
        (torch.randn(32, 1, 3, 3), 32, True),
        (torch.randn(16, 32, 3, 3), 1, False),
    ):
        pad = weight.shape[-1] // 2
        compiles = backend.CACHE.compiles
        fn = _conv_fn({}, padding=pad, groups=groups)
        got = fn(x.to(dtype).to(GPU), weight.to(dtype).to(GPU), None).cpu().float()
        xs, ws = x.to(dtype).double(), weight.to(dtype).double()
        want = torch.nn.functional.conv2d(xs, ws, padding=pad, groups=groups)
        if dtype == torch.float32:
            k = weight[0].numel()
            bound = (
                k
                * 2.0**-24
                * torch.nn.functional.conv2d(xs.abs(), ws.abs(), padding=pad, groups=groups)
            )
            assert ((got.double() - want).abs() <= bound).all(), (weight.shape, groups)
        else:
            torch.testing.assert_close(got, want.float(), rtol=2e-2, atol=2e-2)
        ((_, plan),) = recipes_of(compiles)[-1].runner.plans.values()
        assert plan.runtime_compiled == compiled, (weight.shape, groups)
