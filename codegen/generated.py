"""What the emitters produce and the builders consume: a generated kernel's module source,
name, parameters and launch style, and how each dtype sits in a kernel's memory. A leaf
module (``cuda`` and ``movement`` emit these, ``cubins`` builds them)."""

from __future__ import annotations

from dataclasses import dataclass

THREADS = 256  # threads per block of the generated kernels

NUMBA_SCALAR = {
    "bool": "boolean",
    "u8": "uint8",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "f32": "float32",
    "f64": "float64",
}


# How each dtype sits in memory (pointer element types): bools are bytes; bfloat16, which
# Numba has no type for, is the upper 16 bits of a float32 (codegen/halfbits.py).
MEMORY_TYPE = {**NUMBA_SCALAR, "bool": "uint8", "f16": "float16", "bf16": "uint16"}


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
    row_threads: int = 32  # threads sharing a row (rows kernels of a warp or part of one)
    # (pointer parameter, bytes): the alignment each vector-accessed pointer needs
    aligned: tuple[tuple[int, int], ...] = ()

    def misaligned(self, ptrs: list[int]) -> bool:
        """Whether any vector-accessed pointer breaks the alignment the kernel assumes."""
        return any(ptrs[p] % a for p, a in self.aligned)
