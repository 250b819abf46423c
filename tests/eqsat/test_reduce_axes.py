"""Reductions over axes that are not one run (``x.sum((0, 2))``) in text graphs: the
lowering reads the operands through views permuted to put the reduced axes last (a
broadcast operand expanded first), so every reduce kernel reduces adjacent axes, and the
program computes what the graph does on both machines."""

from __future__ import annotations

import numpy as np
import pytest

from saturn.eqsat.evaluate import eval_graph, eval_program
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

TEXT = """(input x f32 [3 4 5 2])
(input w f32 [2])
(let s (Sum (Mul x w) [0 2] 0))
(let m (Amax x [1 3] 1))
(let v (Mean x [0 3] 1))
(output s m v)
"""


@pytest.mark.parametrize("machine", ["cpu-reference", "gpu"], ids=["reference", "cuda"])
def test_reductions_over_separate_axes_reduce_adjacent_ones(machine):
    graph = parse_graph(TEXT)
    prog = compile_graph(graph, machine=machine, io_on_device=True).program
    reduces = [k for k in prog.kernels if k.kind == "reduce"]
    assert len(reduces) == 3, prog.to_text()
    for k in reduces:
        dims = tuple(k.attrs["dims"])
        assert dims == tuple(range(len(k.domain) - len(dims), len(k.domain))), prog.to_text()
    assert any(s.op == "Permute" for s in prog.steps if s.kind == "view")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -0.0]
    inputs = {"x": x, "w": rng.standard_normal(2).astype(np.float32)}
    for got, want in zip(eval_program(prog, inputs), eval_graph(graph, inputs), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_one_run_of_axes_is_left_as_it_is():
    graph = parse_graph("(input x f32 [3 4 5])\n(let s (Sum x [1 2] 0))\n(output s)\n")
    prog = compile_graph(graph, machine="gpu", io_on_device=True).program
    (k,) = prog.kernels
    assert k.attrs["dims"] == (1, 2) and not [s for s in prog.steps if s.kind == "view"]
