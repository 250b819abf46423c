"""What the emitters produce and the builders consume: a generated kernel's module source,
name, parameters and launch style. A leaf module (``cuda`` emits these, ``cubins`` builds
them)."""

from __future__ import annotations

from dataclasses import dataclass

THREADS = 256  # threads per block of the generated kernels


@dataclass
class Params:
    """The kernel's parameters in order: pointers, then int64 sizes and strides."""

    pointers: list[str]
    ints: list[str]

    def signature(self) -> str:
        return ", ".join(self.pointers + self.ints)


@dataclass
class Generated:
    name: str
    source: str  # a module defining the kernel function (no decorator)
    params: Params
    pointer_types: list[str]  # numba scalar type of each pointer parameter
    style: str = "loop"
    lanes: int = 1  # elements per vector access (loops)
    threads: int = THREADS  # per block
    # (pointer parameter, bytes): the alignment each vector-accessed pointer needs
    aligned: tuple[tuple[int, int], ...] = ()

    def misaligned(self, ptrs: list[int]) -> bool:
        """Whether any vector-accessed pointer breaks the alignment the kernel assumes."""
        return any(ptrs[p] % a for p, a in self.aligned)
