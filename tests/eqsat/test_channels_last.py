"""Half convolutions in channels-last memory (``eqsat/channels_last.py``) on GPU programs:
the convolution writes NHWC memory, the loops and pads around it run over the permuted
domain reading it packed, and the program's values are those of the program without the
pass, bit for bit (float16, which the numpy evaluator runs); float32 and grouped
convolutions are left as lowered."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat import evaluate as ev
from saturn.eqsat import pipeline
from saturn.eqsat.channels_last import Layouts, nhwc_ordered, packed_like
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph


def block(dtype: str = "f16", groups: int = 1) -> str:
    """conv, batch norm (eval: an affine map per channel), relu, a padded max pool, a
    second conv and a residual add: a ResNet stem and block, as the importer writes it."""
    cin = 8
    return (
        f"(input x {dtype} [2 {cin} 12 12])\n(param w1 {dtype} [8 {cin // groups} 3 3])\n"
        f"(param w2 {dtype} [8 8 3 3])\n(param m {dtype} [8 1 1])\n(param s {dtype} [8 1 1])\n"
        f"(let c1 (Conv2dNoBias x w1 [1 1] [1 1] [1 1] {groups}))\n"
        "(let a (Relu (Mul (Sub c1 m) s)))\n"
        "(let p (Pad a [0 0 0 0 1 1 1 1] -4503599627370496))\n"
        "(let c2 (Conv2dNoBias a w2 [1 1] [1 1] [1 1] 1))\n"
        "(let r (Add c2 a))\n(let q (Neg p))\n(output r q)\n"
    )


def programs(text: str):
    graph = parse_graph(text)
    real = pipeline.channels_last
    pipeline.channels_last = lambda p: p
    try:
        before = compile_graph(graph, machine="gpu", io_on_device=True).program
    finally:
        pipeline.channels_last = real
    after = compile_graph(graph, machine="gpu", io_on_device=True).program
    return graph, before, after


def same_values(graph, a, b) -> None:
    rng = np.random.default_rng(0)
    inputs = {
        n.name: rng.uniform(-1, 1, n.shape).astype(ev.np_dtype(n.dtype)) for n in graph.inputs()
    }
    for x, y in zip(ev.eval_program(a, inputs), ev.eval_program(b, inputs), strict=True):
        assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True)


def reads_as_laid_out(prog) -> None:
    """Every kernel operand read by its flat index (anything but "strided") lies packed:
    the values the evaluator compares cannot show a kernel reading NHWC memory as NCHW
    (numpy arrays carry their strides; a GPU kernel reading "same" does not)."""
    lay = Layouts()
    for s in prog.steps:
        for o in s.kernel.inputs if s.kernel is not None else ():
            if o.indexing not in ("strided", "scalar"):
                assert packed_like(o.shape, lay.strides[o.value]), (s.output, o)
        lay.add(s)


def test_half_convolutions_write_nhwc_memory_and_the_loops_follow():
    graph, before, after = programs(block())
    convs = [k for k in after.kernels if k.kind == "conv"]
    assert len(convs) == 2 and all(k.attrs.get("channels_last") for k in convs)
    assert all(k.shape == (2, 12, 12, 8) for k in convs)  # NHWC memory
    # the batch norm's loop runs over (N, H, W, C): the convolution's output packed, the
    # per-channel operands along the last axis
    (bn,) = [k for k in after.kernels if k.kind == "loop" and "relu" in str(k.body)]
    assert bn.domain == (2, 12, 12, 8)
    assert sorted(o.indexing for o in bn.inputs) == ["same", "trailing", "trailing"]
    (pad,) = [k for k in after.kernels if k.kind == "pad"]
    assert pad.shape == (2, 14, 14, 8) and pad.attrs["pads"] == (0, 0, 1, 1, 1, 1, 0, 0)
    # the image and the weights are copied into NHWC memory for cuDNN
    copies = [k for k in after.kernels if k.kind == "loop" and k.body == ("in", 0)]
    assert len(copies) == 3
    # the outputs are written packed (NCHW, as eager's), reading NHWC memory by strides
    for v in after.outputs:
        (step,) = [s for s in after.steps if s.output == v]
        assert step.kind == "kernel" and step.kernel.domain == step.shape
        assert {o.indexing for o in step.kernel.inputs} == {"strided"}
    same_values(graph, before, after)
    reads_as_laid_out(after)
    assert [s.shape for s in after.steps if s.output in after.outputs] == [
        s.shape for s in before.steps if s.output in before.outputs
    ]


def test_a_pointwise_convolutions_weight_lies_nhwc_already():
    """A packed [K, C, 1, 1] weight is NHWC memory too (its size-1 axes' strides aside):
    the 1x1 convolution reads it where it lies; only the 3x3 weight and the image are
    copied into NHWC memory."""
    text = block().replace("(param w2 f16 [8 8 3 3])", "(param w2 f16 [8 8 1 1])")
    text = text.replace("(Conv2dNoBias a w2 [1 1] [1 1]", "(Conv2dNoBias a w2 [1 1] [0 0]")
    graph, before, after = programs(text)
    convs = [k for k in after.kernels if k.kind == "conv"]
    assert len(convs) == 2 and all(k.attrs.get("channels_last") for k in convs)
    copies = [k for k in after.kernels if k.kind == "loop" and k.body == ("in", 0)]
    assert len(copies) == 2
    (c2,) = [k for k in convs if k.inputs[1].shape == (8, 8, 1, 1)]
    (w2,) = [s for s in after.steps if s.output == c2.inputs[1].value]
    assert w2.kind == "input"  # the parameter itself, no copy or view
    same_values(graph, before, after)
    reads_as_laid_out(after)


@pytest.mark.parametrize(("dtype", "kernel"), [("f16", 7), ("f16", 3), ("f32", 7)])
def test_a_depthwise_convolution_of_nhwc_memory_stays_there_if_its_kernel_is_large(dtype, kernel):
    """ConvNeXt's 7x7 depthwise convolution reads the NHWC output of the convolution before
    it where it lies and writes NHWC memory in turn; a 3x3 one (MobileNet's, EfficientNet's)
    writes NCHW, so that the layout does not travel on to kernels that cannot take it
    (``channels_last``'s docstring), and so does a float32 one (no NHWC anywhere)."""
    pad = kernel // 2
    nhwc = dtype == "f16" and kernel == 7
    text = (
        f"(input x {dtype} [2 8 12 12])\n(param w1 {dtype} [8 8 1 1])\n"
        f"(param w2 {dtype} [8 1 {kernel} {kernel}])\n"
        "(let c1 (Conv2dNoBias x w1 [1 1] [0 0] [1 1] 1))\n"
        f"(let c2 (Conv2dNoBias c1 w2 [1 1] [{pad} {pad}] [1 1] 8))\n"
        "(let o (Neg c2))\n(output o)\n"
    )
    graph, before, after = programs(text)
    dw = next(k for k in after.kernels if k.kind == "conv" and k.attrs["groups"] == 8)
    assert bool(dw.attrs.get("channels_last")) == nhwc
    assert dw.shape == ((2, 12, 12, 8) if nhwc else (2, 8, 12, 12))
    copies = [k for k in after.kernels if k.kind == "loop" and k.body == ("in", 0)]
    # the image's (the runner packs the 3x3's image for cuDNN); float32: none at all
    assert len(copies) == (dtype == "f16")
    same_values(graph, before, after)
    reads_as_laid_out(after)


@pytest.mark.parametrize(("dtype", "groups"), [("f32", 1), ("f16", 8), ("f16", 2)])
def test_declines_float32_and_grouped_convolutions(dtype, groups):
    graph, before, after = programs(block(dtype, groups))
    first = next(k for k in after.kernels if k.kind == "conv")
    assert not first.attrs.get("channels_last")
    if dtype == "f32":
        assert before.to_text() == after.to_text()
    same_values(graph, before, after)
    reads_as_laid_out(after)


def test_a_roll_between_convolutions_runs_over_nhwc_memory():
    """A roll of a half convolution's output along H and W (a shifted window), read by the
    next convolution: the roll kernel copies NHWC memory with its shifts permuted to
    (N, H, W, C) (``KindSpec.permuted``), the next convolution reads it there, and the
    values are the NCHW program's, bit for bit. A roll along the channels too."""
    for shifts, nhwc in (("[0 0 3 5]", (0, 3, 5, 0)), ("[0 2 3 0]", (0, 3, 0, 2))):
        text = (
            "(input x f16 [2 8 12 12])\n(param w1 f16 [8 8 3 3])\n(param w2 f16 [8 8 3 3])\n"
            "(let c1 (Conv2dNoBias x w1 [1 1] [1 1] [1 1] 1))\n"
            f"(let r (Roll c1 {shifts}))\n"
            "(let c2 (Conv2dNoBias r w2 [1 1] [1 1] [1 1] 1))\n(let o (Neg c2))\n(output o)\n"
        )
        graph, before, after = programs(text)
        (roll,) = [k for k in after.kernels if k.kind == "roll"]
        assert roll.shape == (2, 12, 12, 8) and roll.attrs["shifts"] == nhwc
        assert all(k.attrs.get("channels_last") for k in after.kernels if k.kind == "conv")
        same_values(graph, before, after)
        reads_as_laid_out(after)


def test_nhwc_order_by_strides():
    assert nhwc_ordered((2, 8, 12, 12), (1152, 1, 96, 8))  # channels-last
    assert not nhwc_ordered((2, 8, 12, 12), (1152, 144, 12, 1))  # NCHW
    assert nhwc_ordered((2, 8, 6, 6), (1152, 1, 192, 16))  # a strided slice of one
    assert not nhwc_ordered((2, 1, 12, 12), (144, 144, 12, 1))  # one channel
    assert not nhwc_ordered((2, 8, 12, 12), (0, 1, 96, 8))  # broadcast


def test_declines_a_convolution_whose_image_is_neither_an_input_nor_nhwc():
    """Channels-last starts at the program's input: a half convolution reading a loop's
    NCHW output (here a ReLU of the input) stays NCHW rather than paying a copy into
    NHWC memory for it."""
    text = (
        "(input x f16 [2 8 12 12])\n(param w f16 [8 8 3 3])\n"
        "(let c (Conv2dNoBias (Relu x) w [1 1] [1 1] [1 1] 1))\n(let r (Neg c))\n(output r)\n"
    )
    _, before, after = programs(text)
    (conv,) = [k for k in after.kernels if k.kind == "conv"]
    assert not conv.attrs.get("channels_last")
    assert before.to_text() == after.to_text()


def fire(dtype: str = "f16") -> str:
    """SqueezeNet's Fire module: a 1x1 squeeze, two expands (1x1 and 3x3) joined along the
    channels as the importer writes a concatenation (equal pieces on a new axis, picked
    by a where, viewed back), and the next squeeze reading the join."""
    return (
        f"(input x {dtype} [2 8 6 6])\n(param ws {dtype} [4 8 1 1])\n"
        f"(param we {dtype} [8 4 1 1])\n(param wt {dtype} [8 4 3 3])\n"
        f"(param wn {dtype} [4 16 1 1])\n"
        "(let s (Relu (Conv2dNoBias x ws [1 1] [0 0] [1 1] 1)))\n"
        "(let a (Relu (Conv2dNoBias s we [1 1] [0 0] [1 1] 1)))\n"
        "(let b (Relu (Conv2dNoBias s wt [1 1] [1 1] [1 1] 1)))\n"
        "(let at (View (Arange 0 1 2 i64) [1 2 1 1 1]))\n"
        "(let pa (Expand (View a [2 1 8 6 6]) [2 2 8 6 6]))\n"
        "(let pb (Expand (View b [2 1 8 6 6]) [2 2 8 6 6]))\n"
        "(let cat (View (Where (Eq at (Scalar 0 i64)) pa pb) [2 16 6 6]))\n"
        "(let y (Conv2dNoBias cat wn [1 1] [0 0] [1 1] 1))\n(let z (Relu y))\n(output z)\n"
    )


def test_a_channel_concatenation_of_nhwc_memory_writes_nhwc_memory():
    """The join of two NHWC convolution results runs over [N, H, W, P, C]: it reads both
    packed and writes NHWC memory of P * C channels, which the next convolution reads
    where it lies (no copy into NHWC, no layout conversion by cuDNN)."""
    graph, before, after = programs(fire())
    same_values(graph, before, after)
    reads_as_laid_out(after)
    convs = [k for k in after.kernels if k.kind == "conv"]
    assert len(convs) == 4 and all(k.attrs.get("channels_last") for k in convs), after.to_text()
    joins = [k for k in after.kernels if k.kind == "loop" and len(k.shape) == 5]
    assert len(joins) == 1 and tuple(joins[0].shape) == (2, 6, 6, 2, 8), after.to_text()
    # copied into NHWC: the model's input and the 3x3 weight only (the join is not)
    copies = [k for k in after.kernels if k.kind == "loop" and k.body == ("in", 0)]
    assert len(copies) == 2, after.to_text()


def test_a_channel_shuffle_is_not_taken_for_a_concatenation():
    """ShuffleNet's shuffle reads [N, C/g, g, H, W] across its pieces: its operand's
    strides do not decrease along [N, H, W, P, C], so the loop keeps its order."""
    text = (
        "(input x f16 [2 8 6 6])\n(param w f16 [8 8 1 1])\n(param w2 f16 [8 8 1 1])\n"
        "(let c (Relu (Conv2dNoBias x w [1 1] [0 0] [1 1] 1)))\n"
        "(let t (Permute (View c [2 2 4 6 6]) [0 2 1 3 4]))\n"
        "(let s (View (Neg t) [2 8 6 6]))\n"
        "(let y (Conv2dNoBias s w2 [1 1] [0 0] [1 1] 1))\n(output y)\n"
    )
    graph, before, after = programs(text)
    same_values(graph, before, after)
    reads_as_laid_out(after)
    assert not any(
        k.kind == "loop" and len(k.shape) == 5 and tuple(k.shape) != (2, 4, 2, 6, 6)
        for k in after.kernels
    ), after.to_text()


def test_a_float32_concatenation_keeps_its_order():
    """Float32 convolutions keep NCHW, so the join's pieces do not lie NHWC: left as is."""
    _graph, before, after = programs(fire("f32"))
    assert after.to_text() == before.to_text()
