"""Rows kernels: per-row reductions (stages) over the last axis, then a body reading them.
No rule makes one: ``kernel_fusion.py`` forms them from extracted loops and reductions
(softmax, norms); ``codegen/cuda_rows.py`` emits them. The cpu-reference machine forms
none."""

from __future__ import annotations

import numpy as np

from .. import optable as ot
from ..numpy_ops import eval_expr, np_dtype, reduce
from .spec import KindFacts, KindSpec


def _stages(k, operands: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The operands as the kernel reads them, and each stage's per-row value."""
    if "take" in k.attrs:  # a fused take (fuse_row_takes): the taken rows, as a gather
        t, x = k.attrs["take"]
        operands = list(operands)
        operands[t] = ot.op("Take").numpy(operands[t], operands[x])
    stages = []
    last = [len(k.domain) - 1]
    for st in k.stages:
        v = np.broadcast_to(eval_expr(st.body, operands, stages), k.domain)
        acc = reduce(st.reduce, v, last, 1, st.acc_dtype)
        if st.epilogue is not None:
            acc = np.asarray(eval_expr(st.epilogue, [acc])).astype(np_dtype(st.dtype))
        stages.append(acc)
    return operands, stages


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    """Each stage a last-axis reduction, then the body."""
    operands, stages = _stages(k, operands)
    v = np.broadcast_to(eval_expr(k.body, operands, stages), k.domain)
    # its output in the kernel's shape (a grid that splits its axes writes the same order)
    return np.array(v, dtype=np_dtype(k.dtype)).reshape(k.shape)


def stats(k, operands: list[np.ndarray]) -> list[np.ndarray]:
    """The per-row statistics a rows kernel writes beside its output (``attrs["stats"]``:
    an expression over the stages and its dtype each; ``kinds/row_stat.py``), one value
    per row."""
    if not k.attrs.get("stats"):
        return []
    _, stages = _stages(k, operands)
    rows = (*k.domain[:-1], 1)
    return [
        np.array(np.broadcast_to(eval_expr(e, [], stages), rows), dtype=np_dtype(dtype))
        for e, dtype in k.attrs.get("stats", ())
    ]


SPEC = KindSpec(
    name="rows", order=2, facts=KindFacts(body=True), reference=_reference, side_values=stats
)
