"""Grids that split another's axes: what lets a kernel run over a finer grid than the
value it reads or writes (a reshape that splits axes keeps every packed value's flat
order), used by the loop and rows fusions through reshapes."""

from __future__ import annotations

import math

from .program import Operand, indexing


def refinement(fine: tuple[int, ...], coarse: tuple[int, ...]) -> list[list[int]] | None:
    """For each axis of ``coarse``, the sizes of the consecutive axes of ``fine`` it splits
    into (a size-1 axis of ``coarse`` takes a size-1 axis of ``fine`` where one stands
    there, else none; size-1 axes of ``fine`` inside a split join it; trailing ones join
    the last group), or None where ``fine`` does not refine ``coarse``."""
    if math.prod(fine) != math.prod(coarse):
        return None
    groups: list[list[int]] = []
    i = 0
    for n in coarse:
        g: list[int] = []
        if n == 1:
            if i < len(fine) and fine[i] == 1:
                g.append(1)
                i += 1
        else:
            p = 1
            while i < len(fine) and p < n:
                p *= fine[i]
                g.append(fine[i])
                i += 1
            if p != n:
                return None
        groups.append(g)
    if any(s != 1 for s in fine[i:]):
        return None
    if groups:
        groups[-1] += list(fine[i:])
    elif len(fine) > i:
        return None
    return groups


def split_shape(shape: tuple[int, ...], domain: tuple[int, ...], groups) -> tuple[int, ...]:
    """``shape`` (broadcasting to ``domain``) with each axis split as ``groups`` splits the
    domain's: a full axis into the group's sizes, a broadcast one into ones."""
    padded = (1,) * (len(domain) - len(shape)) + tuple(shape)
    out: list[int] = []
    for n, d, g in zip(padded, domain, groups, strict=True):
        out += g if n == d else [1] * len(g)
    return tuple(out)


def unpadded(shape) -> tuple[int, ...]:
    """A shape without its leading unit axes: operands are read right-aligned (strides,
    broadcasts), so a loop over (1, n, m) computes inside a rows kernel over (n, m)."""
    shape = tuple(shape)
    k = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    return shape[k:]


def regridded(o: Operand, coarse: tuple[int, ...], fine: tuple[int, ...]) -> Operand | None:
    """Operand ``o`` of a kernel over ``coarse`` read by one over ``fine`` (which refines
    it) with no view of its own, or None where that needs one: a packed ("same") operand
    at the same flat index, a scalar as it is, any other where its axes split into ones
    only (it broadcasts along every split axis, so read right-aligned over ``fine`` it is
    the same value): strided keeps its strides, a broadcast its new indexing."""
    if o.indexing in ("same", "scalar"):
        return o
    groups = refinement(fine, coarse)
    if groups is None or len(o.shape) > len(coarse):
        return None
    if unpadded(split_shape(tuple(o.shape), coarse, groups)) != unpadded(o.shape):
        return None
    how = o.indexing if o.indexing == "strided" else indexing(tuple(o.shape), fine)
    return Operand(o.value, o.dtype, tuple(o.shape), how)
