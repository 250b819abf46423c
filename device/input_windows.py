"""Graph inputs read in place as windows of a packed region (decision 0130).

A training step's backward graph takes tensors the forward saved, and AOTAutograd saves
views: a linear layer's transposed weight (a permutation of a packed tensor), attention's
q, k and v (slices of the fused projection's output, their heads permuted), a class
token (one row of each sequence). A recipe reads its inputs packed, so each such input
was copied at every call, and on a GPU also staged, which turned off the one-pass replay.

A ``Window`` describes such an input as a window of a packed *region* of the same
storage: the input's axes in stride order, with *gap* axes for the elements between
(another head's slot, the other rows of a sequence). The program declares the region as
its input and reads the window through views (a slice per gap axis, a permutation back to
the input's axis order); a call hands over the region (``as_strided`` on the caller's
storage, no copy) when its tensor is laid out as traced and the region lies inside its
storage, and a packed copy of the region otherwise (the gap elements left unwritten: the
program never reads them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from saturn.eqsat.program import packed_strides


@dataclass(frozen=True)
class Window:
    region: tuple[int, ...]  # the packed region's extents, outer axis first
    gaps: tuple[tuple[int, int], ...]  # (region axis, index) of each gap axis, outer first
    order: tuple[int, ...]  # region-order real axes -> the input's non-unit axes (a perm)
    shape: tuple[int, ...]  # the input's shape and strides as traced
    strides: tuple[int, ...]
    rel: int  # elements from the region's start to the input's first element
    region_strides: tuple[int, ...]  # the region's (packed)

    @property
    def numel(self) -> int:
        return math.prod(self.region)

    def fits(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (of the traced shape) is laid out as traced with the region inside
        its storage. A unit axis's stride is not compared: no element is read along it, and
        PyTorch gives such axes whatever stride the op that made them computed."""
        st = t.stride()
        if len(st) != len(self.strides) or any(
            n > 1 and a != b for n, a, b in zip(self.shape, st, self.strides, strict=True)
        ):
            return False
        start = t.storage_offset() - self.rel
        return start >= 0 and (start + self.numel) * t.element_size() <= (
            t.untyped_storage().nbytes()
        )

    def read(self, t: torch.Tensor) -> torch.Tensor | None:
        """The region around ``t`` as a packed view of its storage, or None where ``t`` does
        not fit (``fits``)."""
        if not self.fits(t):
            return None
        return t.as_strided(self.region, self.region_strides, t.storage_offset() - self.rel)

    def packed(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A region of its own on ``device`` holding ``t`` where the program reads it."""
        buf = torch.empty(self.region, dtype=t.dtype, device=device)
        buf.as_strided(self.shape, self.strides, self.rel).copy_(t)
        return buf


def window_of(val) -> Window | None:
    """The window a non-contiguous example value ``val`` is read through, or None where it
    is packed already, has symbolic sizes, overlaps itself (a stride 0 over more than one
    element) or its region would not lie inside its storage."""
    if not isinstance(val, torch.Tensor) or val.is_contiguous() or val.numel() == 0:
        return None
    shape, strides = tuple(val.shape), tuple(val.stride())
    if not all(type(s) is int for s in (*shape, *strides)):
        return None
    dims = _region_dims(shape, strides)
    if dims is None:
        return None
    region = tuple(n for n, _ in dims)
    region_strides = packed_strides(region)
    try:
        offset = int(val.storage_offset())
        size = val.untyped_storage().nbytes() // val.element_size()
    except Exception:  # a storage the example value does not describe
        return None
    # each gap axis at the index the input's offset has there: the region then starts at
    # the aligned boundary before it (attention's k and v share q's region)
    gaps, rel = [], 0
    for j, (n, a) in enumerate(dims):
        if a is None:
            index = (offset // region_strides[j]) % n
            gaps.append((j, index))
            rel += index * region_strides[j]
    start = offset - rel
    if start < 0 or start + math.prod(region) > size:
        return None
    axes = [a for _, a in dims if a is not None]
    order = tuple(axes.index(a) for a in sorted(axes))
    return Window(region, tuple(gaps), order, shape, strides, rel, tuple(region_strides))


def _region_dims(shape, strides) -> list[tuple[int, int | None]] | None:
    """The packed region around a layout, outer axis first: (extent, the layout's axis or
    None for a gap); None where the layout overlaps itself or is not nested."""
    real = sorted((a for a in range(len(shape)) if shape[a] > 1), key=lambda a: (strides[a], a))
    dims: list[tuple[int, int | None]] = []  # inner first
    step = 1
    for a in real:
        if strides[a] < step or strides[a] % step:
            return None
        if strides[a] > step:
            dims.append((strides[a] // step, None))
            step = strides[a]
        dims.append((shape[a], a))
        step *= shape[a]
    return dims[::-1]
