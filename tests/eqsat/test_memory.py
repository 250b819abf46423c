"""The memory plan: no two live values share a byte, dead values' bytes are reused."""

from __future__ import annotations

import dataclasses

from saturn.eqsat.graph import parse_graph
from saturn.eqsat.memory import ALIGN, nbytes, plan_memory
from saturn.eqsat.pipeline import compile_graph

CHAIN = """(input x f32 [64 64])
(param w f32 [64 64])
(let a (MatMul x w))
(let b (Exp a))
(let c (MatMul b w))
(let d (Tanh c))
(let e (MatMul d w))
(let f (Sum e [1] 0))
(output f)
"""


def program(text: str):
    return compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program


def test_no_live_values_overlap_and_dead_bytes_are_reused():
    prog = program(CHAIN)
    plan = plan_memory(prog)
    assert plan.overlaps() == []
    kernels = [s for s in prog.steps if s.kind == "kernel"]
    assert set(plan.slots) == {s.output for s in kernels}
    total = sum(-(-nbytes(s.dtype, s.shape) // ALIGN) * ALIGN for s in kernels)
    assert plan.size < total, (plan.size, total)  # a chain needs about two buffers, not six
    assert all(s.offset % ALIGN == 0 for s in plan.slots.values())


def test_outputs_live_to_the_end():
    prog = program(CHAIN.replace("(output f)", "(output b f)"))
    plan = plan_memory(prog)
    b = prog.outputs[0]
    assert plan.slots[b].last == len(prog.steps)
    assert plan.overlaps() == []


def test_overlap_check_can_fail():
    plan = plan_memory(program(CHAIN))
    (a, sa), (_, sb) = sorted(plan.slots.items(), key=lambda kv: kv[1].first)[:2]
    # put a value live at the same time as its successor on the successor's bytes
    plan.slots[a] = dataclasses.replace(sa, offset=sb.offset, last=max(sa.last, sb.first))
    assert plan.overlaps()
