"""A numpy reference evaluator for graphs and for extracted programs.

Both use the op table's numpy semantics (``numpy_ops``), in each value's own dtype, so an
exact rewrite gives bit-identical results: the property tests compare the two. A kernel
runs its kind's reference (``kinds/``).
"""

from __future__ import annotations

import math

import numpy as np

from . import optable as ot
from .graph import Graph
from .kinds import BY_KIND, KindTable, facts, spec
from .numpy_ops import apply_op, conv2d, eval_expr, np_dtype, reduce, scalar
from .program import Program, StepKind

__all__ = ["apply_op", "conv2d", "eval_expr", "eval_graph", "eval_program", "np_dtype", "reduce"]


def eval_graph(graph: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    env: dict[str, np.ndarray] = {}
    for n in graph.nodes.values():
        if n.op in ("Input", "Param"):
            env[n.name] = inputs[n.name]
        elif n.op == "Scalar":
            env[n.name] = scalar(*n.attrs)
        elif n.op == "Arange":
            env[n.name] = ot.arange_values(*n.attrs)
        else:
            env[n.name] = apply_op(n.op, [env[a] for a in n.args], n.attrs, n.dtype)
    return [env[o] for o in graph.outputs]


def eval_program(prog: Program, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    env: dict[str, np.ndarray] = {}
    beside: dict[str, list[np.ndarray]] = {}  # kernel -> the values it wrote beside its output
    by_input = {v: k for k, v in prog.inputs.items()}
    for s in prog.steps:
        if s.kind == StepKind.INPUT:
            env[s.output] = inputs[by_input[s.output]]
        elif s.kind == StepKind.CONST and s.op == "Arange":
            env[s.output] = ot.arange_values(*s.attrs)
        elif s.kind == StepKind.CONST:
            env[s.output] = scalar(*s.attrs)
        elif s.kind == StepKind.CROSSING:
            env[s.output] = env[s.args[0]].copy()
        elif s.kind in (StepKind.HOST, StepKind.VIEW):
            env[s.output] = apply_op(s.op, [env[a] for a in s.args], s.attrs, s.dtype)
        elif s.kind == StepKind.KERNEL and facts(s.kernel.kind).side:  # its writer's
            env[s.output] = REFERENCE[s.kernel.kind](s.kernel, beside[s.kernel.inputs[0].value])
        elif s.kind == StepKind.KERNEL:
            operands = [env[o.value] for o in s.kernel.inputs]
            env[s.output] = run_kernel(s, operands)
            also = spec(s.kernel.kind).side_values
            if also is not None:
                beside[s.output] = also(s.kernel, _right_aligned(s.kernel, operands))
    return [env[o] for o in prog.outputs]


# the numpy reference of each kernel kind (its kind module's): (kernel, operands) -> output
REFERENCE: KindTable = KindTable("the reference evaluator")
for _kind, _spec in BY_KIND.items():
    if _spec.reference is not None:
        REFERENCE.on(_kind)(_spec.reference)


def run_kernel(s, operands: list[np.ndarray]) -> np.ndarray:
    return REFERENCE[s.kernel.kind](s.kernel, _right_aligned(s.kernel, operands))


def _right_aligned(k, operands: list[np.ndarray]) -> list[np.ndarray]:
    """Operands as kernels read them: with more axes than the kernel's domain, all leading
    ones of length 1 (a loop computed inside a rows kernel through a reshape,
    ``kernel_fusion``), right-aligned, those axes dropped; packed ("same") ones of another
    shape (a rows kernel over a grid that splits their axes) at their flat index."""
    n = len(k.domain)
    if k.body is None or not n:
        return operands
    out = []
    for a, o in zip(operands, k.inputs, strict=True):
        if o.indexing == "same" and a.shape != tuple(k.domain) and a.size == math.prod(k.domain):
            a = a.reshape(k.domain)
        elif a.ndim > n and all(d == 1 for d in a.shape[: a.ndim - n]):
            a = a.reshape(a.shape[a.ndim - n :])
        out.append(a)
    return out
