"""Analyses over the saturated e-graph, the cost model, and DAG-aware extraction.

Analyses (type, placement) are computed per e-node from its children and must agree
across every e-node of a class: a disagreement means a rule made two different values
equal, and raises ``ValidationError`` naming the class and the e-nodes.

Extraction is greedy and DAG-aware: each class's best choice carries the set of classes its
sub-program uses, with their own costs, and a shared class is paid once. A choice whose
sub-program contains its own class is skipped, so the result is acyclic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import optable as ot
from . import types as tyr
from .costs import Machine
from .egraph import EGraphView, ENode
from .errors import ValidationError
from .graph import Graph

Type = tuple[str, tuple[int, ...]]  # (dtype, shape)
KERNELS = ("Loop", "Reduce", "Gemm", "Conv", "Custom")
MOVEMENT = ("View", "Permute", "Expand")
HOST, DEVICE = "host", "device"


# --- analyses -----------------------------------------------------------------------------


def _enode_type(en: ENode, ty: dict[int, Type], cls_of_opaque: dict[int, Type]) -> Type | None:
    """The type an e-node computes, or None while a child's type is unknown."""
    op = en.op
    # a bias may be NoBias; a TList is typed by its head alone
    need = en.kids[:2] if op in ("Gemm", "Conv") else en.kids[:1] if op == "TCons" else en.kids
    kids = []
    for k in need:
        if k not in ty:
            return None
        kids.append(ty[k])
    if op in ("ToDev", "ToHost", "Loop", "Inline", "Ld", "TCons"):
        return kids[0]  # a TList is typed by its head, so a Custom op by its first operand
    if op == "ESc":
        return (en.attrs[1], ())
    if op in ("TNil", "NoBias", "Opaque", "Item", "Input", "Param"):
        return None  # typed from the graph (seeded) or not a value
    if op == "Reduce":
        kind, dims, kd = en.attrs
        dtype, shape = kids[0]
        if kind in ("sum", "prod") and not ot.is_float(dtype):
            dtype = "i64"
        return (dtype, tyr.reduce_shape(shape, dims, kd))
    if op == "Gemm":
        (da, a), (_, b) = kids[0], kids[1]
        return (da, tyr.shape_of(ot.op("BatchMatMul" if len(a) == 3 else "MatMul"), [a, b], ()))
    if op == "Conv":
        return (kids[0][0], tyr.conv_shape(kids[0][1], kids[1][1], *en.attrs))
    if op == "Custom":
        return kids[0]  # saturn's custom kernels keep their first operand's type
    if op.startswith("E") and op[1:] in ot.BY_NAME:
        row = ot.op(op[1:])
        attrs = en.attrs
    else:
        row = ot.op(op)
        attrs = en.attrs
        if row.category == ot.LEAF:
            return (en.attrs[1], ()) if op == "Scalar" else None
    dtype = tyr.result_dtype(row, [k[0] for k in kids], attrs)
    shape = tyr.shape_of(row, [k[1] for k in kids], attrs)
    return (dtype, shape)


def infer_types(view: EGraphView, graph: Graph) -> dict[int, Type]:
    ty: dict[int, Type] = {}
    for name, cid in view.named.items():
        n = graph.nodes[name]
        ty[cid] = (n.dtype, tuple(n.shape))
    changed = True
    while changed:
        changed = False
        for cid, enodes in view.classes.items():
            for en in enodes:
                try:
                    t = _enode_type(en, ty, {})
                except (ValueError, KeyError, IndexError) as e:
                    raise ValidationError(f"type analysis: class {cid} e-node {en}: {e}") from None
                if t is None:
                    continue
                t = (t[0], tuple(t[1]))
                if cid not in ty:
                    ty[cid] = t
                    changed = True
                elif ty[cid] != t:
                    raise ValidationError(
                        f"type analysis: class {cid} holds values of two types: "
                        f"{ty[cid]} and {t} (from {en}); a rule equated different values"
                    )
    return ty


def infer_placement(view: EGraphView) -> dict[int, str]:
    """host or device for every Tensor class; every e-node of a class must agree."""
    place: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for cid, enodes in view.classes.items():
            if view.sort[cid] != "Tensor":
                continue
            for en in enodes:
                if en.op in KERNELS or en.op == "ToDev":
                    p = DEVICE
                elif en.op == "NoBias":
                    continue
                elif en.op in MOVEMENT:
                    if en.kids[0] not in place:
                        continue
                    p = place[en.kids[0]]
                else:
                    p = HOST
                if cid not in place:
                    place[cid] = p
                    changed = True
                elif place[cid] != p:
                    raise ValidationError(
                        f"placement analysis: class {cid} is both {place[cid]} and {p} "
                        f"(e-node {en})"
                    )
    return place


# --- cost model ---------------------------------------------------------------------------


def nbytes(t: Type) -> int:
    return math.prod(t[1]) * ot.ITEMSIZE[t[0]]


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
        if op in ("Input", "Param", "Scalar", "NoBias", "TNil", "TCons", "Item"):
            return 0.0
        if op in ("ToDev", "ToHost"):
            kid = en.kids[0]
            if self.io_on_device and op == "ToDev" and _is_leaf(view, kid):
                return 0.0  # the input already lives on the device
            return self.crossing(self.types[kid])
        if op in MOVEMENT:
            return m.view_us
        if op == "Ld":
            return nbytes(self.types[en.kids[0]]) / m.device_bytes_per_us
        if op in ("Inline", "ESc"):
            return 0.0
        if op.startswith("E") and op[1:] in ot.BY_NAME:
            return math.prod(t[1]) * ot.op(op[1:]).flops / m.device_flops_per_us
        if op in ("Loop", "Reduce", "Custom"):
            return m.launch_us + nbytes(t) / m.device_bytes_per_us
        if op in ("Gemm", "Conv"):
            a, b = self.types[en.kids[0]], self.types[en.kids[1]]
            k = a[1][-1] if op == "Gemm" else math.prod(b[1][1:])
            flops = 2 * math.prod(t[1]) * k
            return (
                m.library_call_us
                + flops / m.gemm_flops_per_us
                + (nbytes(a) + nbytes(b) + nbytes(t)) / m.device_bytes_per_us
            )
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

    Tensor classes are shared across the program and paid once (``uses``). Loop bodies
    (Expr classes) belong to the kernel that evaluates them: their arithmetic is ``tree``,
    paid again by every kernel that inlines the same body, and they never enter ``uses``.
    """

    enode: ENode
    own: float
    uses: dict[int, float]  # Tensor classes of the sub-program (itself included) -> own cost
    tree: float = 0.0  # Expr classes: per-kernel cost of the body under this choice
    exprs: frozenset[int] = frozenset()  # Expr classes under this choice (cycle checks)

    @property
    def total(self) -> float:
        return sum(self.uses.values()) + self.tree


def _consider(
    cid: int, en: ENode, sort: str, best: dict[int, Choice], model: CostModel, view: EGraphView
) -> Choice | None:
    uses: dict[int, float] = {}
    exprs: set[int] = set()
    tree = 0.0
    for k in en.kids:
        kc = best[k]
        uses.update(kc.uses)
        exprs |= kc.exprs
        if view.sort[k] == "Expr":
            exprs.add(k)
            tree += kc.tree
    if cid in uses or cid in exprs:
        return None  # would read itself: a cycle
    own = model.cost(cid, en, view)
    if sort == "Expr":
        return Choice(en, own, uses, tree + own, frozenset(exprs))
    if en.op in ("Loop", "Reduce"):
        own += tree  # the kernel evaluates its body once per element
    uses[cid] = own
    return Choice(en, own, uses, 0.0, frozenset(exprs))


def extract(
    view: EGraphView,
    model: CostModel,
    roots: list[int] | None = None,
    forced: dict[int, str] | None = None,
) -> dict[int, Choice]:
    """Greedy DAG extraction: the cheapest acyclic choice per class, shared values once.

    ``forced`` restricts a class to e-nodes of one op (used by ``extract_shared``)."""
    forced = forced or {}
    best: dict[int, Choice] = {}
    changed = True
    rounds = 0
    while changed:
        changed = False
        rounds += 1
        if rounds > 10 * len(view.classes) + 10:
            raise ValidationError("extraction did not converge")
        for cid, enodes in view.classes.items():
            sort = view.sort[cid]
            cur = best.get(cid)
            if cur is not None and any(
                k not in best or cid in best[k].uses or cid in best[k].exprs for k in cur.enode.kids
            ):
                del best[cid]  # a child's new choice reads this class: the choice is stale
                changed = True
            for en in enodes:
                if any(k not in best for k in en.kids):
                    continue
                if cid in forced and en.op != forced[cid]:
                    continue
                choice = _consider(cid, en, sort, best, model, view)
                if choice is None:
                    continue
                cur = best.get(cid)
                if cur is None or choice.total < cur.total - 1e-9:
                    best[cid] = choice
                    changed = True
    for r in roots if roots is not None else view.outputs:
        if r not in best:
            raise ValidationError(f"extraction found no acyclic program for output class {r}")
    return best


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
    view: EGraphView, model: CostModel, roots: list[int], max_tries: int = 32
) -> dict[int, Choice]:
    """Greedy extraction, then a pass over shared loop bodies: a body recomputed by several
    readers (Inline) is tried materialised once (Ld) and kept so if the whole program gets
    cheaper. Greedy choice alone cannot see this: each reader decides by itself."""
    forced: dict[int, str] = {}
    best = extract(view, model, roots)
    cost = program_cost(best, roots)
    tried: set[int] = set()
    for _ in range(max_tries):
        refs = _references(view, best, roots)
        candidates = [
            c
            for c, n in refs.items()
            if n > 1
            and c not in tried
            and best[c].enode.op == "Inline"
            and any(en.op == "Ld" for en in view.classes[c])
        ]
        if not candidates:
            break
        c = candidates[0]
        tried.add(c)
        trial = extract(view, model, roots, {**forced, c: "Ld"})
        trial_cost = program_cost(trial, roots)
        if trial_cost < cost - 1e-9:
            forced[c], best, cost = "Ld", trial, trial_cost
    return best


def program_cost(best: dict[int, Choice], roots: list[int]) -> float:
    """Total cost of the extracted program for these roots, each class once."""
    uses: dict[int, float] = {}
    for r in roots:
        uses.update(best[r].uses)
    return sum(uses.values())
