"""Thin access to the runtime queries the C++ extension registers (``saturn_rt``)."""

from __future__ import annotations

import logging

import torch

from . import _build

log = logging.getLogger("saturn")
_loaded = False
_reason_logged = False


def load() -> None:
    """Build (if needed) and load the C++ extension, then name the device ``saturn``."""
    global _loaded
    if _loaded:
        return
    torch.utils.rename_privateuse1_backend("saturn")
    torch.ops.load_library(str(_build.build()))
    _loaded = True


def ops():
    return torch.ops.saturn_rt


def device_count() -> int:
    """Number of saturn devices: saturn:0 (the CPU reference device) plus the GPUs."""
    global _reason_logged
    n = ops().device_count()
    if n == 1 and not _reason_logged:
        _reason_logged = True
        log.info("saturn: no GPU devices (%s); saturn:0 works", gpu_unavailable_reason())
    return n


def gpu_unavailable_reason() -> str:
    return ops().gpu_unavailable_reason()


COUNTER_NAMES = (
    "allocated",
    "reserved",
    "peak_allocated",
    "peak_reserved",
    "hits",
    "misses",
    "retries",
    "failures",
    "allocations",
)


def memory_counters(index: int) -> dict[str, int]:
    return dict(zip(COUNTER_NAMES, ops().memory_counters(index), strict=True))


def fallback_counts() -> dict[str, int]:
    names, counts = ops().fallback_counts()
    return dict(zip(names, counts, strict=True))
