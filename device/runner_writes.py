"""The input writes a GPU call makes itself, as its last work (``GpuRunner.in_place``: an
optimizer's new parameters and state, a norm's running statistics): small packed ones a
few to a launch, the rest one copy each. A group is a loop group
(``codegen/cuda_group.py``) copying each value by its element width, so every bit is
kept (a NaN's payload, a bool's byte); built with the runner's other kernels, before the
first call."""

from __future__ import annotations

import math

from saturn.codegen import cuda as cg
from saturn.codegen.cuda_group import WIDTH, copy_group
from saturn.eqsat.horizontal import GROUP_MAX, GROUP_NUMEL_MAX

from .eager_kernels import strided_copy


class WriteBack:
    """``writes``: (input position, value, dtype, shape) of each write, in order."""

    def __init__(self, writes: list[tuple[int, str, str, tuple]], cc: tuple[int, int]) -> None:
        small, self.single = [], []
        for i, v, dtype, shape in writes:
            n = math.prod(shape)
            width = cg.MEMORY_SIZE[dtype]
            (small if 0 < n <= GROUP_NUMEL_MAX and width in WIDTH else self.single).append(
                (i, v, width, n)
            )
        # (members, kernel, its operands' shapes and strides: packed, flat)
        self.groups: list[tuple[list[tuple[int, str, int, int]], cg.CudaKernel, list, list]] = []
        for at in range(0, len(small), GROUP_MAX):
            members = small[at : at + GROUP_MAX]
            if len(members) == 1:
                self.single += members
                continue
            k = cg.CudaKernel(copy_group([(w, n) for *_, w, n in members]), cc)
            self.groups.append((members, k, [(n,) for *_, n in members], [(1,)] * len(members)))

    def expected(self) -> list:
        """The group kernels' variants, to build before the first call."""
        return [g for _, k, *_ in self.groups for g in k.expected()]

    def run(self, env: dict, prepared: list, stream: int) -> None:
        for members, kernel, shapes, strides in self.groups:
            src = [env[v] for _, v, *_ in members]
            dst = [prepared[i] for i, *_ in members]
            packed = all(
                s.is_contiguous() and d.is_contiguous() and s.numel() == d.numel() == n
                for s, d, (*_, n) in zip(src, dst, members, strict=True)
            )
            if not packed:  # an input given strided: a copy each, as written
                for s, d in zip(src, dst, strict=True):
                    strided_copy(s, d)
                continue
            kernel.launch(
                stream,
                dst[0].data_ptr(),
                [s.data_ptr() for s in src],
                shapes,
                strides,
                stat_ptrs=tuple(d.data_ptr() for d in dst[1:]),
            )
        for i, v, *_ in self.single:
            strided_copy(env[v], prepared[i])
