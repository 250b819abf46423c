"""Shared by the eqsat tests: a program's values against the graph's, on inputs with both
zeros, infinities and NaN (and random booleans)."""

from __future__ import annotations

import numpy as np

from saturn.eqsat import evaluate as ev


def check_values(graph, prog, seed: int = 0, scale: float = 4.0) -> None:
    rng = np.random.default_rng(seed)
    inputs = {}
    for n in graph.inputs():
        if n.dtype == "bool":
            inputs[n.name] = rng.random(n.shape) < 0.5
            continue
        x = rng.standard_normal(n.shape) * scale
        special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])
        x = np.where(rng.random(n.shape) < 0.05, rng.choice(special, size=n.shape), x)
        inputs[n.name] = x.astype(ev.np_dtype(n.dtype))
    want = ev.eval_graph(graph, inputs)
    got = ev.eval_program(prog, inputs)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
