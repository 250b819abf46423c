"""A convolution's backward compiled with no host op. On GPU targets the input's and the
weight's gradients are cuDNN's backward-data and backward-filter (decision 0125); written
out (saturn:0, and GPU targets with ``LIBRARY_GRADIENTS`` off; decision 0088), the input's
gradient is a convolution of the spread, padded output gradient by the flipped weight, the
weight's a product with the input's windows; the bias's is a sum. Each as eager's on the
CPU (float32 sums in another order: within 1e-5 of the largest gradient). Grouped and
depthwise convolutions too; what declines (a transposed convolution) stays PyTorch's op."""

from __future__ import annotations

import pytest
import torch

from saturn import backend, import_conv_backward

from .helpers import traced_step

# in channels, out channels, kernel, stride, padding, dilation, bias, input (N, H, W), groups
CONVS = {
    "3x3-same": (3, 4, 3, 1, 1, 1, True, (2, 8, 8)),
    "3x3-stride-2": (3, 5, 3, 2, 1, 1, False, (2, 9, 9)),
    "1x1": (4, 6, 1, 1, 0, 1, False, (2, 5, 5)),
    "1x1-stride-2": (4, 3, 1, 2, 0, 1, False, (1, 8, 8)),
    "7x7-stem": (3, 4, 7, 2, 3, 1, False, (1, 16, 16)),
    "remainder-rows": (2, 3, 3, 2, 0, 1, True, (1, 8, 7)),
    "dilated": (2, 3, 3, 1, 2, 2, True, (1, 9, 9)),
    "rectangular": (2, 2, (3, 1), (2, 1), (1, 0), 1, True, (2, 7, 5)),
    "padding-past-the-kernel": (2, 2, 2, 1, 2, 1, True, (1, 5, 5)),
    "two-groups": (4, 6, 3, 1, 1, 1, True, (2, 6, 6), 2),
    "depthwise-stride-2": (4, 4, 3, 2, 1, 1, False, (2, 7, 7), 4),
    "depthwise-multiplier": (3, 6, 5, 1, 2, 1, True, (1, 8, 8), 3),
}


def _programs(dev):
    return [
        g.compiled.program
        for g in backend.CACHE.items.values()
        if g.recipe.device == torch.device(dev)
    ]


def _host_ops(prog) -> list[str]:
    return [s.op.split("#")[0] for s in prog.steps if s.kind == "host"]


def _gradients(conv, x, device=None, compiled=False):
    conv = conv if device is None else _copy(conv).to(device)
    x = (x if device is None else x.to(device)).clone().requires_grad_()
    fn = torch.compile(conv, backend="saturn", dynamic=False) if compiled else conv
    torch.manual_seed(1)
    weight = torch.randn(conv(x).shape)
    (fn(x) * weight.to(x.device)).sum().backward()
    grads = [x.grad, conv.weight.grad] + ([conv.bias.grad] if conv.bias is not None else [])
    return [g.cpu() for g in grads]


def _producer(steps: dict, v: str):
    """The step computing what view ``v`` reads (through its chain of views)."""
    while steps[v].kind == "view":
        v = steps[v].args[0]
    return steps[v]


def _gpu_backward(model, x, library: bool = False):
    """The training step's backward graph, imported and compiled for the GPU machine, its
    convolution gradients cuDNN's (``library``) or written out."""
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    was = import_conv_backward.LIBRARY_GRADIENTS
    import_conv_backward.LIBRARY_GRADIENTS = library
    try:
        graph = import_graph(traced_step(model, x)[1], replacements=True).graph
    finally:
        import_conv_backward.LIBRARY_GRADIENTS = was
    return compile_graph(graph, machine="gpu", io_on_device=True).program


def _copy(m):
    import copy

    return copy.deepcopy(m)


# the weight's gradient as one product over (images, rows, columns), or as a batch of
# per-image products summed (what a product of few output tiles takes)
FORMS = {"one-product": 0, "per-image": 10**9}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_backward_runs_on_the_device(dev, name, form, monkeypatch):
    monkeypatch.setattr(import_conv_backward, "BATCHED_BELOW_TILES", FORMS[form])
    cin, cout, k, s, p, d, bias, (n, h, w), *groups = CONVS[name]
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(cin, cout, k, s, p, d, groups=groups[0] if groups else 1, bias=bias)
    x = torch.randn(n, cin, h, w)
    want = _gradients(conv, x)
    torch._dynamo.reset()
    backend.CACHE.clear()
    got = _gradients(conv, x, dev, compiled=True)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())
    progs = _programs(dev)
    assert len(progs) == 2
    for prog in progs:
        assert _host_ops(prog) == [], prog.to_text()
    # on a GPU, each gradient is cuDNN's (the bias's a sum)
    grads = [k.attrs["of"] for k in progs[1].kernels if k.kind == "conv_grad"]
    assert sorted(grads) == ([] if dev == "saturn:0" else ["input", "weight"]), grads


def test_a_transposed_convolution_backward_stays_pytorchs_op():
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(4, 3, 3, 2, 1)
    x = torch.randn(1, 4, 5, 5)
    want = _gradients(conv, x)
    torch._dynamo.reset()
    backend.CACHE.clear()
    got = _gradients(conv, x, "saturn:0", compiled=True)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    backward = _programs("saturn:0")[-1]
    assert "aten.convolution_backward.default" in _host_ops(backward), backward.to_text()


@pytest.mark.parametrize("library", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convolution_backward_graphs_compile_for_the_gpu_without_host_steps(
    dtype, library, monkeypatch
):
    """Without a GPU: a small CNN's backward graph (strided, 1x1, depthwise and grouped
    convolutions, a bias), imported and compiled for the GPU machine in float32 and in
    bfloat16, has no host step and no crossing: every gradient is a device kernel, cuDNN's
    gradient plans (one a gradient, the image's included) or written out."""
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    monkeypatch.setattr(import_conv_backward, "LIBRARY_GRADIENTS", library)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, 2, 1, bias=False),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, 1, 1, groups=8),
        torch.nn.Conv2d(8, 4, 1),
        torch.nn.Conv2d(4, 4, 3, 1, 1, groups=2),
    ).to(dtype)
    x = torch.randn(2, 3, 12, 12, dtype=dtype, requires_grad=True)
    programs = [
        compile_graph(
            import_graph(gm, replacements=True).graph, machine="gpu", io_on_device=True
        ).program
        for gm in traced_step(model, x)
    ]
    assert len(programs) == 2
    backward = programs[1]
    assert backward.count("host") == 0 and backward.count("crossing") == 0, backward.to_text()
    kinds = [k.kind for k in backward.kernels]
    if library:
        grads = sorted(k.attrs["of"] for k in backward.kernels if k.kind == "conv_grad")
        assert grads == ["input"] * 4 + ["weight"] * 4, grads
        assert "conv" not in kinds and "gemm" not in kinds, kinds
    else:
        assert {"conv", "gemm"} <= set(kinds), kinds


def test_the_weight_gradient_form_follows_the_products_tiles():
    """Per image where one product has few 128 x 128 output tiles (ResNet's first stages:
    64 x 576 is 5 tiles over 100,352 rows); one product where it has enough, and in half
    types, whose per-image products would each be rounded before the sum."""
    per_image = import_conv_backward._per_image
    assert per_image(64, 64, 9, 1, "f32")  # [64, 576]: 5 tiles
    assert per_image(256, 256, 9, 1, "f64")  # [256, 2304]: 36 tiles
    assert not per_image(512, 512, 9, 1, "f32")  # [512, 4608]: 144 tiles
    assert not per_image(64, 64, 9, 1, "bf16")
    assert not per_image(1920, 8, 9, 240, "f32")  # 240 groups of [8, 72]: 240 tiles


def test_the_per_image_weight_gradient_is_a_batched_product_and_a_sum():
    """For the GPU machine, without a GPU: the weight's gradient of a 3x3 convolution reads
    the gradient and the windows as they lie, a batch of products (a rank-3 GEMM) and a sum
    over the images, and no copy arranges an operand for the product."""
    torch.manual_seed(0)
    model = torch.nn.Conv2d(4, 8, 3, 1, 1, bias=False)
    backward = _gpu_backward(model, torch.randn(3, 4, 10, 10, requires_grad=True))
    text = backward.to_text()
    steps = {s.output: s for s in backward.steps}
    gemms = [s for s in backward.steps if s.kernel is not None and s.kernel.kind == "gemm"]
    assert [len(s.shape) for s in gemms] == [3], text
    gemm = gemms[0].kernel
    # the gradient as it comes in, and the windows as joined: no copy in between
    assert _producer(steps, gemm.inputs[0].value).kind == "input", text
    assert _producer(steps, gemm.inputs[1].value).kernel.kind == "concat", text
    sums = [s for s in backward.steps if s.kernel is not None and s.kernel.kind == "reduce"]
    assert [_producer(steps, s.kernel.inputs[0].value).output for s in sums] == [gemms[0].output], (
        text
    )
    assert backward.count("host") == 0, text


def test_the_input_gradients_weight_is_one_take_and_no_view_copies():
    """For the GPU machine, without a GPU: each input gradient's convolution reads its
    swapped, flipped weight from one take of the weight's elements, a depthwise weight's
    gradient is a reduction (no product), and no view step of
    the backward program has to copy (a reshape that cannot view its source copies it at
    every call: the swap and flips through views did, twice a convolution)."""
    from saturn.view_copies import view_copies

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, 2, 1, bias=False),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, 1, 1, groups=2),
        torch.nn.Conv2d(8, 8, 3, 1, 1, groups=8),  # depthwise: a reduction, no product
        torch.nn.Conv2d(8, 4, (3, 1), 1, (1, 0)),
    )
    backward = _gpu_backward(model, torch.randn(2, 3, 12, 12, requires_grad=True))
    text = backward.to_text()
    assert view_copies(backward) == [], text
    steps = {s.output: s for s in backward.steps}
    convs = [s.kernel for s in backward.steps if s.kernel is not None and s.kernel.kind == "conv"]
    assert len(convs) == 4, text  # each input gradient, the image's too
    assert [_producer(steps, k.inputs[1].value).kernel.kind for k in convs] == ["gather"] * 4, text
    gemms = [s for s in backward.steps if s.kernel is not None and s.kernel.kind == "gemm"]
    assert len(gemms) == 3, text  # the depthwise weight's gradient is a reduction


def test_a_half_depthwise_weight_gradient_sums_in_float32():
    """bfloat16 depthwise convolution (a channel multiplier of 2, stride 2) on saturn:0:
    the gradients no further from float32's than eager's bfloat16 ones are (twice that, as
    the zoo's measure), the weight's computed as a reduction (no product in the backward)."""
    import copy

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 12, 3, 2, 1, groups=6).to(torch.bfloat16)
    x = torch.randn(2, 6, 9, 9, dtype=torch.bfloat16)
    want = _gradients(conv, x)
    want32 = _gradients(copy.deepcopy(conv).float(), x.float())
    torch._dynamo.reset()
    backend.CACHE.clear()
    got = _gradients(conv, x, "saturn:0", compiled=True)
    for g, r, r32 in zip(got, want, want32, strict=True):
        assert g.dtype == torch.bfloat16
        eager_off = (r.float() - r32).abs().max().item()
        assert (g.float() - r32).abs().max().item() <= 2 * max(eager_off, 1e-3), (g, r32)
    backward = _programs("saturn:0")[-1]
    kinds = {k.kind for k in backward.kernels}
    assert "reduce" in kinds and "gemm" not in kinds, backward.to_text()


def test_view_copies_names_a_reshape_its_source_cannot_view():
    """The replay finds a copying view: a 1x1 stride-2 convolution's windows are a strided
    slice of its input, which the per-image weight gradient reshapes, copying it."""
    from saturn.view_copies import view_copies

    torch.manual_seed(0)
    model = torch.nn.Conv2d(4, 8, 1, 2, bias=False)
    copies = view_copies(_gpu_backward(model, torch.randn(2, 4, 8, 8)))
    assert len(copies) == 1 and "Slice" in copies[0], copies


@pytest.mark.gpu
def test_half_convolution_backward_on_the_gpu():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, 2, 1).to(torch.bfloat16)
    x = torch.randn(4, 8, 16, 16, dtype=torch.bfloat16)
    want = _gradients(conv, x)
    torch._dynamo.reset()
    backend.CACHE.clear()
    got = _gradients(conv, x, "saturn:1", compiled=True)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(
            g.float(), r.float(), rtol=2e-2, atol=2e-2 * r.abs().max().item()
        )
    for prog in _programs("saturn:1"):
        assert _host_ops(prog) == [], prog.to_text()


def _grad_graph(g, x, w, conv) -> str:
    dims = {"f32": "f32", torch.float32: "f32", torch.float64: "f64", torch.float16: "f16"}
    d = dims[g.dtype]

    def iv(t):
        return "[" + " ".join(str(int(v)) for v in t) + "]"

    st, pa, di, gr = conv
    attrs = f"{iv(st)} {iv(pa)} {iv(di)} {gr}"
    return (
        f"(input g {d} {iv(g.shape)})\n(input x {d} {iv(x.shape)})\n(param w {d} {iv(w.shape)})\n"
        f"(let a (ConvInputGrad g w {iv(x.shape)} {attrs}))\n"
        f"(let b (ConvWeightGrad g x {iv(w.shape)} {attrs}))\n(output a b)\n"
    )


@pytest.mark.parametrize("name", sorted(CONVS))
def test_the_gradient_ops_are_cudnn_kernels_with_eagers_values(name):
    """Without a GPU: ``ConvInputGrad`` and ``ConvWeightGrad`` compile for the GPU machine
    to one cuDNN gradient kernel each, and the program (its kernels' references), the
    graph (the op table's semantics) and saturn:0's host ops all give eager's gradients."""
    import numpy as np

    from saturn.eqsat import evaluate as ev
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph
    from saturn.host_ops import run_host

    cin, cout, k, s, p, d, _bias, (n, h, w), *groups = CONVS[name]
    gr = groups[0] if groups else 1
    conv = (*((v, v) if isinstance(v, int) else v for v in (s, p, d)), gr)
    k = (k, k) if isinstance(k, int) else k
    torch.manual_seed(0)
    x = torch.randn(n, cin, h, w, dtype=torch.float64)
    wt = torch.randn(cout, cin // gr, *k, dtype=torch.float64)
    g = torch.randn_like(torch.nn.functional.conv2d(x, wt, None, *conv))
    st, pa, di = (list(v) for v in conv[:3])
    want = torch.ops.aten.convolution_backward(
        g, x, wt, None, st, pa, di, False, [0, 0], gr, [True, True, False]
    )[:2]
    graph = parse_graph(_grad_graph(g, x, wt, conv))
    prog = compile_graph(graph, machine="gpu", io_on_device=True).program
    assert [(k.kind, k.attrs["of"]) for k in prog.kernels] == [
        ("conv_grad", "input"),
        ("conv_grad", "weight"),
    ], prog.to_text()
    inputs = {"g": g.numpy(), "x": x.numpy(), "w": wt.numpy()}
    host = [
        run_host("ConvInputGrad", [g, wt], (tuple(x.shape), *conv), {}),
        run_host("ConvWeightGrad", [g, x], (tuple(wt.shape), *conv), {}),
    ]
    for got in (ev.eval_program(prog, inputs), ev.eval_graph(graph, inputs), host):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-12, atol=1e-12)


def test_a_gradient_op_of_the_wrong_shape_is_refused_with_its_shapes():
    from saturn.eqsat.errors import EqsatError
    from saturn.eqsat.graph import parse_graph

    g, x, w = torch.zeros(2, 4, 8, 8), torch.zeros(2, 3, 8, 8), torch.zeros(4, 3, 3, 3)
    text = _grad_graph(g, x, w, ((1, 1), (0, 0), (1, 1), 1))  # padding 0 gives 6 x 6
    with pytest.raises(EqsatError, match=r"gives \[2, 4, 6, 6\], not \[2, 4, 8, 8\]"):
        parse_graph(text)
    text = _grad_graph(g, x, w, ((1, 1), (1, 1), (1, 1), 2))  # 3 channels in 2 groups
    with pytest.raises(EqsatError, match="input channels"):
        parse_graph(text)


def test_half_gradient_ops_are_cudnn_kernels_on_the_gpu_machine_only():
    """float16 gradients place on the GPU machine (cuDNN accumulates in float32 and rounds
    once); saturn:0's machine has no half kernels, so there they stay host ops."""
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph

    shapes = ((2, 4, 8, 8), (2, 3, 8, 8), (4, 3, 3, 3))
    g, x, w = (torch.zeros(s, dtype=torch.float16) for s in shapes)
    graph = parse_graph(_grad_graph(g, x, w, ((1, 1), (1, 1), (1, 1), 1)))
    gpu = compile_graph(graph, machine="gpu", io_on_device=True).program
    assert [k.kind for k in gpu.kernels] == ["conv_grad", "conv_grad"], gpu.to_text()
    cpu = compile_graph(graph, machine="cpu-reference").program
    assert cpu.kernels == [] and cpu.count("host") == 2, cpu.to_text()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_infinity_reaches_only_the_outputs_whose_products_read_it(dtype):
    """ResNet's 3x3 shapes, where cuDNN ranks FFT and Winograd engines: one infinity in the
    image and one in the output's gradient. The convolution and both gradients are
    infinite or NaN only where eager's are, and equal to eager's elsewhere: a transforming
    engine (never planned) spreads an infinity to outputs that never read it. An infinite
    output may be NaN instead only where eager CUDA's is too (decision 0129: a float32
    backward-filter engine cuDNN ranks first, which eager CUDA runs as well, sums an
    infinite product to NaN)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, 1, 1, bias=False).to(dtype)
    x = torch.randn(8, 64, 32, 32, dtype=dtype)
    x[0, 3, 5, 7] = float("inf")
    g = torch.randn(8, 64, 32, 32, dtype=dtype)
    g[1, 2, 20, 9] = float("-inf")

    def step(c, xs, gs):
        xs = xs.clone().requires_grad_()
        y = c(xs)
        (y.float() * gs.float()).sum().backward()
        return [y.detach(), xs.grad, conv.weight.grad]

    want = [t.clone() for t in step(conv, x, g)]
    conv.weight.grad = None
    torch._dynamo.reset()
    backend.CACHE.clear()
    compiled = torch.compile(conv.to("saturn:1"), backend="saturn", dynamic=False)
    got = [t.cpu() for t in step(compiled, x.to("saturn:1"), g.to("saturn:1"))]
    conv.to("cpu")
    cuda = _cuda_eager(x, g, conv.weight.detach())
    names = ("output", "input grad", "weight grad")
    for name, a, b, c in zip(names, got, want, cuda, strict=True):
        assert torch.equal(a.isfinite(), b.isfinite()), f"{name}: {_special_diffs(a, b)}"
        # NaN where eager's is, and besides only where eager CUDA's infinity is NaN too
        nan_ok = b.isnan() | (b.isinf() & c.isnan())
        assert not (a.isnan() & ~nan_ok).any(), f"{name}: {_special_diffs(a, b)}"
        assert not (b.isnan() & ~a.isnan()).any(), f"{name}: {_special_diffs(a, b)}"
        fin = b.isfinite()
        scale = b[fin].float().abs().max().item()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        err = (a[fin].float() - b[fin].float()).abs().max().item()
        assert err <= tol * scale, f"{name}: error {err:.3e}, {tol * scale:.3e} allowed"
    grads = [k for p in _programs("saturn:1") for k in p.kernels if k.kind == "conv_grad"]
    assert sorted(k.attrs["of"] for k in grads) == ["input", "weight"]


def _cuda_eager(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """Eager CUDA's output and gradients (its aten ops called directly: CUDA autograd does
    not run beside saturn yet), TF32 off, on the CPU."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        cx, cg, cw = (t.cuda() for t in (x, g, w))
        y = torch.nn.functional.conv2d(cx, cw, padding=1)
        args = (None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
        dx, dw, _ = torch.ops.aten.convolution_backward(cg, cx, cw, *args)
        return [t.cpu() for t in (y, dx, dw)]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def _special_diffs(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where saturn's non-finite values differ from eager's, counted by kind."""
    kinds = {
        "NaN where eager is infinite": got.isnan() & want.isinf(),
        "infinite where eager is NaN": got.isinf() & want.isnan(),
        "non-finite where eager is finite": ~got.isfinite() & want.isfinite(),
        "finite where eager is not": got.isfinite() & ~want.isfinite(),
    }
    return ", ".join(f"{int(m.sum())} {k}" for k, m in kinds.items() if m.any())


def test_a_gradient_plan_refuses_what_cudnn_cannot_be_asked_before_asking_it():
    """``ConvGradPlan`` checks its operands before it reaches cuDNN (none here): each
    refusal a ``ConvError`` naming what is wrong, which the runner answers by running the
    call uncompiled (decision 0050)."""
    from saturn.codegen.conv import ConvError, ConvParams
    from saturn.codegen.conv_grad import ConvGradPlan
    from saturn.codegen.gemm import Layout

    def lay(shape, dtype="f32"):
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
        return Layout(dtype, tuple(shape), tuple(strides))

    p = ConvParams((1, 1), (1, 1), (1, 1), 1)
    g, x, w = lay((2, 4, 8, 8)), lay((2, 3, 8, 8)), lay((4, 3, 3, 3))
    cases = [
        (("bias", g, w, x, p), "no gradient of its 'bias'"),
        (("input", lay((2, 4, 8, 8), "i32"), w, x, p), "dtypes i32, f32, f32 differ"),
        (("input", *(lay(t.shape, "i32") for t in (g, w, x)), p), "dtype i32"),
        (("input", lay((2, 4, 64)), w, x, p), "rank-4"),
        (("weight", g, lay((2, 5, 8, 8)), w, p), "5 input channels"),
        (("input", g, w, x, ConvParams((1, 1), (0, 0), (1, 1), 1)), r"\[2, 4, 6, 6\]"),
    ]
    for args, message in cases:
        with pytest.raises(ConvError, match=message):
            ConvGradPlan(*args, stream=0)


def test_saturn0_runs_a_gradient_kernel_through_the_host_ops():
    """A ``conv_grad`` kernel of a saturn:0 program (a graph that names the ops: the
    importer writes the gradients out for saturn:0) runs through PyTorch's CPU gradients."""
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.kinds import Kind
    from saturn.eqsat.pipeline import compile_graph
    from saturn.recipe import HOST_KERNELS

    torch.manual_seed(0)
    conv = ((2, 2), (1, 1), (1, 1), 2)
    x, w = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3)
    g = torch.randn_like(torch.nn.functional.conv2d(x, w, None, *conv))
    want = torch.ops.aten.convolution_backward(
        g, x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, False]
    )[:2]
    prog = compile_graph(parse_graph(_grad_graph(g, x, w, conv)), machine="cpu-reference").program
    kernels = [k for k in prog.kernels if k.kind == Kind.CONV_GRAD]
    assert [k.attrs["of"] for k in kernels] == ["input", "weight"], prog.to_text()
    for k, operands, r in zip(kernels, ([g, w], [g, x]), want, strict=True):
        out = torch.empty_like(r)
        HOST_KERNELS[k.kind](None, k, out, operands)
        torch.testing.assert_close(out, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "pool, size",
    [((2, 2), (8, 8)), ((2, 2), (9, 11)), ((2, 3), (10, 9)), ((3, 3), (9, 9)), ((3, 1), (9, 9))],
)
def test_tiling_average_pools_backward_is_the_share_spread(pool, size, dtype):
    """An average pool whose windows tile the image (kernel = stride, no padding: DenseNet's
    transitions), odd sizes leaving rows and columns in no window: each element's gradient
    is its window's share (zero outside every window), bit for bit eager's, with no
    convolution in the backward (the overlapping pools' form)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, *size, dtype=dtype)
    weight = torch.randn(torch.nn.functional.avg_pool2d(x, pool, pool).shape, dtype=dtype)

    def grad(dev, compiled):
        xx = x.to(dev).clone().requires_grad_()
        w = weight.to(dev)

        def f(a):
            return (torch.nn.functional.avg_pool2d(a, pool, pool) * w).float().sum()

        fn = torch.compile(f, backend="saturn", dynamic=False) if compiled else f
        fn(xx).backward()
        return xx.grad.cpu()

    want = grad("cpu", False)
    torch._dynamo.reset()
    backend.CACHE.clear()
    assert torch.equal(grad("saturn:0", True), want)
    backward = _programs("saturn:0")[-1]
    assert "conv" not in [k.kind for k in backward.kernels], backward.to_text()
    if dtype == torch.float32:  # saturn:0 has no half kernels: bfloat16 runs host ops
        assert _host_ops(backward) == [], backward.to_text()


def test_an_overlapping_average_pools_backward_stays_a_convolution():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9)

    def f(a):
        scale = torch.arange(25.0, device=a.device).view(5, 5)
        return (torch.nn.functional.avg_pool2d(a, 3, 2, 1) * scale).sum()

    want = x.clone().requires_grad_()
    f(want).backward()
    torch._dynamo.reset()
    backend.CACHE.clear()
    got = x.to("saturn:0").requires_grad_()
    torch.compile(f, backend="saturn", dynamic=False)(got).backward()
    torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-5, atol=1e-5)
    assert "conv" in [k.kind for k in _programs("saturn:0")[-1].kernels]
