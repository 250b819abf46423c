"""Analyses over the saturated e-graph, the cost model, and DAG-aware extraction.

Analyses (type, placement) are computed per e-node from its children and must agree
across every e-node of a class: a disagreement means a rule made two different values
equal, and raises ``ValidationError`` naming the class and the e-nodes.

Extraction is greedy and DAG-aware: each class's best choice carries the set of classes its
sub-program uses, with their own costs, and a shared class is paid once. A choice whose
sub-program contains its own class is skipped, so the result is acyclic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from . import optable as ot
from . import types as tyr
from .costs import Machine
from .egraph import EGraphView, ENode
from .errors import ValidationError
from .graph import Graph
from .kinds import TERMS, Type, nbytes

KERNELS = tuple(TERMS)  # the kernels' e-graph terms (kinds/)
MOVEMENT = ("View", "Permute", "Expand", "Slice")
HOST, DEVICE = "host", "device"


# --- analyses -----------------------------------------------------------------------------


def _enode_type(en: ENode, ty: dict[int, Type]) -> Type | None:
    """The type an e-node computes, or None while a child's type is unknown."""
    op = en.op
    kind = TERMS.get(op)
    if kind is not None:  # a kernel's term: its kind types it
        need = en.kids if kind.typed_kids is None else en.kids[: kind.typed_kids]
    else:  # a TList is typed by its head alone
        need = en.kids[:1] if op == "TCons" else en.kids
    kids = []
    for k in need:
        if k not in ty:
            return None
        kids.append(ty[k])
    if kind is not None:
        return kind.type_of(en.attrs, kids)
    if op in ("ToDev", "ToHost", "Inline", "Ld", "TCons"):
        return kids[0]  # a TList is typed by its head, so a Custom op by its first operand
    if op == "ESc":
        return (en.attrs[1], ())
    if op in ("TNil", "NoBias", "Opaque", "Item", "Input", "Param"):
        return None  # typed from the graph (seeded) or not a value
    if op.startswith("E") and op[1:] in ot.BY_NAME:
        row = ot.op(op[1:])
        attrs = en.attrs
    else:
        row = ot.op(op)
        attrs = en.attrs
        if row.category == ot.LEAF:
            if op == "Arange":
                return (en.attrs[3], (en.attrs[2],))
            return (en.attrs[1], ()) if op == "Scalar" else None
    dtype = tyr.result_dtype(row, [k[0] for k in kids], attrs)
    shape = tyr.shape_of(row, [k[1] for k in kids], attrs)
    return (dtype, shape)


def _class_analysis(view: EGraphView, what: str, seed: dict, value_of) -> dict:
    """A per-class fact computed from each e-node (``value_of`` returns None while it cannot
    tell yet), to a fixpoint; two e-nodes of one class giving different facts is an error."""
    facts = dict(seed)
    changed = True
    while changed:
        changed = False
        for cid, enodes in view.classes.items():
            for en in enodes:
                v = value_of(cid, en, facts)
                if v is None:
                    continue
                if cid not in facts:
                    facts[cid] = v
                    changed = True
                elif facts[cid] != v:
                    raise ValidationError(
                        f"{what} analysis: class {cid} holds two values, {facts[cid]} and "
                        f"{v} (from {en}); a rule equated different values"
                    )
    return facts


def infer_types(view: EGraphView, graph: Graph) -> dict[int, Type]:
    seed = {
        cid: (graph.nodes[name].dtype, tuple(graph.nodes[name].shape))
        for name, cid in view.named.items()
    }

    def type_of(cid: int, en: ENode, ty: dict) -> Type | None:
        try:
            t = _enode_type(en, ty)
        except (ValueError, KeyError, IndexError) as e:
            raise ValidationError(f"type analysis: class {cid} e-node {en}: {e}") from None
        return None if t is None else (t[0], tuple(t[1]))

    return _class_analysis(view, "type", seed, type_of)


def infer_placement(view: EGraphView) -> dict[int, str]:
    """host or device for every Tensor class; every e-node of a class must agree."""

    def place_of(cid: int, en: ENode, place: dict) -> str | None:
        if view.sort[cid] != "Tensor" or en.op == "NoBias":
            return None
        if en.op in KERNELS or en.op == "ToDev":
            return DEVICE
        if en.op in MOVEMENT:
            return place.get(en.kids[0])
        return HOST

    return _class_analysis(view, "placement", {}, place_of)


# --- cost model ---------------------------------------------------------------------------


@dataclass
class CostModel:
    machine: Machine
    types: dict[int, Type]
    place: dict[int, str]
    io_on_device: bool = False  # inputs arrive and outputs leave in device memory

    def crossing(self, t: Type) -> float:
        return self.machine.crossing_latency_us + nbytes(t) / self.machine.link_bytes_per_us

    def cost(self, cid: int, en: ENode, view: EGraphView) -> float:
        m = self.machine
        t = self.types.get(cid)
        op = en.op
        if op in ("Input", "Param", "Scalar", "Arange", "NoBias", "TNil", "TCons", "Item"):
            return 0.0
        if op in ("ToDev", "ToHost"):
            kid = en.kids[0]
            if self.io_on_device and op == "ToDev" and _is_leaf(view, kid):
                return 0.0  # the input already lives on the device
            if op == "ToDev" and any(e.op in ot.CONSTANTS for e in view.classes[kid]):
                return 0.0  # a constant is made on the device once (see lowering)
            return self.crossing(self.types[kid])
        if op in MOVEMENT:
            return m.view_us
        if op == "Ld":
            return nbytes(self.types[en.kids[0]]) / m.device_bytes_per_us
        if op in ("Inline", "ESc"):
            return 0.0
        if op.startswith("E") and op[1:] in ot.BY_NAME:
            return math.prod(t[1]) * ot.op(op[1:]).flops / m.device_flops_per_us
        kind = TERMS.get(op)
        if kind is not None:  # a kernel: its kind's cost
            return kind.cost(m, t, [self.types.get(k) for k in en.kids])
        # a graph-level op run on the host
        moved = nbytes(t) if t else 0
        extra = 0.0
        for k in en.kids:
            kt = self.types.get(k)
            if kt:
                moved += nbytes(kt)
                if self.io_on_device and _is_leaf(view, k):
                    extra += self.crossing(kt)
        row = ot.BY_NAME.get(op)
        if row is not None and row.category in (ot.MATMUL, ot.CONVOLUTION):
            a, b = (
                (self.types[k] for k in en.kids[-2:])
                if op in ("Addmm",)
                else (self.types[en.kids[0]], self.types[en.kids[1]])
            )
            flops = contraction_flops(op, t, a, b)
        else:
            flops = math.prod(t[1]) * (row.flops if row else 1) if t else 0
        return m.host_op_us + moved / m.host_bytes_per_us + flops / m.host_flops_per_us + extra


def contraction_flops(op: str, out: Type, a: Type, b: Type) -> float:
    """Multiply-adds (x2) of a matrix product or convolution producing ``out``."""
    if op in ("ConvInputGrad", "ConvWeightGrad"):
        # the forward's multiply-adds: the output's gradient ``a`` times (input channels
        # per group x kernel window), read off the weight (an operand, or the result)
        w = b if op == "ConvInputGrad" else out
        return 2.0 * math.prod(a[1]) * math.prod(w[1][1:])
    if op in ("Conv", "Conv2d", "Conv2dNoBias"):
        k = math.prod(b[1][1:])  # input channels per group x kernel window
    else:
        k = a[1][-1]
    return 2.0 * math.prod(out[1]) * k


def _is_leaf(view: EGraphView, cid: int) -> bool:
    return any(en.op in ("Input", "Param") for en in view.classes[cid])


# --- extraction ---------------------------------------------------------------------------


@dataclass
class Choice:
    """The chosen e-node of a class and what the sub-program under it costs.

    Tensor classes are shared across the program and paid once: ``uses`` marks every class
    of the sub-program (a bitset over class indices: bit i is class ``ids[i]``). Loop bodies
    (Expr classes) belong to the kernel that evaluates them: their arithmetic is ``tree``,
    paid again by every kernel that inlines the same body; their bits in ``uses`` only serve
    cycle checks. ``shared`` is what the Tensor classes of ``uses`` own, summed.
    """

    enode: ENode
    own: float  # Tensor classes: this e-node's cost (a kernel's includes its body's tree)
    uses: int
    total: float  # own + every other Tensor class used, once; Expr classes: tree + uses
    tree: float = 0.0
    expr: bool = False  # a loop-body choice (its cost is inside its kernel's)
    shared: float = 0.0


class _Extractor:
    """Worklist greedy DAG extraction over class indices, with bitsets for the sets."""

    def __init__(self, view: EGraphView, model: CostModel):
        self.view, self.model = view, model
        self.ids = list(view.classes)
        # bit i of a choice's ``uses`` is class ids[i]: classes bottom-up, so a choice's
        # bits lie below its own and its bitset is as short as it can be
        h = self._heights = self.heights()
        self.ids.sort(key=lambda c: (h.get(c, math.inf), c))
        self.index = {c: i for i, c in enumerate(self.ids)}
        self.is_expr = {c: view.sort[c] == "Expr" for c in self.ids}
        self.own_vec = np.zeros(len(self.ids))  # current own cost of each Tensor class
        self.own_list = [0.0] * len(self.ids)  # the same, for summing a few classes
        self.parents: dict[int, set[int]] = {c: set() for c in self.ids}
        self.enode_cost: dict[tuple[int, int], float] = {}
        for c, enodes in view.classes.items():
            for i, en in enumerate(enodes):
                for k in en.kids:
                    self.parents[k].add(c)
                self.enode_cost[(c, i)] = model.cost(c, en, view)

    def consider(self, cid: int, i: int, en: ENode, best: dict[int, Choice]) -> Choice | None:
        uses, base, tree = 0, None, 0.0
        for k in en.kids:
            kc = best[k]
            uses |= kc.uses
            if base is None or kc.shared > base.shared:
                base = kc  # the costliest kid: the most classes, as a rule
            if self.is_expr[k]:
                tree += kc.tree
        me = self.index[cid]
        if uses >> me & 1:
            return None  # would read itself: a cycle
        # the classes used, once each: the largest kid's sum, plus what the others add
        shared = 0.0 if base is None else base.shared + self._sum(uses ^ base.uses)
        own = self.enode_cost[(cid, i)]
        uses |= 1 << me
        if self.is_expr[cid]:
            return Choice(en, own, uses, tree + own + shared, tree + own, True, shared)
        if en.op in ("Loop", "Reduce"):
            own += tree  # the kernel evaluates its body once per element
        return Choice(en, own, uses, own + shared, shared=shared + own)

    def _sum(self, bits: int) -> float:
        """What the Tensor classes of a bitset own (Expr classes own nothing here)."""
        if not bits:
            return 0.0
        if bits.bit_count() > 64:  # many classes: one vector sum
            raw = np.frombuffer(bits.to_bytes((bits.bit_length() + 7) // 8, "little"), np.uint8)
            mask = np.unpackbits(raw, bitorder="little")[: len(self.own_vec)].astype(bool)
            return float(self.own_vec[: len(mask)][mask].sum())
        own, total = self.own_list, 0.0
        while bits:
            low = bits & -bits
            total += own[low.bit_length() - 1]
            bits ^= low
        return total

    def best_of(self, cid: int, best: dict[int, Choice], forced: dict[int, str]) -> Choice | None:
        found = None
        rule = forced.get(cid)
        for i, en in enumerate(self.view.classes[cid]):
            if rule is not None and (en.op == rule[1:] if rule[0] == "!" else en.op != rule):
                continue  # forced to one op, or ("!Op") kept from one
            if any(k not in best for k in en.kids):
                continue
            c = self.consider(cid, i, en, best)
            if c is not None and (found is None or c.total < found.total - 1e-9):
                found = c
        return found

    def heights(self) -> dict[int, float]:
        """Bottom-up order: the length of the shortest acyclic derivation of each class
        (Knuth's generalisation of Dijkstra: a class is final when popped)."""
        waiting: dict[tuple[int, int], int] = {}
        users: dict[int, list[tuple[int, int]]] = {c: [] for c in self.ids}
        heap: list[tuple[int, int]] = []
        for c, enodes in self.view.classes.items():
            for i, en in enumerate(enodes):
                kids = set(en.kids)
                waiting[(c, i)] = len(kids)
                for k in kids:
                    users[k].append((c, i))
                if not kids:
                    heapq.heappush(heap, (0, c))
        h: dict[int, float] = {}
        while heap:
            v, c = heapq.heappop(heap)
            if c in h:
                continue
            h[c] = v
            for p, i in users[c]:
                waiting[(p, i)] -= 1
                if waiting[(p, i)] == 0 and p not in h:
                    heapq.heappush(heap, (v + 1, p))
        return h

    def run(
        self,
        best: dict[int, Choice],
        classes: list[int],
        forced: dict[int, str],
        max_visits: int = 64,
        log: dict[int, tuple[Choice | None, float]] | None = None,
        start: Iterable[int] | None = None,
    ) -> dict[int, Choice]:
        """Re-choose ``classes`` bottom-up until nothing changes: one pass over all of them,
        then a worklist of the parents of every class whose choice changed, lowest first.
        A change can travel up through many classes (and through a host/device twin back
        to a class already passed), so full passes stopped after a fixed count could leave
        a class on a stale, far costlier choice; the worklist follows changes only where
        they go. ``max_visits`` bounds the visits per class (greedy choices over cycles
        could in principle keep trading places). ``log`` receives each changed class's
        choice and own cost from before the first change (what undoes the run). ``start``:
        the classes to visit first, where not all of ``classes`` (the parents of choices
        changed since the last run: the others' choices would come out the same)."""
        h = self._heights
        key = {c: (h.get(c, math.inf), c) for c in classes}
        allowed = set(classes)
        queued = allowed if start is None else {c for c in start if c in allowed}
        heap = sorted(key[c] for c in queued)
        queued = set(queued)
        visits: dict[int, int] = {}
        while heap:
            _, cid = heapq.heappop(heap)
            queued.discard(cid)
            visits[cid] = visits.get(cid, 0) + 1
            if visits[cid] > max_visits:
                continue
            new = self.best_of(cid, best, forced)
            old = best.get(cid)
            if new is None:
                if old is None:
                    continue
            elif (
                old is not None
                and new.enode == old.enode
                and abs(new.total - old.total) <= 1e-9 * max(1.0, abs(old.total))
            ):
                continue
            if log is not None and cid not in log:
                log[cid] = (old, self.own_list[self.index[cid]])
            if new is None:
                del best[cid]
            else:
                best[cid] = new
                if not self.is_expr[cid]:
                    self.set_own(cid, new.own)
            for p in self.parents[cid]:
                if p in allowed and p not in queued:
                    queued.add(p)
                    heapq.heappush(heap, key[p])
        return best

    def set_own(self, cid: int, own: float) -> None:
        i = self.index[cid]
        self.own_vec[i] = own
        self.own_list[i] = own

    def readers(self, group: list[int], best: dict[int, Choice]) -> list[int]:
        """The classes of ``group`` and the loop bodies whose chosen e-nodes read them, up
        to and including the Tensor classes (kernels) that evaluate those bodies: what a
        changed choice in ``group`` changes the cost of. Parents whose choice does not read
        the class are left out: a residual stream's class has a parent in every later
        layer's written-out body, the chosen program one or two."""
        seen = set(group)
        stack = list(group)
        while stack:
            c = stack.pop()
            if not self.is_expr[c]:
                continue  # a kernel: its readers see only its output
            for p in self.parents[c]:
                chosen = best.get(p)
                if p not in seen and chosen is not None and c in chosen.enode.kids:
                    seen.add(p)
                    stack.append(p)
        return list(seen)

    def ancestors(self, cid: int) -> list[int]:
        seen = {cid}
        stack = [cid]
        while stack:
            for p in self.parents[stack.pop()]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return list(seen)


def extract(
    view: EGraphView,
    model: CostModel,
    roots: list[int] | None = None,
    forced: dict[int, str] | None = None,
) -> dict[int, Choice]:
    """Greedy DAG extraction: the cheapest acyclic choice per class, shared values once.

    ``forced`` restricts a class to e-nodes of one op (used by ``extract_shared``)."""
    ex = _Extractor(view, model)
    best = ex.run({}, list(ex.ids), forced or {})
    _check_roots(best, roots if roots is not None else view.outputs)
    return best


def _check_roots(best: dict[int, Choice], roots: list[int]) -> None:
    for r in roots:
        if r not in best:
            raise ValidationError(f"extraction found no acyclic program for output class {r}")


def program_cost(best: dict[int, Choice], roots: list[int]) -> float:
    """Total cost of the extracted program for these roots: each Tensor class once."""
    seen: set[int] = set()
    total = 0.0
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        ch = best[c]
        if not ch.expr:
            total += ch.own
        stack.extend(ch.enode.kids)
    return total
