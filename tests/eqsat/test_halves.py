"""Half types in the compiler (decision 0032): on a GPU target every elementwise op on
float16/bfloat16 rounds its result to the type inside the fused loop (as eager rounds each
op's result), products are library GEMMs; rules that would merge two rounded ops decline
there and fire on float32; the CPU reference target keeps half ops on the host."""

from __future__ import annotations

import pytest

from saturn.eqsat.graph import parse_graph
from saturn.eqsat.memory import plan_memory
from saturn.eqsat.pipeline import compile_graph


def compiled(text: str, machine: str = "gpu"):
    graph = parse_graph(text)
    return compile_graph(graph, machine=machine, io_on_device=machine == "gpu")


def kernels(c) -> list:
    return [s.kernel for s in c.program.steps if getattr(s, "kernel", None) is not None]


def casts(body) -> int:
    """How many roundings (casts to a half type) a loop body holds."""
    if not isinstance(body, tuple):
        return 0
    here = body[0] == "cast" and body[-1] in ("f16", "bf16")
    return here + sum(casts(b) for b in body[1:])


CHAIN = """(input x {d} [64 32])
(input y {d} [64 32])
(let a (Add x y))
(let r (Mul a (Exp a)))
(output r)
"""


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_fused_half_chain_rounds_after_every_op(dtype):
    c = compiled(CHAIN.format(d=dtype))
    (k,) = kernels(c)
    assert k.kind == "loop" and c.program.count("host") == 0
    # add (inlined into both of its readers), exp, mul: each rounded as eager rounds it
    assert k.body[0] == "cast" and k.body[-1] == dtype
    assert casts(k.body) == 4, k.body
    # the executor's memory plan sizes half values at two bytes an element
    plan = plan_memory(c.program)
    assert plan.size >= 64 * 32 * 2 and not plan.overlaps()


def test_a_float32_chain_has_no_roundings():
    (k,) = kernels(compiled(CHAIN.format(d="f32")))
    assert casts(k.body) == 0


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_cpu_reference_target_keeps_halves_on_the_host(dtype):
    c = compiled(CHAIN.format(d=dtype), machine="cpu-reference")
    assert not kernels(c) and c.program.count("host") == 3


LINEAR = """(input x {d} [8 32])
(input w {d} [32 16])
(input c {d} [16])
(let m (MatMul x w))
(let r ({act} (Add m c)))
(output r)
"""


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mm_plus_bias_declines_on_halves_and_fires_on_float32(dtype):
    # eager rounds the product, then the sum; a bias epilogue would round once
    half = kernels(compiled(LINEAR.format(d=dtype, act="Neg")))
    assert [k.kind for k in half] == ["gemm", "loop"]
    assert half[0].attrs["epilogue"] == "none"
    wide = kernels(compiled(LINEAR.format(d="f32", act="Neg")))
    assert (wide[0].kind, wide[0].attrs["epilogue"]) == ("gemm", "bias")


ADDMM = """(input x {d} [8 32])
(input w {d} [32 16])
(input c {d} [16])
(let r ({act} (Addmm c x w)))
(output r)
"""


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_epilogues_decline(dtype):
    # cuBLASLt's half ReLU epilogue turns NaN into 0 (measured on the H200); GELU does not
    # commute with rounding: both run as a loop after the bias epilogue
    relu = kernels(compiled(ADDMM.format(d=dtype, act="Relu")))
    assert [(k.kind, k.attrs.get("epilogue")) for k in relu] == [("gemm", "bias"), ("loop", None)]
    gelu = kernels(compiled(ADDMM.format(d=dtype, act="GeluTanh")))
    assert [(k.kind, k.attrs.get("epilogue")) for k in gelu] == [("gemm", "bias"), ("loop", None)]
    wide = kernels(compiled(ADDMM.format(d="f32", act="GeluTanh")))
    assert [(k.kind, k.attrs.get("epilogue")) for k in wide] == [("gemm", "gelu_bias")]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["(Softmax x 1)", "(LogSoftmax x 1)", "(LayerNorm x w b [1] 1e-5)"])
def test_a_half_norm_is_the_float32_op_rounded_once(dtype, op):
    # PyTorch computes these in float32 and rounds once: decomposed in the half type, each
    # op would round; as the float32 op of the widened input they run on the device
    text = f"(input x {dtype} [4 8])\n(input w {dtype} [8])\n(input b {dtype} [8])\n"
    c = compiled(text + f"(let r {op})\n(output r)\n")
    (k,) = kernels(c)  # one rows kernel: float32 stages, the result rounded once
    assert k.kind == "rows" and c.program.count("host") == 0
    assert all(st.dtype == "f32" for st in k.stages) and k.dtype == dtype
    assert k.body[0] == "cast" and casts(k.body) == 1
    host = compiled(text + f"(let r {op})\n(output r)\n", machine="cpu-reference")
    assert not kernels(host) and host.program.count("host") == 1


def test_conversions_between_half_and_float32_run_on_the_device():
    c = compiled("(input x bf16 [64])\n(let r (Cast (Cast x f32) f16))\n(output r)\n")
    (k,) = kernels(c)
    assert k.kind == "loop" and c.program.count("host") == 0


def test_a_float32_layer_norm_of_a_half_input_is_one_rows_kernel_reading_it():
    # the row's stages read the half operand into float32 (widening is exact)
    text = """(input x bf16 [16 64])
(input w f32 [64])
(input b f32 [64])
(let r (LayerNorm (Cast x f32) w b [1] 1e-5))
(output r)
"""
    (k,) = kernels(compiled(text))
    assert k.kind == "rows" and k.dtype == "f32" and k.inputs[0].dtype == "bf16"
    assert [st.dtype for st in k.stages] == ["f32", "f32"]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["Sum", "Mean", "Amax", "Amin"])
def test_half_reductions_accumulate_in_float32_and_round_once(dtype, op):
    c = compiled(f"(input x {dtype} [8 64])\n(let r ({op} x [1] 0))\n(output r)\n")
    ks = kernels(c)
    assert c.program.count("host") == 0
    (red,) = [k for k in ks if k.kind == "reduce"]
    assert red.inputs[0].dtype == dtype and red.attrs.get("acc_dtype", red.dtype) == "f32"
    (last,) = [k for k in ks if k.dtype == dtype]
    assert casts(last.body) + casts(last.epilogue) == 1
    host = compiled(
        f"(input x {dtype} [8 64])\n(let r ({op} x [1] 0))\n(output r)\n", "cpu-reference"
    )
    assert not kernels(host)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_half_variance_is_the_float32_one_rounded_once(dtype):
    text = f"(input x {dtype} [8 64])\n(let r (Var x [1] 0 0))\n(output r)\n"
    c = compiled(text)
    assert c.program.count("host") == 0, c.program.to_text()
    assert c.report.rule_totals().get("var-half", 0) >= 1
    ks = kernels(c)
    assert all(k.inputs[0].dtype in (dtype, "f32") for k in ks)
    (last,) = [k for k in ks if k.dtype == dtype]
    assert casts(last.body) + casts(last.epilogue) == 1
    assert not kernels(compiled(text, "cpu-reference"))  # no half kernels there: declines
    wide = compiled("(input x f32 [8 64])\n(let r (Var x [1] 0 0))\n(output r)\n")
    assert wide.report.rule_totals().get("var-half", 0) == 0


def test_a_half_product_reduction_stays_on_the_host():
    # no float32 form for prod: PyTorch's half prod is not asserted to widen (declines)
    c = compiled("(input x bf16 [8 64])\n(let r (Prod x [1] 0))\n(output r)\n")
    assert not kernels(c) and c.program.count("host") == 1
