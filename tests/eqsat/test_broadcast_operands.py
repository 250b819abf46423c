"""Expanded operands of loops and reductions: an expand of a packed value is read as that
value broadcast (scalar, per-row or per-column indexing: one division of the index, or
none) instead of through strides (a division per axis); where broadcasting cannot say
which element an expand's element is (an axis broadcast between kept ones, or a strided
source) the expand is read through its strides. Values on both machines."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat.evaluate import eval_graph, eval_program
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0]


def compiled(text: str, machine: str = "gpu"):
    graph = parse_graph(text)
    return graph, compile_graph(graph, machine=machine, io_on_device=True).program


def check_values(graph, prog, rng) -> None:
    inputs = {}
    for n in graph.inputs():
        x = rng.standard_normal(n.shape).astype(np.float32)
        x.reshape(-1)[: min(x.size, len(SPECIAL))] = SPECIAL[: x.size]
        inputs[n.name] = x
    for got, want in zip(eval_program(prog, inputs), eval_graph(graph, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
def test_expanded_scalars_and_rows_are_read_broadcast(machine):
    """A layer norm's backward: the loss gradient (a scalar) expanded to the activation's
    shape, and per-row statistics expanded along the row."""
    graph, prog = compiled(
        "(input g f32 [])\n(input x f32 [3 4 6])\n(input m f32 [3 4 1])\n"
        "(let e (Mul (Expand g [3 4 6]) (Sub x (Expand m [3 4 6]))))\n"
        "(let s (Sum e [0 1] 0))\n(let t (Sum (Mul (Expand g [3 4 6]) x) [0 1 2] 0))\n"
        "(output e s t)\n",
        machine,
    )
    kinds = {o.indexing for k in prog.kernels for o in k.inputs}
    assert "strided" not in kinds, prog.to_text()
    assert {"scalar", "leading"} <= kinds, prog.to_text()
    # no view step is left for the expands: each is computed inside its kernels
    assert not [s for s in prog.steps if s.kind == "view"], prog.to_text()
    inside = {n for k in prog.kernels for n in k.fused}
    expands = [n for n, node in graph.nodes.items() if node.op == "Expand"]
    assert expands and set(expands) <= inside, (expands, inside)
    check_values(graph, prog, np.random.default_rng(0))


@pytest.mark.parametrize(
    "text",
    [
        # the broadcast axis lies between two kept ones: no single division picks the row
        "(input x f32 [3 4 6])\n(input c f32 [3 1 6])\n"
        "(let r (Mul x (Expand c [3 4 6])))\n(output r)\n",
        # the expand's source is itself a strided view (a transpose)
        "(input x f32 [4 3])\n(input c f32 [3 1])\n"
        "(let r (Mul x (Expand (Permute c [1 0]) [4 3])))\n(output r)\n",
    ],
    ids=["middle-axis", "strided-source"],
)
def test_expands_broadcasting_cannot_describe_stay_strided(text):
    graph, prog = compiled(text)
    (k,) = prog.kernels
    assert "strided" in {o.indexing for o in k.inputs}, prog.to_text()
    check_values(graph, prog, np.random.default_rng(1))
