"""Half-precision convolutions in channels-last memory, on a lowered GPU program.

cuDNN's half-precision convolutions run on tensor cores in NHWC memory: measured on an H100
(``bench/conv_plans.py --layouts``, bfloat16, batch 32, ResNet's shapes), the chosen plan
for packed NHWC operands took 0.009-0.025 ms where NCHW took 0.027-0.056 ms, 2-3 times
as long. So a float16 or bfloat16 convolution with one group writes its output in NHWC
memory (the value the program names is a permuted view of it, the same NCHW tensor), and
reads its image and weight in NHWC memory: as they lie where they are already, else
through a copy made for it. A convolution starts channels-last only where its image is a
program input (the model's) or lies NHWC already: from the network's input the layout
travels through the convolutions and the loops between them, and stops at the first
kernel that cannot take it, so that a network of mixed layouts (depthwise convolutions,
concatenations) does not pay a copy into and out of NHWC around each convolution
(MobileNetV2 in bfloat16 took 4.72 ms against Inductor's 3.53 with every dense convolution
converted, H100). Float32 plans (no tensor cores with TF32 off: NHWC was as fast
or slower) and grouped convolutions (3x3 depthwise NHWC took 4-8 times as long) keep NCHW,
except a grouped one with kernels of at least 7 whose image lies NHWC already: ConvNeXt's
7x7 depthwise convolutions, which cuDNN runs 2.8 times as fast in NHWC (decision 0109).
With the runtime-compiled engines depthwise plans admit (decision 0111), smaller grouped
kernels are faster in NHWC too, but letting them take it lets the layout travel on to
kernels that cannot take it: EfficientNet-B0 then copied 16 full-size activations back to
NCHW before its squeeze-and-excitation reductions (planned on the CPU), so they keep NCHW.

The layout then travels: a loop over a rank-4 domain whose full-size operands all lie in
NHWC order runs over the permuted domain (N, H, W, C), so that it reads them packed and
writes its own output in NHWC memory (again a permuted view under its own name), its
per-channel operands (batch norm's, biases) read along the last axis; a kernel of a kind that
takes its axes in any order (``KindSpec.permuted``: a pad, max pooling's border) of such
a value runs over the permuted one. A channel concatenation (the importer's join: a loop
over [N, P, C, H, W] picking piece p at position p, read as [N, P * C, H, W]) whose pieces
lie NHWC runs over [N, H, W, P, C], so that the joined channels are NHWC memory too and
the next convolution reads them where they lie (SqueezeNet's Fire modules, whose joins
wrote NCHW from NHWC pieces: 499 of 1,294 us of a bfloat16 call on an H100, plus the
layout conversions cuDNN then made before each squeeze). Every value keeps its shape and its
elements; only where they lie in memory changes, and every reader reads through the
views, so the program computes the same values (the evaluator's tests compare them).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from .kinds import BY_KIND, Kind
from .op_base import HALVES
from .program import (
    Kernel,
    Operand,
    Program,
    Step,
    StepKind,
    indexing,
    packed_strides,
    renumber,
    validate,
    view_strides,
)

NHWC = (0, 2, 3, 1)  # NCHW axes in NHWC memory order
NCHW = (0, 3, 1, 2)  # back: a permute of an NHWC value to NCHW


def _permuted(seq, order) -> tuple:
    return tuple(seq[a] for a in order)


def nhwc_ordered(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether a rank-4 value lies with its axes in NHWC order in memory (strides
    decreasing along N, H, W, C, size-1 axes ignored) and its channels not broadcast."""
    if strides is None or len(shape) != 4 or shape[1] == 1 or 0 in strides:
        return False
    st = [strides[a] for a in NHWC if shape[a] > 1]
    return all(a > b for a, b in itertools.pairwise(st))


class Layouts:
    """The element strides of every value, as the program lays them out (packed kernel
    outputs and inputs, views of them), built step by step; None where unknown."""

    def __init__(self) -> None:
        self.strides: dict[str, tuple[int, ...] | None] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}

    def add(self, s: Step) -> None:
        shape = tuple(s.shape)
        self.shapes[s.output] = shape
        if s.kind != StepKind.VIEW:
            self.strides[s.output] = packed_strides(shape)
            return
        src = self.strides.get(s.args[0])
        src_shape = self.shapes.get(s.args[0])
        if src is None or src_shape is None:
            self.strides[s.output] = None
        elif s.op == "Permute":
            self.strides[s.output] = _permuted(src, s.attrs[0])
        elif s.op == "Slice":
            dim, step = s.attrs[0] % len(src), s.attrs[3]
            self.strides[s.output] = tuple(
                st * step if i == dim else st for i, st in enumerate(src)
            )
        elif s.op == "Expand":
            pad = len(shape) - len(src)
            old = (1,) * pad + src_shape
            st = (0,) * pad + src
            self.strides[s.output] = tuple(
                0 if o == 1 and n != 1 else t for o, n, t in zip(old, shape, st, strict=True)
            )
        elif s.op == "View":
            self.strides[s.output] = view_strides(src_shape, src, shape)
        else:
            self.strides[s.output] = None


class Emitter:
    """Steps appended to ``out`` and laid out in ``lay`` as they come, and views named
    after ``prefix`` (their source where none) and their position, so none is named twice
    before the program is renumbered."""

    def __init__(self, lay: Layouts, out: list[Step], prefix: str | None = None):
        self.lay, self.out, self.prefix = lay, out, prefix

    def emit(self, s: Step) -> None:
        self.out.append(s)
        self.lay.add(s)

    def view(self, src: str, op: str, attrs: tuple, dtype: str, shape, place: str) -> str:
        name = f"{self.prefix or src}_{op.lower()}{len(self.out)}"
        self.emit(Step(StepKind.VIEW, name, op, (src,), attrs, dtype, tuple(shape), place))
        return name

    def helpers(self):
        return self.emit, self.view


def channels_last(prog: Program) -> Program:
    """Half convolutions in NHWC memory and the loops and pads around them (module
    docstring)."""
    lay = Layouts()
    out: list[Step] = []
    changed = False
    emit, view = Emitter(lay, out).helpers()

    def packed(v: str, dtype: str, shape, place: str) -> str:
        """A packed copy of ``v``."""
        copy = _copy(f"{v}_packed{len(out)}", v, dtype, shape, place)
        emit(copy)
        return copy.output

    def in_nhwc(v: str, dtype: str, place: str) -> str:
        """A view of ``v`` (NCHW) whose memory is packed NHWC: ``v``'s own, or a copy's."""
        shape = lay.shapes[v]
        if _dense_nhwc(shape, lay.strides.get(v)):
            return v
        src = view(v, "Permute", (NHWC,), dtype, _permuted(shape, NHWC), place)
        copy = _copy(f"{v}_nhwc{len(out)}", src, dtype, _permuted(shape, NHWC), place)
        emit(copy)
        return view(copy.output, "Permute", (NCHW,), dtype, shape, place)

    outputs = set(prog.outputs)
    inputs = {s.output for s in prog.steps if s.kind == StepKind.INPUT}
    relaid: set[str] = set()  # values whose memory is NHWC now, and views of them
    for s in prog.steps:
        k = s.kernel
        if s.output in outputs:  # a program's output keeps the layout eager gives it
            k = None
        if k is not None and k.kind == Kind.CONV and _to_nhwc(k, k.inputs[0].value in inputs, lay):
            x = in_nhwc(k.inputs[0].value, k.dtype, s.place)
            w = in_nhwc(k.inputs[1].value, k.dtype, s.place)
            ops = [
                Operand(x, k.dtype, k.inputs[0].shape, "strided"),
                Operand(w, k.dtype, k.inputs[1].shape, "strided"),
                *k.inputs[2:],
            ]
            relaid_step(s, k, ops, {**k.attrs, "channels_last": True}, emit)
            changed = True
        elif k is not None and k.kind == Kind.LOOP and (order := _loop_order(k, lay)):
            ops = [operand_in_order(o, k.domain, lay, view, s.place, order) for o in k.inputs]
            relaid_step(s, k, ops, dict(k.attrs), emit, order)
            changed = True
        elif (
            k is not None
            and (spec := BY_KIND.get(k.kind)) is not None
            and spec.permuted is not None
            and len(k.inputs) == 1
            and len(k.shape) == 4
            and nhwc_ordered(k.inputs[0].shape, lay.strides.get(k.inputs[0].value))
        ):  # a kind whose kernel takes its axes in any order (a pad: max pooling's border)
            o = k.inputs[0]
            src = view(o.value, "Permute", (NHWC,), o.dtype, _permuted(o.shape, NHWC), s.place)
            ops = [Operand(src, o.dtype, _permuted(o.shape, NHWC), "strided")]
            relaid_step(s, k, ops, spec.permuted(k.attrs, NHWC), emit)
            changed = True
        else:
            if s.kernel is not None:
                s = _reads_fixed(s, lay, view, packed)
            emit(s)
            if s.kind == StepKind.VIEW and s.args[0] in relaid:
                relaid.add(s.output)
            continue
        relaid.add(s.output)
    if not changed:
        return prog
    # an output that views NHWC memory now (a permute, slice or reshape of a relaid value)
    # is written packed, as it was: its strides are what eager's would be
    names = []
    for v in prog.outputs:
        if v in relaid:
            step = next(s for s in out if s.output == v)
            v = packed(v, step.dtype, lay.shapes[v], step.place)
        names.append(v)
    new = renumber(Program(out, names, prog.inputs))
    validate(new)
    return new


def packed_like(shape, strides) -> bool:
    """Whether ``strides`` lay ``shape`` out packed (size-1 axes' strides aside)."""
    return strides is not None and all(
        n == 1 or a == b for n, a, b in zip(shape, strides, packed_strides(shape), strict=True)
    )


def _rest(o: Operand) -> tuple:
    return (o.dtype, o.shape, o.indexing)


def _reads_fixed(s: Step, lay: Layouts, view, packed) -> Step:
    """Kernel step ``s``, not relaid itself, reading each operand as it now lies: an
    operand read as packed ("same", or a broadcast by its flat index) that lies in NHWC
    memory now is read through its strides by a loop, and through a packed copy by any
    other kernel."""
    k = s.kernel
    ops = []
    for o in k.inputs:
        if o.indexing in ("strided", "scalar") or packed_like(o.shape, lay.strides.get(o.value)):
            ops.append(o)
        elif k.kind == Kind.LOOP:
            name, dom = o.value, tuple(k.domain)
            if tuple(o.shape) != dom:
                padded = (1,) * (len(dom) - len(o.shape)) + tuple(o.shape)
                if padded != tuple(o.shape):
                    name = view(name, "View", (padded,), o.dtype, padded, s.place)
                name = view(name, "Expand", (dom,), o.dtype, dom, s.place)
            ops.append(Operand(name, o.dtype, dom, "strided"))
        else:
            ops.append(Operand(packed(o.value, o.dtype, o.shape, s.place), *_rest(o)))
    if all(a is b for a, b in zip(ops, k.inputs, strict=True)):
        return s
    kernel = replace(k, inputs=ops)
    return replace(s, kernel=kernel, args=tuple(o.value for o in ops))


def _dense_nhwc(shape, strides) -> bool:
    """Whether a rank-4 value's memory is packed NHWC, size-1 axes aside (as PyTorch's
    channels-last contiguity has it): a packed 1x1 convolution's weight [K, C, 1, 1] or
    a depthwise one [C, 1, kh, kw] lies so already and needs no copy. The runner hands
    cuDNN such an operand with channels-last strides (``runner_plans``)."""
    return strides is not None and packed_like(_permuted(shape, NHWC), _permuted(strides, NHWC))


def _half_dense_conv(k: Kernel) -> bool:
    return (
        k.dtype in HALVES
        and k.attrs.get("groups") == 1
        and len(k.shape) == 4
        and not k.attrs.get("channels_last")
    )


def _to_nhwc(conv: Kernel, image_is_input: bool, lay: Layouts) -> bool:
    """Whether a convolution goes channels-last: a dense half one whose image is a program
    input or lies NHWC, a grouped one (``_half_grouped_conv``) whose image lies NHWC."""
    x = conv.inputs[0]
    lies_nhwc = nhwc_ordered(x.shape, lay.strides.get(x.value))
    if _half_dense_conv(conv):
        return image_is_input or lies_nhwc
    return _half_grouped_conv(conv) and lies_nhwc


GROUPED_NHWC_MIN_KERNEL = 7  # the smallest kernel extent of a grouped convolution in NHWC


def _half_grouped_conv(k: Kernel) -> bool:
    """A float16/bfloat16 grouped convolution cuDNN runs faster in NHWC memory than in
    NCHW (module docstring): kernels of at least ``GROUPED_NHWC_MIN_KERNEL`` along both
    spatial axes; it goes channels-last only where its image lies NHWC already."""
    return (
        k.dtype in HALVES
        and k.attrs.get("groups", 1) > 1
        and len(k.shape) == 4
        and not k.attrs.get("channels_last")
        and min(k.inputs[1].shape[2:]) >= GROUPED_NHWC_MIN_KERNEL
    )


# a channel concatenation as the importer writes it (``_h_cat``): a loop over
# [N, P, C, H, W], piece p of C channels at position p of the new axis, viewed as
# [N, P * C, H, W] by its reader; in NHWC memory order [N, H, W, P, C], so that view is
# NHWC memory of P * C channels
CAT_NHWC = (0, 3, 4, 1, 2)


def _loop_order(k: Kernel, lay: Layouts) -> tuple[int, ...] | None:
    """The memory order a loop runs over where its full-size operands (at least one) all
    lie in it: NHWC for a rank-4 loop, [N, H, W, P, C] for a rank-5 channel concatenation
    (``CAT_NHWC``; an axis an operand broadcasts, the piece axis of each piece, aside).
    None where they do not."""
    dom = tuple(k.domain)
    if tuple(k.shape) != dom:
        return None
    full = [o for o in k.inputs if tuple(o.shape) == dom]
    if not full:
        return None
    if len(dom) == 4 and dom[1] != 1:
        if all(nhwc_ordered(dom, lay.strides.get(o.value)) for o in full):
            return NHWC
        return None
    if len(dom) == 5 and dom[1] > 1 and dom[2] > 1:
        if all(_ordered(dom, lay.strides.get(o.value), CAT_NHWC) for o in full):
            return CAT_NHWC
    return None


def _ordered(shape, strides, order) -> bool:
    """Whether strides decrease along ``order`` (size-1 and broadcast axes aside), the
    last axis of ``order`` read (not broadcast)."""
    if strides is None or strides[order[-1]] == 0:
        return False
    st = [strides[a] for a in order if shape[a] > 1 and strides[a] != 0]
    return all(a > b for a, b in itertools.pairwise(st))


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(order)
    for i, a in enumerate(order):
        inv[a] = i
    return tuple(inv)


def operand_in_order(o: Operand, dom, lay: Layouts, view, place: str, order=NHWC) -> Operand:
    """How the loop over the domain permuted by ``order`` reads operand ``o``."""
    fine = _permuted(dom, order)
    if o.indexing == "scalar":
        return o
    padded = (1,) * (len(dom) - len(o.shape)) + tuple(o.shape)
    name = o.value
    if padded != tuple(o.shape):
        name = view(name, "View", (padded,), o.dtype, padded, place)
    shape = _permuted(padded, order)
    name = view(name, "Permute", (order,), o.dtype, shape, place)
    strides = lay.strides.get(name)
    if shape == fine and packed_like(fine, strides):
        return Operand(name, o.dtype, fine, "same")
    how = indexing(shape, fine)
    if how == "strided" or shape == fine or not packed_like(shape, strides):
        if shape != fine:
            name = view(name, "Expand", (fine,), o.dtype, fine, place)
        return Operand(name, o.dtype, fine, "strided")
    return Operand(name, o.dtype, shape, how)


def relaid_step(s: Step, k: Kernel, ops: list[Operand], attrs: dict, emit, order=NHWC) -> None:
    """Step ``s`` writing memory in ``order`` (NHWC): the kernel over the permuted shape (a
    convolution is still handed NCHW extents, over this memory: ``channels_last``), then
    the permuted view back to ``s``'s shape under ``s``'s name."""
    shape = _permuted(tuple(k.shape), order)
    kernel = Kernel(
        k.kind,
        f"{s.output}_nhwc",
        k.dtype,
        shape,
        ops,
        k.body,
        shape,
        attrs,
        k.covers,
        k.fused,
        k.epilogue,
        k.stages,
    )
    emit(
        Step(
            StepKind.KERNEL,
            kernel.output,
            s.op,
            tuple(o.value for o in ops),
            s.attrs,
            s.dtype,
            shape,
            s.place,
            kernel,
            s.covers,
        )
    )
    emit(
        Step(
            StepKind.VIEW,
            s.output,
            "Permute",
            (kernel.output,),
            (_inverse(order),),
            s.dtype,
            tuple(s.shape),
            s.place,
        )
    )


def _copy(name: str, src: str, dtype: str, shape, place: str) -> Step:
    """A loop copying view ``src`` into packed memory of ``shape``."""
    k = Kernel(
        Kind.LOOP,
        name,
        dtype,
        tuple(shape),
        [Operand(src, dtype, tuple(shape), "strided")],
        ("in", 0),
        tuple(shape),
        {},
    )
    return Step(StepKind.KERNEL, name, "", (src,), (), dtype, tuple(shape), place, k)
