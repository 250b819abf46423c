"""Every rule of ``rules/`` at special values: NaN, both infinities, both zeros, subnormals
and the largest finite values, in float16, bfloat16, float32 and float64.

A rule that changes which arithmetic runs (a simplification, a decomposition, a GEMM
epilogue, a pattern, a library call or a data-movement kernel standing for an op) has a
program here in which it fires (the test checks the saturation report), run compiled and
eagerly: NaN positions and signs of zero must be eager's (on the GPU eager CUDA's, or the
CPU's where ``EITHER`` names the case), other values within the dtype's rounding. Rules
that move values without computing (crossings, inlining, views on either side) and the
generated one-op placements (whose kernels ``test_special_values`` checks op by op) are
listed by ruleset with the reason; ``test_every_rule_is_covered`` fails for a new rule
that is in neither."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from saturn import backend, custom_ops
from saturn.eqsat.rules import rule_files, rule_owners

from .helpers import last_compiled
from .test_special_values import mismatches, specials

F = torch.nn.functional
HALVES = [torch.float16, torch.bfloat16]
WIDE = [torch.float32, torch.float64]
FLOATS = [*HALVES, *WIDE]
ORDINARY = [1.0, -2.0, 0.5, 3.0, -0.25, 1.5, -1.0]


def flat(dtype: torch.dtype) -> list[torch.Tensor]:
    return [specials(dtype)]


def rows(dtype: torch.dtype, width: int = 4) -> torch.Tensor:
    """One special value per row among ordinary ones, and rows of zeros, of -0.0, of both
    infinities and of the largest values: the edges of every reduction along the last axis."""
    s = specials(dtype).double().tolist()
    big = torch.finfo(dtype).max
    out = [[v, *ORDINARY[: width - 1]] for v in s]
    out += [[0.0] * width, [-0.0] * width, [float("inf"), float("-inf"), *ORDINARY[: width - 2]]]
    out += [[big] * width, [-big, big, *ORDINARY[: width - 2]]]
    return torch.tensor(out, dtype=torch.float64).to(dtype)


def ints(dtype: torch.dtype) -> list[torch.Tensor]:
    i = torch.iinfo(dtype)
    return [torch.tensor([i.min, i.min + 1, -1, 0, 1, i.max - 1, i.max], dtype=dtype)]


def weight(dtype: torch.dtype, n: int, zeros: bool = True) -> torch.Tensor:
    w = torch.tensor([0.5, -1.5, 2.0, -0.0, 1.0, 0.0][:n] if zeros else ORDINARY[:n])
    return w.to(dtype)


def matrices(dtype: torch.dtype) -> list[torch.Tensor]:
    """A [21, 4] matrix of special rows and a [4, 3] one with a zero and a -0.0 column."""
    b = torch.tensor([[1.0, 0.0, -0.0], [-2.0, 0.0, -0.0], [0.5, 0.0, -0.0], [1.0, 0.0, 0.0]])
    return [rows(dtype), b.to(dtype)]


def linear(dtype: torch.dtype) -> list[torch.Tensor]:
    a, b = matrices(dtype)
    return [a, b.t().contiguous(), torch.tensor([0.0, -0.0, 1.0]).to(dtype)]


def linear3d(dtype: torch.dtype) -> list[torch.Tensor]:
    a, w, bias = linear(dtype)
    return [a[:20].reshape(4, 5, 4), w, bias]


def images(dtype: torch.dtype) -> list[torch.Tensor]:
    x = rows(dtype, 4)[:16].reshape(2, 2, 4, 4)
    w = torch.tensor([1.0, -0.5, 0.0, -0.0] * 9).reshape(2, 2, 3, 3).to(dtype)
    return [x, w, torch.tensor([0.0, -0.0]).to(dtype)]


def batch_norm_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    x = rows(dtype, 4)[:16].reshape(2, 2, 4, 4)
    return [
        x,
        *(torch.tensor(v).to(dtype) for v in ([0.5, -0.0], [1.0, 0.0], [2.0, -1.0], [0.0, 1.0])),
    ]


def table(dtype: torch.dtype) -> list[torch.Tensor]:
    return [rows(dtype), torch.tensor([0, 20, 3, 3, -1, 1])]


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_written(x):  # Hugging Face's NewGELUActivation
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def conv_grads(dtype: torch.dtype) -> list[torch.Tensor]:
    """The output's gradient and the image (special rows among ordinary ones), a weight."""
    g = rows(dtype, 4)[:16].reshape(2, 2, 4, 4)
    x = rows(dtype, 4).flip(0)[:16].reshape(2, 2, 4, 4)
    return [g, x, images(dtype)[1]]


def _conv_grads(g, x, w, which: int) -> torch.Tensor:
    mask = [which == 0, which == 1, False]
    grads = torch.ops.aten.convolution_backward(
        g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask
    )
    return grads[which]


@dataclass
class Case:
    fn: Callable
    inputs: Callable[[torch.dtype], list[torch.Tensor]]
    dtypes: list[torch.dtype]
    gpu_only: bool = False  # the rule's guard admits the device's dtypes only there
    options: dict | None = None
    rtol: float | None = None  # a reduction's or a product's rounding, where wider
    sums: bool = False  # a product: elements whose sum of magnitudes overflows are not
    # compared (whether a partial sum overflows depends on the order of the additions,
    # the library's and PyTorch's differ: a row of the largest float64 times (1, -2, .5, 1)
    # is max/2 in eager and inf through cuBLASLt)


def _n(x):
    return x * 1  # a consumer, so the rule's result is not itself the graph output


CASES: dict[str, Case] = {
    # simplify
    "mul-one-right": Case(lambda x: x * 1.0, flat, FLOATS),
    "mul-one-left": Case(lambda x: torch.mul(1.0, x), flat, FLOATS),
    "div-one": Case(lambda x: x / 1.0, flat, FLOATS),
    "div-power-of-two": Case(
        lambda x: torch.stack((x / 8.0, x / -0.25, x / 16384.0)), flat, FLOATS
    ),
    "add-negzero-float": Case(lambda x: x + -0.0, flat, FLOATS),
    "add-zero-int": Case(lambda x: (x + 0) * 3, ints, [torch.int32, torch.int64]),
    "add-zero-int-left": Case(lambda x: torch.add(0, x) * 3, ints, [torch.int32, torch.int64]),
    "sub-zero": Case(lambda x: x - 0.0, flat, FLOATS),
    "neg-neg": Case(lambda x: torch.neg(-x), flat, FLOATS),
    "relu-idempotent": Case(lambda x: torch.relu(torch.relu(x)) * 2, flat, FLOATS),
    "cast-same": Case(lambda x: torch.neg(x.clone()), flat, FLOATS),
    "view-view": Case(lambda x: x.view(17, 1).view(1, 17) * 2, flat, FLOATS),
    "neg-below-slice": Case(lambda x: (-x)[3:11] * 2, flat, FLOATS),
    "neg-below-view": Case(lambda x: (-x).view(17, 1) * 2, flat, FLOATS),
    "neg-below-expand": Case(lambda x: (-x).expand(3, 17) * 2, flat, FLOATS),
    "neg-below-permute": Case(lambda x: (-x.view(1, 17)).t() * 2, flat, FLOATS),
    # decompose
    "softmax": Case(lambda x: F.softmax(x, -1), lambda d: [rows(d)], WIDE),
    "log-softmax": Case(lambda x: F.log_softmax(x, -1), lambda d: [rows(d)], WIDE),
    "layer-norm": Case(
        lambda x, w, b: F.layer_norm(x, (4,), w, b),
        lambda d: [rows(d), weight(d, 4), weight(d, 4)[[1, 0, 3, 2]]],
        WIDE,
        rtol=1e-5,
    ),
    "batch-norm-inference": Case(
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        batch_norm_inputs,
        WIDE,
    ),
    "var-population": Case(
        lambda x: x.var(-1, unbiased=False), lambda d: [rows(d)], [torch.float32]
    ),
    "softmax-half": Case(lambda x: F.softmax(x, -1), lambda d: [rows(d)], HALVES, True),
    "log-softmax-half": Case(lambda x: F.log_softmax(x, -1), lambda d: [rows(d)], HALVES, True),
    "layer-norm-half": Case(
        lambda x, w, b: F.layer_norm(x, (4,), w, b),
        lambda d: [rows(d), weight(d, 4), weight(d, 4)[[1, 0, 3, 2]]],
        HALVES,
        True,
    ),
    "batch-norm-inference-half": Case(
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        batch_norm_inputs,
        HALVES,
        True,
    ),
    "sum-half": Case(lambda x: x.sum(-1), lambda d: [rows(d)], HALVES, True),
    "mean-half": Case(lambda x: x.mean(-1), lambda d: [rows(d)], HALVES, True),
    "amax-half": Case(lambda x: x.amax(-1), lambda d: [rows(d)], HALVES, True),
    "amin-half": Case(lambda x: x.amin(-1), lambda d: [rows(d)], HALVES, True),
    "var-half": Case(
        lambda x: x.var(-1, unbiased=False), lambda d: [rows(d)], HALVES, True, rtol=1e-2
    ),
    # gemm
    "place-mm": Case(lambda a, b: a @ b, matrices, FLOATS, True, sums=True),
    "place-bmm": Case(
        lambda a, b: torch.bmm(a[:21].view(3, 7, 4), b.expand(3, 4, 3)),
        matrices,
        FLOATS,
        True,
        sums=True,
    ),
    "place-addmm": Case(F.linear, linear, FLOATS, True, sums=True),
    "mm-plus-bias": Case(lambda a, w, b: a @ w.t() + b, linear, WIDE, True, sums=True),
    "bias-plus-mm": Case(lambda a, w, b: b + a @ w.t(), linear, WIDE, True, sums=True),
    "epilogue-relu": Case(
        lambda a, w, b: torch.relu(F.linear(a, w, b)), linear, WIDE, True, sums=True
    ),
    # cuBLASLt's GELU epilogue: within 5e-6 of PyTorch's formula (see gemm.egg)
    "epilogue-gelu-tanh": Case(
        lambda a, w, b: F.gelu(F.linear(a, w, b), approximate="tanh"),
        linear,
        [torch.float32],
        True,
        rtol=1e-5,
        sums=True,
    ),
    "relu-through-view": Case(
        lambda a, w, b: torch.relu(F.linear(a, w, b)), linear3d, WIDE, True, sums=True
    ),
    "gelu-tanh-through-view": Case(
        lambda a, w, b: F.gelu(F.linear(a, w, b), approximate="tanh"),
        linear3d,
        [torch.float32],
        True,
        rtol=1e-5,
        sums=True,
    ),
    "place-conv": Case(lambda x, w, b: F.conv2d(x, w, b, padding=1), images, WIDE, True, sums=True),
    # halves on the GPU too (cuDNN, float32 accumulation); a half bias is an add after it
    "place-conv-nobias": Case(
        lambda x, w, b: F.conv2d(x, w, padding=1), images, FLOATS, True, sums=True
    ),
    # a convolution's gradients, cuDNN's on GPU targets (the importer writes them out for
    # saturn:0): special values in the output's gradient and in the image
    "place-conv-input-grad": Case(
        lambda g, x, w: _n(_conv_grads(g, x, w, 0)), conv_grads, FLOATS, True, sums=True
    ),
    "place-conv-weight-grad": Case(
        lambda g, x, w: _n(_conv_grads(g, x, w, 1)), conv_grads, FLOATS, True, sums=True
    ),
    # gather: data movement kernels standing for PyTorch's ops
    "place-take": Case(lambda t, i: _n(t[i]), table, WIDE),
    "place-cat": Case(lambda x: _n(torch.cat([x, x[:3] * 2])), flat, WIDE),  # 20 pieces: Cat
    "place-pad": Case(lambda x: _n(F.pad(x, (1, 2), value=-0.0)), flat, WIDE),
    "place-index-add": Case(lambda t, i: t.index_add(0, i.remainder(21), t[:6] * 2), table, WIDE),
    # patterns (opt-in)
    "rmsnorm": Case(
        rms, lambda d: [rows(d), weight(d, 4)], WIDE, options={"rewrites": ["patterns"]}
    ),
    "rmsnorm-w-left": Case(
        lambda x, w: w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)),
        lambda d: [rows(d), weight(d, 4)],
        WIDE,
        options={"rewrites": ["patterns"]},
    ),
    "rmsnorm-rsqrt-left": Case(
        lambda x, w: torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * x * w,
        lambda d: [rows(d), weight(d, 4)],
        WIDE,
        options={"rewrites": ["patterns"]},
    ),
    "gelu-tanh-as-traced": Case(gelu_written, flat, WIDE, options={"rewrites": ["patterns"]}),
    "place-rmsnorm": Case(  # the kernel is float32; float64 keeps the written-out ops
        rms,
        lambda d: [rows(d), weight(d, 4)],
        [torch.float32],
        True,
        options={"rewrites": ["patterns"]},
    ),
}

# Rules whose left side torch never produces (PyTorch traces pow(x, 3) as (x * x) * x and
# puts a Python scalar on the right): written for text graphs, checked there with the
# numpy evaluator, the graph against the extracted program.
_GELU_POW = "(Add x (Mul (Scalar 0.044715 {d}) (Pow x (Scalar 3.0 {d}))))"
_GELU_T = f"(Tanh (Mul (Scalar 0.7978845608028654 {{d}}) {_GELU_POW}))"
TEXT_ONLY = {
    "gelu-tanh-written-out": (
        f"(Mul (Mul (Scalar 0.5 {{d}}) x) (Add (Scalar 1.0 {{d}}) {_GELU_T}))"
    ),
    "gelu-tanh-written-out-swapped": (
        f"(Mul (Mul x (Scalar 0.5 {{d}})) (Add {_GELU_T} (Scalar 1.0 {{d}})))"
    ),
}

# Rulesets whose rules compute no value: what each does instead, and why that is exact.
NOT_COMPUTING = {
    "fusion": "crossings (copies), their injectivity, re-reading a loop's body instead of its "
    "stored result, and views, expands, permutes and slices on either side of a crossing: "
    "the same bits, moved",
    "placement": "one op's device variant: the kernel computes the op's own scalar expression, "
    "checked op by op at special values in test_special_values.py",
    "analysis": "types, ranks and value ranges: facts, no values",
}


# an elementwise op with a scalar, read through each movement op (simplify's
# <op>-scalar-above-<move> and scalar-<op>-above-<move>; c / x imports as a reciprocal)
_MOVES = {
    "view": lambda t: t.view(17, 1),
    "expand": lambda t: t.expand(3, 17),
    "permute": lambda t: t.view(1, 17).t(),
    "slice": lambda t: t[3:11],
}
_WITH_SCALAR = {
    "add": (lambda t: t + 2.5, lambda t: torch.add(2.5, t)),
    "sub": (lambda t: t - 2.5, lambda t: 2.5 - t),
    "mul": (lambda t: t * -0.5, lambda t: torch.mul(-0.5, t)),
    "div": (lambda t: t / 3.0, None),
}
for _op, (_right, _left) in _WITH_SCALAR.items():
    for _mv, _move in _MOVES.items():
        CASES[f"{_op}-scalar-above-{_mv}"] = Case(
            lambda x, f=_right, m=_move: f(m(x)), flat, FLOATS
        )
        if _left is not None:
            CASES[f"scalar-{_op}-above-{_mv}"] = Case(
                lambda x, f=_left, m=_move: f(m(x)), flat, FLOATS
            )


def test_var_population_declines_float64():
    """PyTorch's float64 variance of values near the largest float64 is finite where the
    mean of the decomposition overflows (four 1.7e308: 0 against inf): the rule declines
    and the op runs as PyTorch's."""
    x = torch.full((2, 4), torch.finfo(torch.float64).max, dtype=torch.float64)
    torch._dynamo.reset()
    g = torch.compile(
        lambda x: x.var(-1, unbiased=False),
        backend="saturn",
        dynamic=False,
        options={"device": "saturn:0"},
    )
    got = g(x.to("saturn:0")).cpu()
    assert not last_compiled().compiled.report.rule_totals().get("var-population", 0)
    assert torch.equal(got, x.var(-1, unbiased=False)), got


def test_every_rule_is_covered():
    rules = rule_owners(rule_files())  # every named rule of rules/, with its ruleset
    assert len(rules) > 100, sorted(rules)  # the parse found the rule files' names
    covered = {**CASES, **TEXT_ONLY}
    missing = [r for r, rs in rules.items() if r not in covered and rs not in NOT_COMPUTING]
    assert not missing, f"rules with no special-value case: {missing}"
    stale = [r for r in covered if r not in rules]
    assert not stale, f"cases for rules that do not exist: {stale}"


# Rules whose rows are statistics (a mean, a variance) of the row's values. Where the sum of
# a row's magnitudes exceeds the dtype's largest value, PyTorch's answer depends on its
# kernel's algorithm and accumulator: Welford or two passes, float32 or float64 partial
# sums, their order; its CPU and CUDA kernels disagree there (layer_norm of four 1.7e308
# in float64: NaN on the CPU, the bias on CUDA; var of [-max, max, 1, -2] in float64: NaN
# and inf). saturn's mean is a sum (float64-accumulated on saturn:0, float32 on the GPU)
# divided by the count, so such rows are not compared; every other row is.
STATISTICS = {
    "layer-norm",
    "var-population",
    "layer-norm-half",
    "var-half",
    "rmsnorm",
    "rmsnorm-w-left",
    "rmsnorm-rsqrt-left",
    "place-rmsnorm",
}


def _overflowing_rows(x: torch.Tensor) -> torch.Tensor:
    total = x.double().abs().sum(-1, keepdim=True)
    return total > torch.finfo(x.dtype).max


def _mismatch(got: torch.Tensor, want: torch.Tensor, rtol: float | None) -> torch.Tensor:
    if rtol is None or not got.dtype.is_floating_point:
        return mismatches(got, want)
    g, w = got.cpu().double(), want.cpu().double()
    bad = mismatches(got, want)  # NaN positions and zero signs stay exact
    near = (g - w).abs() <= rtol * (1 + w.abs())
    return bad & ~(near & ~g.isnan() & ~w.isnan() & ~((g == 0) & (w == 0)))


PARAMS = [
    pytest.param(rule, dtype, id=f"{rule}-{str(dtype).split('.')[-1]}")
    for rule, case in CASES.items()
    for dtype in case.dtypes
]


@pytest.mark.parametrize("rule, dtype", PARAMS)
def test_rule_at_special_values(dev, rule, dtype, monkeypatch):
    case = CASES[rule]
    if case.gpu_only and dev == "saturn:0":
        pytest.skip("the rule's guard admits this only on a GPU device")
    # saturn's own rules, not a library op that replaces an ATen op on GPU targets (once
    # saturn.library is imported, its softmax takes aten._softmax before any rule runs)
    monkeypatch.setattr(custom_ops, "replacement_for", lambda target: None)
    args = case.inputs(dtype)
    torch._dynamo.reset()
    options = {"device": dev, **(case.options or {})}
    g = torch.compile(case.fn, backend="saturn", options=options, dynamic=False)
    before = len(backend.CACHE.fallbacks)
    with torch.no_grad():
        got = g(*[a.to(dev) for a in args]).cpu()
        assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
        totals = last_compiled().compiled.report.rule_totals()
        want = case.fn(*args)
        assert totals.get(rule), f"{rule} did not fire: the case no longer tests it: {totals}"
        bad = _mismatch(got, want, case.rtol)
        if dev != "saturn:0":  # eager CUDA's answer is as good as the CPU's
            cuda = case.fn(*[a.to("cuda") for a in args]).cpu()
            bad &= _mismatch(got, cuda, case.rtol)
    if case.sums:
        with torch.no_grad():
            bound = case.fn(*[a.double().abs() if a.is_floating_point() else a for a in args])
        bad &= ~(bound > torch.finfo(dtype).max)
    if rule in STATISTICS:
        over = _overflowing_rows(args[0])
        bad &= ~over.reshape(over.shape[:-1]) if bad.dim() < over.dim() else ~over
    if bad.any():
        where = bad.nonzero()[:6].tolist()
        pytest.fail(
            f"{rule} {dtype}: at {where}:\n saturn {got[bad][:6].tolist()}\n"
            f" eager  {want[bad][:6].tolist()}"
        )


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("rule", sorted(TEXT_ONLY))
def test_text_only_rule_at_special_values(rule, dtype):
    import numpy as np

    from saturn.eqsat.evaluate import eval_graph, eval_program
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph

    term = TEXT_ONLY[rule].format(d=dtype)
    graph = parse_graph(f"(input x {dtype} [17])\n(let r {term})\n(output r)\n")
    compiled = compile_graph(graph, rewrites=["patterns"])
    assert compiled.report.rule_totals().get(rule, 0), f"{rule} did not fire"
    torch_dtype = torch.float32 if dtype == "f32" else torch.float64
    x = {"x": specials(torch_dtype).numpy()}
    (want,) = eval_graph(graph, x)
    (got,) = eval_program(compiled.program, x)
    with np.errstate(all="ignore"):
        bad = mismatches(torch.from_numpy(np.asarray(got)), torch.from_numpy(np.asarray(want)))
    assert not bad.any(), f"{rule}: at {bad.nonzero().flatten().tolist()}: {got} against {want}"


@pytest.mark.parametrize(
    "rule, act, dtype, fires",
    [
        ("epilogue-relu", "Relu", "f32", True),
        ("epilogue-relu", "Relu", "bf16", False),  # the half epilogue turns NaN into 0
        ("epilogue-relu", "Relu", "f16", False),
        ("epilogue-gelu-tanh", "GeluTanh", "f32", True),
        ("epilogue-gelu-tanh", "GeluTanh", "f64", False),  # float32-accurate only
    ],
)
def test_gemm_epilogue_fires_or_declines(rule, act, dtype, fires):
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph

    graph = parse_graph(
        f"(input a {dtype} [8 4])\n(input w {dtype} [4 3])\n(input b {dtype} [3])\n"
        f"(let m (Addmm b a w))\n(let r ({act} m))\n(output r)\n"
    )
    compiled = compile_graph(graph, machine="gpu", io_on_device=True)
    totals = compiled.report.rule_totals()
    assert totals.get("place-addmm", 0), "the GEMM is not placed: the case tests nothing"
    assert bool(totals.get(rule, 0)) == fires, totals.get(rule, 0)


def test_builtin_pattern_kernels_resolve_in_a_fresh_process():
    """The custom kernel the built-in RMSNorm pattern names is found although nothing
    imported saturn.library first (on the GPU every RMSNorm graph once ran uncompiled)."""
    import subprocess
    import sys

    code = (
        "import saturn\nfrom saturn.custom_ops import resolve\n"
        "print(resolve('rmsnorm', {})[0].name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("saturn::rmsnorm"), out.stdout + out.stderr


@pytest.mark.parametrize(
    "dtype, c3, fires",
    [("f32", "0.044715", True), ("f32", "0.0447", False), ("bf16", "0.044715", False)],
)
def test_gelu_as_traced_fires_or_declines(dtype, c3, fires):
    """The traced tanh-GELU pattern matches its exact constants in float32/float64 only: a
    near-miss constant is another function, and a half type rounds after every op."""
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph

    s = f"(Scalar {{}} {dtype})"
    inner = f"(Add x (Mul (Mul (Mul x x) x) {s.format(c3)}))"
    tanh = f"(Tanh (Mul {inner} {s.format(0.7978845608028654)}))"
    term = f"(Mul (Mul x {s.format(0.5)}) (Add {tanh} {s.format(1.0)}))"
    graph = parse_graph(f"(input x {dtype} [8])\n(let r {term})\n(output r)\n")
    compiled = compile_graph(graph, rewrites=["patterns"], machine="gpu", io_on_device=True)
    assert bool(compiled.report.rule_totals().get("gelu-tanh-as-traced", 0)) == fires
