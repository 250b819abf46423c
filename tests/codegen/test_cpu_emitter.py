"""The CPU emitter runs every loop and reduction kernel of the golden programs and matches
the numpy reference evaluator, on random inputs with NaN, infinities and both zeros."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.codegen import cpu
from saturn.eqsat import evaluate as ev
from saturn.eqsat.graph import load_graph
from saturn.eqsat.pipeline import compile_graph

from ..eqsat.golden_runner import GOLDEN, options

CASES = [p for p in sorted(GOLDEN.glob("*.graph"))]


def run_program_with_cpu_kernels(prog, inputs):
    env = {}
    by_input = {v: k for k, v in prog.inputs.items()}
    ran = 0
    for s in prog.steps:
        if s.kind == "kernel" and s.kernel.kind in ("loop", "reduce"):
            out = np.full(
                s.shape, np.nan if s.dtype in ("f32", "f64") else 7, dtype=ev.np_dtype(s.dtype)
            )  # poisoned
            cpu.run(s.kernel, out, [env[o.value] for o in s.kernel.inputs])
            env[s.output] = out
            ran += 1
        elif s.kind == "input":
            env[s.output] = inputs[by_input[s.output]]
        elif s.kind == "const":
            env[s.output] = ev.scalar(*s.attrs)
        elif s.kind == "crossing":
            env[s.output] = np.ascontiguousarray(env[s.args[0]])
        elif s.kind in ("host", "view"):
            env[s.output] = ev.apply_op(s.op, [env[a] for a in s.args], s.attrs, s.dtype)
        else:
            env[s.output] = ev.run_kernel(s, [env[o.value] for o in s.kernel.inputs])
    return [env[o] for o in prog.outputs], ran


def random_input(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("i32", "i64"):
        return rng.integers(-50, 50, size=shape).astype(ev.np_dtype(dtype))
    x = rng.standard_normal(shape)
    x = np.where(
        rng.random(shape) < 0.1, rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], size=shape), x
    )
    return x.astype(ev.np_dtype(dtype))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden_program_on_cpu_kernels(path):
    args = options(path)
    graph = load_graph(path)
    compiled = compile_graph(
        graph,
        rewrites=[args[i + 1] for i, a in enumerate(args) if a == "--rewrites"],
        machine="gpu" if "gpu" in args else "cpu-reference",
        io_on_device="device" in args,
    )
    if not any(k.kind in ("loop", "reduce") for k in compiled.program.kernels):
        pytest.skip("no loop or reduction kernel in this program")
    if any(n.op == "Opaque" for n in graph.nodes.values()):
        pytest.skip("opaque host ops have no numpy reference")
    if any(n.dtype in ("f16", "bf16") for n in graph.nodes.values()):
        pytest.skip("half types: the CPU emitter has none (GPU kernels: the CUDA simulator)")
    rng = np.random.default_rng(0)
    inputs = {n.name: random_input(rng, n.shape, n.dtype) for n in graph.inputs()}
    if "log" in path.stem or "rmsnorm" in path.stem:
        inputs = {k: np.abs(v) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    want = ev.eval_program(compiled.program, inputs)
    got, ran = run_program_with_cpu_kernels(compiled.program, inputs)
    assert ran > 0
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_kernels_give_ieee_results_not_exceptions():
    """x / 0.0, log(0.0), sqrt(-1.0), rsqrt(-0.0): inf, -inf and NaN as PyTorch (and the CUDA
    target) give them; Numba's default error model raised ZeroDivisionError and ValueError."""
    from saturn.eqsat.graph import parse_graph

    text = (
        "(input x f32 [6])\n(input y f32 [6])\n"
        "(let r (Add (Add (Div x y) (Log x)) (Add (Sqrt x) (Rsqrt x))))\n(output r)\n"
    )
    graph = parse_graph(text)
    prog = compile_graph(graph, machine="cpu-reference").program
    x = np.array([1.0, -1.0, 0.0, -0.0, 4.0, np.inf], dtype=np.float32)
    y = np.array([0.0, -0.0, 0.0, 0.0, 2.0, 0.0], dtype=np.float32)
    (got,), ran = run_program_with_cpu_kernels(prog, {"x": x, "y": y})
    (want,) = ev.eval_graph(graph, {"x": x, "y": y})
    assert ran >= 1 and np.array_equal(got, want, equal_nan=True), (got, want)
