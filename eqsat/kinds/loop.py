"""Loop kernels: a fused elementwise body over a domain (the e-graph's ``Loop``), lowered
by ``kernel_bodies.py``, emitted by ``codegen/cuda.py`` (GPU) and ``codegen/cpu.py``."""

from __future__ import annotations

import numpy as np

from ..numpy_ops import eval_expr, np_dtype
from .spec import KindFacts, KindSpec, streamed


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    v = np.broadcast_to(eval_expr(k.body, operands), k.domain)
    return np.array(v, dtype=np_dtype(k.dtype))


SPEC = KindSpec(
    name="loop",
    order=0,
    facts=KindFacts(body=True),
    term="Loop",
    declare=(
        ";; a fused elementwise loop over the shape of its body",
        "(constructor Loop (Expr) Tensor)",
    ),
    type_of=lambda attrs, kids: kids[0],
    cost=streamed,
    reference=_reference,
)
