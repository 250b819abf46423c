"""The memory order of a reshape that has to copy, when a GEMM reads the result.

A reshape of a permuted tensor (attention's key, ``[B, L, H, D] -> [B, H, D, L] ->
[B*H, D, L]``) cannot be a view, so the executor copies it. A packed copy in the new
shape's order transposes the last two axes (a tiled transpose, the slowest copy); a copy
that keeps the source's fastest axis fastest is a row copy, and the GEMM that reads the
result takes the transposed matrix from its strides at no cost. ``gemm_copy_order`` says
which order to copy in.
"""

from __future__ import annotations


def reshape_groups(shape, new_shape) -> list[tuple[list[int], list[int]]] | None:
    """The runs of source axes and of new axes whose extents multiply to the same number
    (the axes a reshape merges or splits), in order; axes of extent 1 join the run before
    them (or the first). None when the extents do not match."""
    src = [d for d, n in enumerate(shape) if n != 1]
    dst = [d for d, n in enumerate(new_shape) if n != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i == len(src) or j == len(dst):
            return None
        gs, gd = [src[i]], [dst[j]]
        ps, pd = shape[src[i]], new_shape[dst[j]]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd and i < len(src):
                gs.append(src[i])
                ps *= shape[src[i]]
                i += 1
            elif pd < ps and j < len(dst):
                gd.append(dst[j])
                pd *= new_shape[dst[j]]
                j += 1
            else:
                return None
        groups.append((gs, gd))
    if not groups:
        return None
    for d, n in enumerate(shape):  # extent-1 source axes ride with their neighbours
        if n == 1:
            g = next((g for g in reversed(groups) if g[0] and g[0][0] < d), groups[0])
            g[0].append(d)
            g[0].sort()
    return groups


def gemm_copy_order(shape, strides, new_shape) -> tuple[int, ...] | None:
    """The order of the source's axes to copy in (a permutation, outermost first) so that
    the result, reshaped to ``new_shape``, is the transposed matrix a GEMM can read: when
    the new shape's last two axes each come from their own run of source axes and the
    source's fastest axis is in the run of the second-to-last. None when a packed copy in
    the new shape's order is already the source's order."""
    if len(new_shape) < 2:
        return None
    groups = reshape_groups(shape, new_shape)
    if groups is None or len(groups) < 2:
        return None
    rows, cols = groups[-2], groups[-1]
    last2 = {len(new_shape) - 2, len(new_shape) - 1}
    if rows[1] != [len(new_shape) - 2] or cols[1] != [len(new_shape) - 1]:
        return None
    if any(d in last2 for g in groups[:-2] for d in g[1]):
        return None

    def fastest(g) -> int:
        # a broadcast axis (stride 0) repeats elements: it is no run's fastest
        return min((abs(strides[d]) for d in g[0] if shape[d] > 1 and strides[d]), default=0)

    if fastest(rows) >= fastest(cols):
        return None
    order = [d for g in groups[:-2] for d in g[0]] + cols[0] + rows[0]
    return tuple(order)
