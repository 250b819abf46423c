"""The memory plan of a device program: every kernel output gets a fixed offset in one
arena, so a call's device work can be captured as a CUDA graph and replayed.

Live ranges run from the step that writes a value to the last step that reads it (a view
reads through to the value it views, so it extends that value's range; program outputs live
to the end; a rows kernel's statistic, ``kinds/row_stat.py``, lives from its rows kernel's
step). Buffers are placed greedily, largest first, at the lowest offset that does not
overlap a placed buffer whose range meets theirs: no two live values share a byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .kinds import facts
from .optable import ITEMSIZE
from .program import Program, StepKind

ALIGN = 256  # bytes: library calls and 16-byte vector accesses both want aligned bases


@dataclass(frozen=True)
class Slot:
    offset: int
    nbytes: int
    first: int  # index of the writing step
    last: int  # index of the last reading step


@dataclass
class MemoryPlan:
    slots: dict[str, Slot]  # kernel output value -> its place in the arena
    size: int  # arena bytes

    def overlaps(self) -> list[tuple[str, str]]:
        """Pairs of values live at once that share bytes (empty for a correct plan)."""
        bad = []
        items = sorted(self.slots.items())
        for i, (a, sa) in enumerate(items):
            for b, sb in items[i + 1 :]:
                live = sa.first <= sb.last and sb.first <= sa.last
                mem = sa.offset < sb.offset + sb.nbytes and sb.offset < sa.offset + sa.nbytes
                if live and mem:
                    bad.append((a, b))
        return bad


def nbytes(dtype: str, shape) -> int:
    if dtype not in ITEMSIZE:
        raise ValueError(f"no memory size for dtype {dtype}")
    return ITEMSIZE[dtype] * math.prod(shape)


def _round(n: int) -> int:
    return max(ALIGN, -(-n // ALIGN) * ALIGN)


def plan_memory(program: Program) -> MemoryPlan:
    steps = program.steps
    root: dict[str, str] = {}  # a view's value -> the buffer it lies in
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    size: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.kind == StepKind.KERNEL:
            first[s.output] = last[s.output] = i
            size[s.output] = nbytes(s.dtype, s.shape)
            if facts(s.kernel.kind).side:  # written by the kernel it reads, from that step on
                first[s.output] = first[s.kernel.inputs[0].value]
        elif s.kind == StepKind.VIEW and s.args and s.args[0] in root | first.keys():
            root[s.output] = root.get(s.args[0], s.args[0])
        for a in s.args:
            r = root.get(a, a)
            if r in last:
                last[r] = max(last[r], i)
        if s.kernel is not None:
            for o in s.kernel.inputs:
                r = root.get(o.value, o.value)
                if r in last:
                    last[r] = max(last[r], i)
    end = len(steps)
    for v in program.outputs:
        r = root.get(v, v)
        if r in last:
            last[r] = end
    placed: list[tuple[str, Slot]] = []
    order = sorted(first, key=lambda v: (-size[v], first[v]))
    for v in order:
        need = _round(size[v])
        busy = sorted(
            (s.offset, s.offset + _round(s.nbytes))
            for _, s in placed
            if s.first <= last[v] and first[v] <= s.last
        )
        offset = 0
        for lo, hi in busy:
            if offset + need <= lo:
                break
            offset = max(offset, hi)
        placed.append((v, Slot(offset, size[v], first[v], last[v])))
    slots = dict(placed)
    total = max((s.offset + _round(s.nbytes) for s in slots.values()), default=0)
    return MemoryPlan(slots, total)
