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
    of the sub-program (a boolean vector over class indices). Loop bodies (Expr classes)
    belong to the kernel that evaluates them: their arithmetic is ``tree``, paid again by
    every kernel that inlines the same body; their bits in ``uses`` only serve cycle checks.
    """

    enode: ENode
    own: float  # Tensor classes: this e-node's cost (a kernel's includes its body's tree)
    uses: np.ndarray
    total: float  # own + every other Tensor class used, once; Expr classes: tree + uses
    tree: float = 0.0
    expr: bool = False  # a loop-body choice (its cost is inside its kernel's)


class _Extractor:
    """Worklist greedy DAG extraction over class indices, with numpy masks for the sets."""

    def __init__(self, view: EGraphView, model: CostModel):
        self.view, self.model = view, model
        self.ids = list(view.classes)
        self.index = {c: i for i, c in enumerate(self.ids)}
        self.is_expr = {c: view.sort[c] == "Expr" for c in self.ids}
        self.own_vec = np.zeros(len(self.ids))  # current own cost of each Tensor class
        self.parents: dict[int, set[int]] = {c: set() for c in self.ids}
        self.enode_cost: dict[tuple[int, int], float] = {}
        self._heights: dict[int, float] | None = None
        for c, enodes in view.classes.items():
            for i, en in enumerate(enodes):
                for k in en.kids:
                    self.parents[k].add(c)
                self.enode_cost[(c, i)] = model.cost(c, en, view)

    def consider(self, cid: int, i: int, en: ENode, best: dict[int, Choice]) -> Choice | None:
        n = len(self.ids)
        uses = np.zeros(n, dtype=bool)
        tree = 0.0
        for k in en.kids:
            kc = best[k]
            uses |= kc.uses
            if self.is_expr[k]:
                tree += kc.tree
        me = self.index[cid]
        if uses[me]:
            return None  # would read itself: a cycle
        own = self.enode_cost[(cid, i)]
        if self.is_expr[cid]:
            shared = float(self.own_vec[uses].sum())
            uses[me] = True
            return Choice(en, own, uses, tree + own + shared, tree + own, expr=True)
        if en.op in ("Loop", "Reduce"):
            own += tree  # the kernel evaluates its body once per element
        shared = float(self.own_vec[uses].sum())
        uses[me] = True
        return Choice(en, own, uses, own + shared)

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
    ) -> dict[int, Choice]:
        """Re-choose ``classes`` bottom-up until nothing changes: one pass over all of them,
        then a worklist of the parents of every class whose choice changed, lowest first.
        A change can travel up through many classes (and through a host/device twin back
        to a class already passed), so full passes stopped after a fixed count could leave
        a class on a stale, far costlier choice; the worklist follows changes only where
        they go. ``max_visits`` bounds the visits per class (greedy choices over cycles
        could in principle keep trading places)."""
        if self._heights is None:
            self._heights = self.heights()
        h = self._heights
        key = {c: (h.get(c, math.inf), c) for c in classes}
        allowed = set(classes)
        heap = sorted(key[c] for c in classes)
        queued = set(classes)
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
                del best[cid]
            elif (
                old is not None
                and new.enode == old.enode
                and abs(new.total - old.total) <= 1e-9 * max(1.0, abs(old.total))
            ):
                continue
            else:
                best[cid] = new
                if not self.is_expr[cid]:
                    self.own_vec[self.index[cid]] = new.own
            for p in self.parents[cid]:
                if p in allowed and p not in queued:
                    queued.add(p)
                    heapq.heappush(heap, key[p])
        return best

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


def _references(view: EGraphView, best: dict[int, Choice], roots: list[int]) -> dict[int, int]:
    """How many chosen e-nodes of the program read each class."""
    refs: dict[int, int] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for k in best[c].enode.kids:
            refs[k] = refs.get(k, 0) + 1
            stack.append(k)
    return refs


def extract_shared(
    view: EGraphView, model: CostModel, roots: list[int], max_tries: int = 64
) -> dict[int, Choice]:
    """Greedy extraction, then shared loop bodies recomputed by several readers (Inline)
    tried materialised once (Ld), kept where the program gets cheaper (each reader alone
    cannot see it); only bodies whose repeated arithmetic could pay for a launch are tried
    (decision 0079: grouped across layers, re-choosing only what a trial changes)."""
    ex = _Extractor(view, model)
    forced: dict[int, str] = {}
    best = ex.run({}, list(ex.ids), forced)
    _check_roots(best, roots)
    cost = program_cost(best, roots)
    tried: set[int] = set()

    def candidates() -> dict[tuple, list[int]]:
        """The bodies worth a trial, grouped: the same body at the same place of every
        repeated layer (equal readers, body cost and type) is one group."""
        groups: dict[tuple, list[int]] = {}
        for c, n in _references(view, best, roots).items():
            if n < 2 or c in tried or best[c].enode.op != "Inline":
                continue
            ld = next((en for en in view.classes[c] if en.op == "Ld"), None)
            t = model.types.get(ld.kids[0]) if ld is not None else None
            saving = (n - 1) * best[c].tree
            if t is None or saving <= model.machine.launch_us:
                continue
            groups.setdefault((round(saving, 6), n, repr(t)), []).append(c)
        return groups

    def trial(group: list[int]) -> bool:
        """Every class of ``group`` materialised; kept if the program gets cheaper. Only
        the bodies reading the group and the kernels evaluating them are chosen again (a
        trial's effect on choices further up is settled once, after the last trial):
        re-extracting every class above, as a deep model's residual stream would make
        each trial do, is quadratic in depth."""
        nonlocal forced, best, cost
        trial_forced = {**forced, **dict.fromkeys(group, "Ld")}
        own_backup = ex.own_vec.copy()
        got = ex.run(dict(best), ex.readers(group, best), trial_forced)
        got_cost = program_cost(got, roots) if all(r in got for r in roots) else math.inf
        if got_cost < cost - 1e-9:
            forced, best, cost = trial_forced, got, got_cost
            return True
        ex.own_vec = own_backup
        return False

    changed = False
    groups: dict[tuple, list[int]] | None = None
    for _ in range(max_tries):
        if groups is None:  # a rejected trial changes nothing: its candidates stay valid
            groups = candidates()
        if not groups:
            break
        group = groups.pop(max(groups, key=lambda k: (k[0], len(groups[k]))))
        tried.update(group)
        if trial(group):
            changed, groups = True, None  # readers and savings changed with the program
    if changed:  # the choices above the materialised bodies, on their new costs
        best = ex.run(best, list(ex.ids), forced)
        _check_roots(best, roots)
    for _ in range(4):  # a pattern whose inner values escape declines (see _escaping)
        escaping = _escaping(view, best, roots)
        if not escaping:
            break
        above: set[int] = set()
        for c in escaping:
            forced[c] = "!Custom"
            above.update(ex.ancestors(c))
        best = ex.run(best, list(above), forced)
        _check_roots(best, roots)
    return best


def _escaping(view: EGraphView, best: dict[int, Choice], roots: list[int]) -> list[int]:
    """Classes whose chosen ``Custom`` kernel came from a pattern over a written-out
    computation some of whose inner values the program also computes (a training forward
    returns them for the backward). Such a pattern declines: the kernel would recompute
    what the program computes anyway. The inner values are found through the class's other
    e-nodes (the written-out form), down to the kernel's own operands, host or device twin."""
    used = set(roots) | set(_references(view, best, roots))  # every class the program reads
    to_dev: dict[int, list[int]] = {}
    host_of: dict[int, int] = {}
    for c, enodes in view.classes.items():
        for en in enodes:
            if en.op == "ToDev":
                to_dev.setdefault(en.kids[0], []).append(c)
            if en.op == "ToHost":
                host_of[en.kids[0]] = c
    out = []
    for c in used:
        en = best[c].enode
        if en.op != "Custom":
            continue
        stop = {c}
        lst = en.kids[0]
        while True:  # the operand list: TCons (ToDev x) rest
            cons = next((e for e in view.classes[lst] if e.op == "TCons"), None)
            if cons is None:
                break
            head = cons.kids[0]
            stop.add(head)
            stop.update(e.kids[0] for e in view.classes[head] if e.op == "ToDev")
            lst = cons.kids[1]
        written = [c, host_of.get(c, c)]
        inner: set[int] = set()
        frontier = [
            k
            for w in written
            for e in view.classes[w]
            if e.op not in ("Custom", "ToHost", "ToDev", "Opaque")
            for k in e.kids
        ]
        depth = 0
        while frontier and depth < 12:
            nxt = []
            for k in frontier:
                if k in stop or k in inner:
                    continue
                if view.sort.get(k) != "Tensor":
                    continue
                if all(e.op in ot.CONSTANTS for e in view.classes[k]):
                    continue
                inner.add(k)
                for e in view.classes[k]:
                    if e.op not in ("ToHost", "ToDev"):
                        nxt.extend(e.kids)
            frontier, depth = nxt, depth + 1
        twins = {t for k in inner for t in to_dev.get(k, [])}
        if (inner | twins) & used:
            out.append(c)
    return out


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
