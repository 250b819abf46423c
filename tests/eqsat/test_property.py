"""Property: for random graphs built from the op table and random inputs that include NaN,
both infinities and both zeros, the extracted program computes exactly what the graph does.
The default rulesets are exact, so the comparison is bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat.evaluate import eval_graph, eval_program
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

UNARY = ["Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Relu", "Rsqrt", "Silu"]
BINARY = ["Add", "Sub", "Mul", "Div", "Maximum", "Minimum"]
SPECIAL = ["0.0", "-0.0", "1.0", "nan", "inf", "-inf", "0.5", "-2.0"]
SHAPES = ["[3 5]", "[5]", "[3 1]", "[1 5]", "[]"]


def random_graph(rng: np.random.Generator, dtype: str) -> str:
    lines = [f"(input a {dtype} [3 5])"]
    names = ["a"]
    for i, shape in enumerate(rng.choice(SHAPES, size=2)):
        lines.append(f"(input i{i} {dtype} {shape})")
        names.append(f"i{i}")
    for k in range(int(rng.integers(3, 9))):
        r = rng.random()
        x = rng.choice(names)
        if r < 0.35:
            term = f"({rng.choice(UNARY)} {x})"
        elif r < 0.7:
            y = rng.choice(names)
            term = f"({rng.choice(BINARY)} {x} {y})"
        elif r < 0.85:
            c = rng.choice(SPECIAL)
            op = rng.choice(BINARY)
            term = (
                f"({op} {x} (Scalar {c} {dtype}))"
                if rng.random() < 0.5
                else f"({op} (Scalar {c} {dtype}) {x})"
            )
        elif r < 0.93:
            term = f"(Neg (Neg {x}))" if rng.random() < 0.5 else f"(Relu (Relu {x}))"
        else:
            y, z = rng.choice(names, size=2)
            term = f"(Where (Gt {x} {y}) {y} {z})"
        lines.append(f"(let t{k} {term})")
        names.append(f"t{k}")
    outs = [names[-1]]
    if rng.random() < 0.4:
        lines.append(f"(let s (Sum (Add {names[-1]} a) [-1] 1))")  # rank 2 whatever t is
        if rng.random() < 0.5:  # a function of the sum alone: folded into the reduction
            lines.append(f"(let se (Sqrt ({rng.choice(UNARY)} s)))")
            outs.append("se")
        else:
            outs.append("s")
    if rng.random() < 0.3:
        lines.append(f"(let m (Amax (Mul {names[-2]} a) [-1] 0))")
        outs.append("m")
    lines.append(f"(output {' '.join(outs)})")
    return "\n".join(lines) + "\n"


def random_input(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    x = rng.standard_normal(shape) * 3
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])
    mask = rng.random(shape) < 0.25
    x = np.where(mask, rng.choice(special, size=shape), x)
    return np.asarray(x, dtype=dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("seed", range(40))
def test_extracted_program_equals_graph(seed):
    rng = np.random.default_rng(seed)
    dtype = "f32" if seed % 3 else "f64"
    text = random_graph(rng, dtype)
    graph = parse_graph(text, f"random-{seed}")
    compiled = compile_graph(graph, io_on_device=bool(seed % 2))
    np_dtype = np.float32 if dtype == "f32" else np.float64
    for trial in range(3):
        inputs = {n.name: random_input(rng, n.shape, np_dtype) for n in graph.inputs()}
        want = eval_graph(graph, inputs)
        got = eval_program(compiled.program, inputs)
        for w, g in zip(want, got, strict=True):
            assert same_bits(np.asarray(w), np.asarray(g)), (
                f"seed {seed} trial {trial}\n{text}\n{compiled.program.to_text()}"
            )
    assert compiled.program.kernels, "something ran on the device"
