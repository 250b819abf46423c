"""Bounds on the values of a lowered program's integer tensors, so that a row take or a row
add whose index provably stays in range needs no bounds check read back after the call.

An embedding's backward clamps its token ids into the table before adding rows
(``clamp(ids, -rows, rows - 1)``); a flip takes rows at a reversed ``Arange``. Bounds are
intervals worked out from how the program makes a value: a constant or an ``Arange``
exactly; a view (reshape, expand, slice, permute) holds a subset of its source's values;
a loop's body is evaluated over intervals (its operands' bounds, constants, ``minimum``,
``maximum``, ``add``, ``sub``, ``mul``, ``neg``, the floored ``remainder`` and ``floordiv``
and the truncating ``fmod`` by a constant, comparisons and ``where``); anything else is
unbounded. Only integer values are bounded, and an arithmetic result only while it stays
within the range of the narrowest integer type the loop reads or writes (so no step can
wrap around) and within
2^53 (exact as a float): an interval is never narrower than the values it describes.

Booleans inside a body are the intervals (0, 0), (1, 1) or (0, 1): a comparison that
every pair of operand values decides the same way is a constant, and a ``where`` whose
condition is decided takes that branch's bounds alone. That is how the flat positions of
a ``gather`` (decision 0047) whose index is wrapped by ``remainder`` (``take_along_dim``)
are seen to avoid the out-of-range sentinel.
"""

from __future__ import annotations

import math

import numpy as np

from . import optable as ot
from .graph import bits_float
from .kinds import Kind, facts
from .program import Program, Step, StepKind, leaves

Interval = tuple[float, float]
UNBOUNDED: Interval = (-math.inf, math.inf)
EXACT = 2.0**53  # larger bounds are not kept (float rounding)
VIEWS = ("View", "Expand", "Slice", "Permute")


def _limits(dtype: str) -> Interval:
    info = np.iinfo(ot.NUMPY_DTYPE[dtype])
    return (max(float(info.min), -EXACT), min(float(info.max), EXACT))


def _within(iv: Interval, limits: Interval) -> Interval:
    """``iv`` where no value of it can have wrapped around, else unbounded."""
    lo, hi = iv
    return iv if lo > hi or (limits[0] <= lo and hi <= limits[1]) else UNBOUNDED


TRUE: Interval = (1.0, 1.0)
FALSE: Interval = (0.0, 0.0)
EITHER: Interval = (0.0, 1.0)
# comparison -> (always true, always false) of operand intervals (a, b) and (c, d)
_COMPARE = {
    "lt": (lambda a, b, c, d: b < c, lambda a, b, c, d: a >= d),
    "le": (lambda a, b, c, d: b <= c, lambda a, b, c, d: a > d),
    "gt": (lambda a, b, c, d: a > d, lambda a, b, c, d: b <= c),
    "ge": (lambda a, b, c, d: a >= d, lambda a, b, c, d: b < c),
    "eq": (lambda a, b, c, d: a == b == c == d, lambda a, b, c, d: b < c or d < a),
    "ne": (lambda a, b, c, d: b < c or d < a, lambda a, b, c, d: a == b == c == d),
}


def _divisor(iv: Interval) -> int | None:
    """The constant divisor of an integer remainder or floor division (the type check
    admits only constants >= 1 there)."""
    lo, hi = iv
    return int(lo) if lo == hi and lo >= 1 else None


def _body(e: tuple, operands: list[Interval], limits: Interval) -> Interval:
    op = e[0]
    if op == "in":
        return operands[e[1]]
    if op == "const":
        if e[2] not in ot.INTS and e[2] != "bool":
            return UNBOUNDED
        v = bits_float(e[1])
        return (v, v) if math.isfinite(v) else UNBOUNDED
    kids = [_body(k, operands, limits) for k in e[1:] if isinstance(k, tuple)]
    if op in _COMPARE and len(kids) == 2:  # booleans as 0 and 1
        (a, b), (c, d) = kids
        always, never = _COMPARE[op]
        return TRUE if always(a, b, c, d) else FALSE if never(a, b, c, d) else EITHER
    if op == "where" and len(kids) == 3:  # the branch a decided condition takes
        if kids[0] == TRUE:
            return kids[1]
        if kids[0] == FALSE:
            return kids[2]
        (a, b), (c, d) = kids[1], kids[2]
        return (min(a, c), max(b, d))
    if op == "mul" and len(kids) == 2:
        if not all(math.isfinite(v) for v in (*kids[0], *kids[1])):
            return UNBOUNDED  # an infinite end times 0 has no bound
        ends = [x * y for x in kids[0] for y in kids[1]]
        return _within((min(ends), max(ends)), limits)
    if op in ("remainder", "floordiv", "fmod") and len(kids) == 2:  # integers
        (a, b), n = kids[0], _divisor(kids[1])
        if n is None:
            return UNBOUNDED
        if op == "remainder":
            return (a, b) if 0 <= a and b < n else (0.0, float(n - 1))
        if op == "fmod":  # truncated: the dividend's sign, |r| < n
            if (0 <= a and b < n) or (-n < a and b <= 0):
                return (a, b)
            return (0.0 if a >= 0 else float(1 - n), 0.0 if b <= 0 else float(n - 1))
        return (_floor_div(a, n), _floor_div(b, n))
    if op in ("minimum", "clampmax") and len(kids) == 2:
        (a, b), (c, d) = kids
        return (min(a, c), min(b, d))
    if op in ("maximum", "clampmin") and len(kids) == 2:
        (a, b), (c, d) = kids
        return (max(a, c), max(b, d))
    if op == "add" and len(kids) == 2:
        (a, b), (c, d) = kids
        return _within((a + c, b + d), limits)
    if op == "sub" and len(kids) == 2:
        (a, b), (c, d) = kids
        return _within((a - d, b - c), limits)
    if op == "neg" and len(kids) == 1:
        (a, b) = kids[0]
        return _within((-b, -a), limits)
    return UNBOUNDED


def _floor_div(v: float, n: int) -> float:
    """Floored ``v // n`` of an interval's end: integral (and within 2^53) or infinite."""
    return v if math.isinf(v) else float(int(v) // n)


def value_bounds(prog: Program, name: str) -> Interval:
    """An interval holding every element of value ``name`` (UNBOUNDED where unknown)."""
    steps = {s.output: s for s in prog.steps}
    memo: dict[str, Interval] = {}

    def go(v: str) -> Interval:
        if v in memo:
            return memo[v]
        memo[v] = UNBOUNDED  # a cycle (there is none in a valid program) stays unbounded
        s = steps.get(v)
        ok = s is not None and s.dtype in ot.INTS
        memo[v] = _within(_step(s), _limits(s.dtype)) if ok else UNBOUNDED
        return memo[v]

    def _step(s: Step) -> Interval:
        if s.kind == StepKind.CONST and s.op == "Arange":
            start, step, n, _ = s.attrs
            ends = (start, start + step * max(n - 1, 0))
            return (min(ends), max(ends)) if n else (math.inf, -math.inf)  # no values
        if s.kind == StepKind.CONST and s.op == "Scalar":
            v = bits_float(s.attrs[0])
            return (v, v) if math.isfinite(v) else UNBOUNDED
        if s.kind == StepKind.VIEW and s.op in VIEWS:
            return go(s.args[0])
        k = s.kernel
        if s.kind != StepKind.KERNEL or k is None:
            return UNBOUNDED
        if k.kind == Kind.LOOP:
            return _loop(k.body, s.dtype, k.inputs)
        writer = steps.get(k.inputs[0].value) if k.kind == Kind.ROW_STAT else None
        if writer is not None and writer.kernel.kind == Kind.LOOP:  # a loop group's loop
            body, dtype = writer.kernel.attrs["stats"][k.attrs["stat"]]
            return _loop(body, dtype, writer.kernel.inputs)
        return UNBOUNDED

    def _loop(body: tuple, dtype: str, inputs: list) -> Interval:
        used = {leaf[1] for leaf in leaves(body) if leaf[0] == "in"}
        dtypes = [dtype, *(o.dtype for i, o in enumerate(inputs) if i in used)]
        if any(d not in ot.INTS and d != "bool" for d in dtypes):
            return UNBOUNDED  # a float or a cast along the way: not followed
        widths = [_limits(d) for d in dtypes if d in ot.INTS]
        limits = (max(w[0] for w in widths), min(w[1] for w in widths))
        return _body(
            body, [go(o.value) if i in used else UNBOUNDED for i, o in enumerate(inputs)], limits
        )

    return go(name)


def indices_in_range(prog: Program, s: Step) -> bool:
    """Whether a row take (``gather``, or a rows kernel reading one: rows [0, rows)) or row
    add (``scatter``: negative rows wrap, [-rows, rows)) cannot meet an index out of
    range, so its error word cannot be set."""
    k = s.kernel
    if k is not None and k.kind == Kind.ROWS and "take" in k.attrs:  # fuse_row_takes
        table, index = (k.inputs[i] for i in k.attrs["take"])
    elif k is not None and facts(k.kind).indices:
        table, index = k.inputs[0], k.inputs[1]
    else:
        return False
    rows = table.shape[0] if table.shape else 0
    lo, hi = value_bounds(prog, index.value)
    least = -rows if k.kind == Kind.SCATTER else 0
    return least <= lo and hi < rows
