"""``torch.saturn``: the device module PyTorch looks up for the ``saturn`` device.

saturn:0 is the CPU reference device (host memory) and always exists; saturn:1..n
are the GPUs in driver order.
"""

from __future__ import annotations

import os
import random as _random
from dataclasses import dataclass
from typing import Any

import torch

from . import _runtime

_rt = _runtime.ops

DeviceLike = torch.device | str | int | None


def _index(device: DeviceLike = None) -> int:
    """Normalise a device argument to a saturn index (None: the current device)."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        d = torch.device(device)
        if d.type != "saturn":
            raise ValueError(f"expected a saturn device, got {d}")
        index = current_device() if d.index is None else d.index
    if not 0 <= index < device_count():
        # Raises with the reason (no GPU, or the valid range).
        _rt().set_device(index)
    return index


def is_available() -> bool:
    return True  # saturn:0 always exists


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _runtime.device_count()


def gpu_count() -> int:
    return device_count() - 1


def gpu_unavailable_reason() -> str:
    return _runtime.gpu_unavailable_reason()


def is_gpu(device: DeviceLike = None) -> bool:
    return _index(device) >= 1


def current_device() -> int:
    return _rt().current_device()


def set_device(device: DeviceLike) -> None:
    _rt().set_device(_index(device))


class device:  # noqa: N801 - PyTorch's device modules name this context manager `device`
    """Context manager that makes a saturn device current, restoring the previous one."""

    def __init__(self, device: DeviceLike):
        self.index = _index(device)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        _rt().set_device(self.index)

    def __exit__(self, *exc: Any) -> None:
        _rt().set_device(self.prev)


def synchronize(device: DeviceLike = None) -> None:
    _rt().synchronize(_index(device))


def stream_handle(device: DeviceLike = None) -> int:
    """The CUstream all of saturn's work on a GPU device is queued on."""
    return _rt().stream(_index(device))


def get_device_name(device: DeviceLike = None) -> str:
    return _rt().device_name(_index(device))


def get_device_capability(device: DeviceLike = None) -> tuple[int, int]:
    cc = _rt().compute_capability(_index(device))
    return cc // 10, cc % 10


@dataclass(frozen=True)
class DeviceProperties:
    """What ``get_device_properties`` reports (the fields ``torch.cuda``'s has in common)."""

    name: str
    major: int  # compute capability (0.0 for saturn:0)
    minor: int
    total_memory: int  # bytes
    is_gpu: bool


def get_device_properties(device: DeviceLike = None) -> DeviceProperties:
    index = _index(device)
    if is_gpu(index):
        (major, minor), total = get_device_capability(index), mem_get_info(index)[1]
    else:  # host memory: the machine's
        major, minor = 0, 0
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceProperties(get_device_name(index), major, minor, total, is_gpu(index))


# --- streams and events: one stream per device orders all of saturn's work on it; events
# are CUDA events on a GPU and host clock readings on saturn:0 (csrc/guard.cpp)

Stream = torch.Stream


def current_stream(device: DeviceLike = None) -> torch.Stream:
    """The device's one stream (what ``torch.Event.record()`` records on)."""
    return torch.accelerator.current_stream(torch.device("saturn", _index(device)))


default_stream = current_stream


class stream:  # noqa: N801 - PyTorch's device modules name this context manager `stream`
    """``with torch.saturn.stream(s):`` as ``torch.cuda.stream``: work issued inside runs
    on ``s``. A saturn device has one stream (``torch.saturn.Stream()`` returns it), so
    the stream current inside is the one outside; a stream of another device type is
    refused rather than ignored. (FSDP2 issues its collectives' copies this way.)"""

    def __init__(self, s: torch.Stream | None):
        if s is not None and s.device.type != "saturn":
            raise ValueError(f"torch.saturn.stream: {s} is a stream of {s.device}, not saturn")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def Event(  # noqa: N802 - torch.cuda.Event's spelling
    enable_timing: bool = False,
    blocking: bool = False,
    interprocess: bool = False,
    device: DeviceLike = None,
) -> torch.Event:
    """A ``torch.Event`` for saturn. Like ``torch.cuda.Event`` it records on the *current*
    device's stream unless ``record()`` is given a stream: ``torch.Event`` keeps only the
    device type until its first record. A ``device`` other than the current one would
    therefore time another device's work (saturn:0's host clock for a GPU's), so it is
    refused rather than ignored."""
    if device is not None and _index(device) != current_device():
        raise ValueError(
            f"torch.saturn.Event(device=saturn:{_index(device)}): an event records on the "
            f"current device's stream (saturn:{current_device()} now); make it current with "
            f"`with torch.saturn.device({_index(device)}):` or pass "
            f"torch.saturn.current_stream({_index(device)}) to record()"
        )
    return torch.Event(
        torch.device("saturn", current_device()),
        enable_timing=enable_timing,
        blocking=blocking,
        interprocess=interprocess,
    )


# --- random numbers: seeding sets saturn's generators directly, never torch.manual_seed,
# which calls back into manual_seed_all here.


def _as_int64(seed: int) -> int:
    # Seeds are 64-bit unsigned; the runtime op takes the same bits as a signed int.
    seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def manual_seed(seed: int, device: DeviceLike = None) -> None:
    _rt().manual_seed(_index(device), _as_int64(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _rt().manual_seed(i, _as_int64(seed))


def seed() -> None:
    manual_seed(_random.getrandbits(63))


def seed_all() -> None:
    manual_seed_all(_random.getrandbits(63))


def initial_seed(device: DeviceLike = None) -> int:
    return _rt().initial_seed(_index(device))


def get_rng_state(device: DeviceLike = None) -> torch.Tensor:
    return _rt().get_rng_state(_index(device))


def set_rng_state(state: torch.Tensor, device: DeviceLike = None) -> None:
    _rt().set_rng_state(_index(device), state)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


# --- memory


def memory_stats(device: DeviceLike = None) -> dict[str, int]:
    """Allocator counters of one device: allocated, reserved, peaks, hits, misses,
    retries, failures and live allocations (bytes are rounded sizes)."""
    return _runtime.memory_counters(_index(device))


def memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device)["allocated"]


def max_memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device)["peak_allocated"]


def memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device)["reserved"]


def max_memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device)["peak_reserved"]


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    _rt().reset_peak(_index(device))


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    _rt().reset_accumulated(_index(device))


def empty_cache(device: DeviceLike = None) -> int:
    """Release cached blocks back to the system (every device when none is named);
    returns the number of bytes released."""
    indices = range(device_count()) if device is None else [_index(device)]
    return sum(_rt().empty_cache(i) for i in indices)


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    free, total = _rt().mem_get_info(_index(device))
    return free, total


def memory_summary(device: DeviceLike = None) -> str:
    """The allocator's counters of one device as a table, in MiB where they are bytes."""
    index = _index(device)
    stats = memory_stats(index)
    lines = [f"saturn:{index} ({get_device_name(index)}) memory"]
    for key, value in stats.items():
        in_bytes = "allocated" in key or "reserved" in key
        shown = f"{value / 2**20:12.2f} MiB" if in_bytes else f"{value:12d}"
        lines.append(f"  {key:24s} {shown}")
    return "\n".join(lines)


def size_class(nbytes: int) -> int:
    """The size the allocator rounds a request of ``nbytes`` up to."""
    return _rt().size_class(nbytes)


def fallback_counts() -> dict[str, int]:
    """How many times each op ran through the CPU fallback, by name."""
    return _runtime.fallback_counts()


def reset_fallback_counts() -> None:
    _rt().fallback_reset()
