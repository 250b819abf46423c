"""Loop kernels: a fused elementwise body over a domain (the e-graph's ``Loop``), lowered
by ``kernel_bodies.py``, emitted by ``codegen/cuda.py`` (GPU) and ``codegen/cpu.py``."""

from __future__ import annotations

import numpy as np

from ..numpy_ops import eval_expr, np_dtype
from .spec import KindFacts, KindSpec, streamed


def _reference(k, operands: list[np.ndarray]) -> np.ndarray:
    v = np.broadcast_to(eval_expr(k.body, operands), k.domain)
    return np.array(v, dtype=np_dtype(k.dtype))


def grouped(k, operands: list[np.ndarray]) -> list[np.ndarray]:
    """The loops a loop kernel runs beside its own (``attrs["stats"]``: a body over its
    operands and the dtype each; ``attrs["segments"]``: the domain each;
    ``horizontal.group_loops``)."""
    return [
        np.array(np.reshape(eval_expr(body, operands), shape), dtype=np_dtype(dtype))
        for (body, dtype), shape in zip(
            k.attrs.get("stats", ()), k.attrs.get("segments", ()), strict=True
        )
    ]


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
    side_values=grouped,
)
