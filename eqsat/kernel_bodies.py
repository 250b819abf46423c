"""Kernel bodies for the lowering (``eqsat/lowering.py``): a kernel's description from the
class it computes, with its operands (what it reads, in which indexing, with which strides)
and its body expression, and where a fused producer is cut (read from memory instead of
recomputed: too deep, too many reads, or in memory anyway). A mixin of ``_Lowering``,
whose state (the e-graph view, the choice, types, placement, lowered values) it reads.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

from . import optable as ot
from .egraph import ENode
from .errors import ValidationError
from .extract import DEVICE, MOVEMENT
from .kinds import TERMS, Kind
from .program import (
    Expr,
    Kernel,
    Operand,
    Step,
    StepKind,
    indexing,
    packed_strides,
    view_strides,
)

MAX_BODY_DEPTH = 128  # nested ops in one kernel body (see _Lowering._inline_cut)


# distinct tensors a kernel reads before it reads a fused producer that is in memory anyway
# instead of recomputing it (see _Lowering._inline_cut)
MAX_FUSED_READS = 16


RECOMPUTE_WALK = 256  # body nodes _leaves walks for _inline_cut before answering "more"


class KernelBodies:
    def kernel(self, cid: int, en: ENode, out: str, dtype: str, shape) -> Kernel:
        covers = self.host_twin_names(cid)
        fused: list[str] = []
        if en.op in ("Loop", "Reduce"):
            body_cid = en.kids[0]
            domain = self.types[body_cid][1]
            leaves: list[int] = []
            self._body = self._body_reads(body_cid)
            body = self.expr(body_cid, leaves, fused)
            inputs = [self._operand(c, domain, fused) for c in leaves]
            fused = [n for n in fused if n not in covers]
            if en.op == "Loop":
                return Kernel(Kind.LOOP, out, dtype, shape, inputs, body, domain, {}, covers, fused)
            kind, dims, kd = en.attrs
            dims = tuple(sorted(d % len(domain) for d in dims)) if domain else ()
            packed = self._in_memory_order(leaves, inputs, dims, domain)
            if packed is not None:
                inputs, domain, dims = packed
            apart = self._adjacent_axes(inputs, dims, domain)
            if apart is not None:
                inputs, domain, dims = apart
            return Kernel(
                Kind.REDUCE,
                out,
                dtype,
                shape,
                inputs,
                body,
                domain,
                {"reduce": kind, "dims": dims, "keepdim": kd},
                covers,
                fused,
            )

        def library(kind: str, operands: list[int], attrs: dict) -> Kernel:
            # library calls read their operands through strides, as they lie
            inputs = [Operand(self.value(c), *self.typ(c), "strided") for c in operands]
            return Kernel(Kind(kind), out, dtype, shape, inputs, None, shape, attrs, covers)

        spec = TERMS.get(en.op)
        if spec is not None and spec.lower is not None:
            return spec.lower(en, library, self)
        raise ValidationError(f"lowering: unknown kernel {en.op}")

    def _broadcast_scalar(self, cid: int) -> tuple | None:
        """(bits, dtype) of the scalar constant a value broadcasts (``Expand`` of a
        ``Scalar``, on either side of a crossing), None for anything else. Reading it in a
        kernel is reading the constant at every index."""
        expanded = False
        while True:
            choice = self.best.get(cid)
            if choice is None:
                return None
            en = choice.enode
            if en.op == "Scalar":
                return tuple(en.attrs) if expanded else None
            if en.op == "Expand":
                expanded = True
            elif en.op not in ("ToDev", "ToHost"):
                return None
            cid = en.kids[0]

    def strides(self, cid: int) -> tuple[int, ...] | None:
        """The element strides a value has at run time, where the program decides them: a
        kernel's or an input's packed output, permutes of one, and reshapes (views by
        PyTorch's rule, or packed copies where no view exists); None where unknown."""
        choice = self.best.get(cid)
        if choice is None or cid not in self.types:
            return None
        en, shape = choice.enode, tuple(self.types[cid][1])
        if en.op in ("Permute", "View", "ToDev", "ToHost") and en.kids:
            kid = self.strides(en.kids[0])
            if kid is None:
                return None
            if en.op == "Permute":
                return tuple(kid[d] for d in en.attrs[0])
            if en.op == "View":  # a reshape that is no view copies into a packed buffer
                src = tuple(self.types[en.kids[0]][1])
                return view_strides(src, kid, shape) or packed_strides(shape)
            return kid if en.op == "ToDev" and self.io_on_device else packed_strides(shape)
        if en.op in MOVEMENT:
            return None
        return packed_strides(shape)

    def _operand(self, c: int, domain, fused: list[str]) -> Operand:
        """How a loop or reduction over ``domain`` reads class ``c``: at a division of its
        flat index when its shape broadcasts to the domain (``indexing``), through strides
        when it is a strided view. An expand of a packed value is read as that value
        broadcast (an expanded scalar, a per-row statistic): every element of the expand
        is the element of its source that broadcasting picks, so the values are the same,
        and a strided read would divide the index once per axis. The expand then needs no
        view step of its own: its graph nodes join ``fused`` (computed inside the kernel)."""
        choice = self.best.get(c)
        if choice is not None and choice.enode.op == "Expand":  # a view: strided
            src = choice.enode.kids[0]
            name = self.value(src)  # lowered first: its layout is known after
            how = indexing(self.typ(src)[1], domain)
            if self.layout.get(src) == "packed" and how != "strided":
                fused += [n for n in self.host_twin_names(c) if n not in fused]
                return Operand(name, *self.typ(src), how)
        name = self.value(c)  # sets the layout read here
        if self.layout.get(c) != "strided":
            return Operand(name, *self.typ(c), indexing(self.typ(c)[1], domain))
        return Operand(name, *self.typ(c), "strided")

    def _in_memory_order(self, leaves: list[int], inputs: list[Operand], dims, domain):
        """A reduction whose operands all lie packed in memory in one order of the domain's
        axes reads them as packed: in the domain's order (a reshape's copy) as they are, in
        another (a bias gradient summed over a transposed gradient) through a permute view
        of each, the reduction running over the axes in that order: (operands, domain,
        dims), or None. Each output reduces the same elements,
        in another order (as between any two reduction kernels); the kept axes keep their
        order, so the output is laid out as before. Read through strides, every element's
        address takes a division per axis: such reductions ran four times slower than the
        bytes they move (H200)."""
        identity = list(range(len(domain)))
        order = None
        for c, o in zip(leaves, inputs, strict=True):
            if o.indexing == "scalar":
                continue
            axes = identity  # packed or broadcast operands are read in the domain's order
            if o.indexing == "strided":
                st = self.strides(c)
                if st is None or len(st) != len(domain):
                    return None
                # its axes by decreasing stride (size-1 axes where they stand): packed?
                axes = sorted(identity, key=lambda a: (-st[a] if domain[a] > 1 else 0, a))
                if packed_strides(tuple(domain[a] for a in axes)) != tuple(st[a] for a in axes):
                    return None
            if order not in (None, axes):
                return None
            order = axes
        if order is None or all(o.indexing != "strided" for o in inputs):
            return None
        if order == identity:  # packed already (a reshape's copy): read without strides
            same = [replace(o, indexing="same") if o.indexing == "strided" else o for o in inputs]
            return same, domain, dims
        if any(o.indexing not in ("strided", "scalar") for o in inputs):
            return None  # a broadcast operand's index would not follow the new order
        if tuple(dims) == (len(domain) - 1,):
            return None  # a last-axis reduction may join a rows kernel (fuse_rows) as it is
        new_dims = tuple(sorted(order.index(d) for d in dims))
        kept = [order.index(a) for a in range(len(domain)) if a not in dims]
        if kept != sorted(kept) or new_dims != tuple(range(new_dims[0], new_dims[-1] + 1)):
            return None
        new_domain = tuple(domain[a] for a in order)
        ops = []
        for o in inputs:
            if o.indexing == "scalar":
                ops.append(o)
                continue
            key = ("in-order", o.value, tuple(order))
            name = self.done_extra.get(key)
            if name is None:
                name = self._view_step(o.value, "Permute", (tuple(order),), o.dtype, new_domain)
                self.done_extra[key] = name
            ops.append(Operand(name, o.dtype, new_domain, "same"))
        return ops, new_domain, new_dims

    def _adjacent_axes(self, inputs: list[Operand], dims, domain):
        """A reduction over axes that are not adjacent (``x.sum((0, 2))``), which the
        emitters take as one run of axes: the operands are read through views of the
        domain permuted to the kept axes (in order) followed by the reduced ones: a
        broadcast operand expanded to the domain first (stride 0), then each permuted.
        (operands, domain, dims), or None where the axes are adjacent. Each output
        reduces the same elements (in another order, as between any two reduction
        kernels); the kept axes keep their order, so the output is laid out as before."""
        if not dims or tuple(dims) == tuple(range(dims[0], dims[-1] + 1)):
            return None
        rank = len(domain)
        order = (*(a for a in range(rank) if a not in dims), *dims)
        new_domain = tuple(domain[a] for a in order)
        ops = []
        for o in inputs:
            if o.indexing == "scalar":
                ops.append(o)
                continue
            key = ("apart", o.value, order)
            name = self.done_extra.get(key)
            if name is None:
                name = o.value
                if tuple(o.shape) != tuple(domain):  # broadcast: expanded (a view) first
                    padded = (1,) * (rank - len(o.shape)) + tuple(o.shape)
                    if len(o.shape) != rank:
                        name = self._view_step(name, "View", (padded,), o.dtype, padded)
                    name = self._view_step(name, "Expand", (tuple(domain),), o.dtype, domain)
                name = self._view_step(name, "Permute", (order,), o.dtype, new_domain)
                self.done_extra[key] = name
            ops.append(Operand(name, o.dtype, new_domain, "strided"))
        return ops, new_domain, tuple(range(rank - len(dims), rank))

    def _view_step(self, src: str, op: str, attrs: tuple, dtype: str, shape) -> str:
        return self.emit(
            # named by position: two reductions may view one operand in different orders
            Step(
                StepKind.VIEW,
                f"{src}_{op.lower()}{len(self.steps)}",
                op,
                (src,),
                attrs,
                dtype,
                tuple(shape),
                DEVICE,
            )
        )

    def is_nobias(self, cid: int) -> bool:
        return any(e.op == "NoBias" for e in self.view.classes[cid])

    def _inline_cut(self, cid: int, depth: int, reads: Collection[int]) -> int | None:
        """The loop an ``Inline`` at ``depth``, in a body that reads ``reads`` so far,
        reads instead of recomputing. Extraction pays a shared producer once however many
        bodies recompute it, so without a cut a residual stream (ResNet's adds, a
        transformer's) is inlined into every later block's kernel, each re-reading every
        earlier block's tensors. So a body reads the loop's output (the same values) where
        the loop is written to memory anyway and recomputing it would read at least as
        many bytes the body does not read otherwise (a broadcast operand is read at its
        own size; reading saves the arithmetic too);
        and, whatever the loop, where the body is MAX_BODY_DEPTH deep (bounded Python
        stacks here and in the code generators, bodies Numba compiles in reasonable time)
        or reads MAX_FUSED_READS tensors already and the loop has an extracted choice."""
        loop = self._loop_of(cid)
        if loop is None or loop not in self.best:
            return None
        if depth >= MAX_BODY_DEPTH or len(reads) >= MAX_FUSED_READS:
            return loop
        if self.materialized is not None and loop in self.materialized:
            new = self._leaves(self.best[cid].enode.kids[0], RECOMPUTE_WALK) - self._body
            if -1 in new or sum(self._nbytes(c) for c in new) >= self._nbytes(loop):
                return loop
        return None

    def _nbytes(self, cid: int) -> int:
        dtype, shape = self.types[cid]
        return math.prod(shape) * ot.ITEMSIZE[dtype]

    def _loop_of(self, cid: int) -> int | None:
        """The loop whose output an ``Inline`` class holds (its ``Ld`` twin's loop)."""
        return next((t.kids[0] for t in self.view.classes[cid] if t.op == "Ld"), None)

    def _leaves(self, root: int, limit: int | None = None) -> set[int]:
        """What a body (or an inlined part of one) reads with every ``Inline`` of a loop
        written to memory anyway read from there: its ``Ld`` operands and those loops.
        Past ``limit`` nodes, a set no body holds (-1: "reads more than it can show")."""
        out: set[int] = set()
        stack, seen = [root], set()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            if limit is not None and len(seen) > limit:
                return {-1}
            e = self.best[c].enode
            if e.op == "Ld":
                if self._broadcast_scalar(e.kids[0]) is None:
                    out.add(e.kids[0])
            elif e.op == "Inline":
                loop = self._loop_of(c)
                if self.materialized and loop in self.materialized:
                    out.add(loop)
                else:
                    stack.append(e.kids[0])
            elif e.op != "ESc":
                stack += e.kids
        return out

    def _body_reads(self, root: int) -> set[int]:
        """What the body at ``root`` reads, every recomputable loop written to memory
        anyway read from there (``_inline_cut`` recomputes one only if its own reads are
        among these)."""
        return self._leaves(root) if self.materialized else set()

    def _leaf_reads(self, t: int) -> list[int]:
        """What reading loop operand ``t`` lowers first (see ``_operand``)."""
        if self._broadcast_scalar(t) is not None:
            return []
        choice = self.best.get(t)
        return [choice.enode.kids[0]] if choice and choice.enode.op == "Expand" else [t]

    def deps(self, cid: int) -> list[int]:
        """The classes ``value(cid)`` lowers before its own step: what ``lower`` and
        ``kernel`` read, walked without recursion. ``lower`` (the function) lowers them in
        post-order first, so no ``value`` call nests another."""
        en = self.best[cid].enode
        op = en.op
        if op in ("Input", "Param") or op in ot.CONSTANTS:
            return []
        if op == "ToDev" and self._constant(en.kids[0]):
            return []
        if op in ("Loop", "Reduce"):
            out: list[int] = []
            read: set[int] = set()  # ``expr``'s leaves, in the same (pre-)order
            self._body = self._body_reads(en.kids[0])
            stack = [(en.kids[0], 0)]
            while stack:
                c, depth = stack.pop()
                e = self.best[c].enode
                if e.op == "Ld":
                    out += self._leaf_reads(e.kids[0])
                    if self._broadcast_scalar(e.kids[0]) is None:
                        read.add(e.kids[0])
                elif e.op == "Inline":
                    cut = self._inline_cut(c, depth, read)
                    if cut is not None:
                        out += self._leaf_reads(cut)
                        if self._broadcast_scalar(cut) is None:
                            read.add(cut)
                    else:
                        stack.append((e.kids[0], depth + 1))
                elif e.op != "ESc":  # kids in order, as ``expr`` reads them
                    stack += [(k, depth + 1) for k in reversed(e.kids)]
            return out
        if op in ("Opaque", "Custom"):
            return self.tlist(en.kids[0])
        return [k for k in en.kids if k in self.best and not self.is_nobias(k)]

    def expr(self, cid: int, leaves: list[int], covers: list[str], depth: int = 0) -> Expr:
        en = self.best[cid].enode
        if en.op == "Inline":
            cut = self._inline_cut(cid, depth, leaves)
            if cut is not None:  # read the loop's output: a leaf, like an Ld
                if self._broadcast_scalar(cut) is None:
                    if cut not in leaves:
                        leaves.append(cut)
                    return ("in", leaves.index(cut))
        if en.op == "Ld":
            t = en.kids[0]
            c = self._broadcast_scalar(t)
            if c is not None:  # every element is the constant: no operand to read
                return ("const", *c)
            if t not in leaves:
                leaves.append(t)
            return ("in", leaves.index(t))
        if en.op == "Inline":
            for twin in self.view.classes[cid]:  # the loop this body was inlined from
                if twin.op == "Ld":
                    covers += [n for n in self.host_twin_names(twin.kids[0]) if n not in covers]
            return self.expr(en.kids[0], leaves, covers, depth + 1)
        if en.op == "ESc":
            return ("const", en.attrs[0], en.attrs[1])
        if en.op == "ECast":
            return ("cast", self.expr(en.kids[0], leaves, covers, depth + 1), en.attrs[0])
        name = en.op[1:].lower()
        return (name, *[self.expr(k, leaves, covers, depth + 1) for k in en.kids])
