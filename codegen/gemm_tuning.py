"""cuBLASLt's timed choice for a product, shared by every plan of that product in a process.

A plan times cuBLASLt's heuristic candidates on its first call's operands and keeps the
fastest. A transformer makes the same products once per layer (Qwen2-0.5B: 217 products, 9
distinct), and timing each again cost most of its first call (nvmath's autotune flushes the
L2 cache from host memory between candidates: 0.1 s a product, 22 s in all). The choice
depends only on what cuBLASLt was asked: the operands' layouts and dtype, the epilogue, the
compute type, the pointers' alignments (the heuristic's candidates differ with them) and the
GPU. Those are the key; a plan with a key seen before takes the choice without timing.
cuDNN convolution plans keep theirs the same way (``CONV_TUNINGS``: the plan index among
cuDNN's ranked candidates for the same operation graph, with its workspace and time).
"""

from __future__ import annotations

import math
from typing import Any

# cuBLASLt's largest alignment preference: a pointer aligned to 256 bytes is as good as any
ALIGN = 256


def alignment(ptr: int) -> int:
    """The alignment (bytes, at most ``ALIGN``) cuBLASLt is told a pointer has."""
    return math.gcd(ptr, ALIGN)


def device_of(ptr: int) -> int:
    """The ordinal of the GPU that owns device memory at ``ptr`` (-1 when unknown)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.pointerGetAttributes(ptr).device)
    except Exception:  # no cupy, no GPU, or not device memory: nothing to tell apart
        return -1


class Tunings:
    """key -> the choice a plan timed, with how often a choice was timed and reused."""

    def __init__(self, name: str = "gemm") -> None:
        self.name = name  # the counters' prefix in saturn.stats()
        self._choices: dict[tuple, Any] = {}
        self.timed = 0
        self.reused = 0

    def key(self, ptrs: tuple[int, ...], *problem: object) -> tuple:
        """A product's key: what it computes (``problem``: hashable layouts, epilogue,
        compute type, ...), its operands' alignments and its GPU."""
        return (*problem, tuple(alignment(p) for p in ptrs), device_of(ptrs[0]))

    def get(self, key: tuple) -> Any | None:
        choice = self._choices.get(key)
        if choice is not None:
            self.reused += 1
        return choice

    def put(self, key: tuple, choice: Any) -> None:
        self._choices[key] = choice
        self.timed += 1

    def clear(self) -> None:
        self._choices.clear()
        self.timed = self.reused = 0

    def stats(self) -> dict[str, int]:
        return {f"{self.name}_tunings": self.timed, f"{self.name}_tunings_reused": self.reused}


# one table per process: cuBLASLt's handles and algorithms are the process's
TUNINGS = Tunings("gemm")
CONV_TUNINGS = Tunings("conv")
