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

Choices are also kept on disk (``$SATURN_CACHE_DIR/tunings``, off with
``SATURN_COMPILE_CACHE=0`` like the compiled graphs), keyed on the problem, the GPU's name
and the library's version: a new process compiling a model seen before takes them without
timing (issue 32's warm first call). A cuBLASLt algorithm is a plain struct its library
lets a program store and reuse on the same version; a plan whose stored choice does not
build times its candidates as if there were none.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .sources import cache_dir, write_atomic

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


@functools.cache
def gpu_name(ordinal: int) -> str:
    """The GPU's model and compute capability: what a stored choice is valid on."""
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(ordinal)
        return f"{props['name'].decode()} sm{props['major']}{props['minor']}"
    except Exception:  # no cupy or no such GPU: the choice is not stored
        return ""


@functools.cache
def cublaslt_version() -> str:
    from nvmath.bindings import cublasLt as lt  # noqa: N813

    return f"cublasLt {lt.get_version()}"


@functools.cache
def cudnn_version() -> str:
    import cudnn

    return f"cudnn {cudnn.backend_version()}"


def _encode(choice: Any) -> bytes:
    """A choice as bytes: a cuBLASLt algorithm (nvmath's ``Algorithm``) as its struct,
    plan indices and timings as JSON."""
    data = getattr(getattr(choice, "algorithm", None), "_data", None)
    if data is not None:
        return b"algo:" + data.tobytes()
    return b"json:" + json.dumps(choice).encode()


def _decode(raw: bytes) -> Any:
    kind, body = raw[:5], raw[5:]
    if kind == b"json:":
        value = json.loads(body)
        return tuple(value) if isinstance(value, list) else value
    if kind != b"algo:":
        raise ValueError("not a stored tuning")
    import numpy as np
    from nvmath.bindings import cublasLt as lt  # noqa: N813
    from nvmath.linalg.advanced import Algorithm

    buf = lt.MatmulHeuristicResult(1)
    if len(body) != buf[0]._data.nbytes:
        raise ValueError("a cuBLASLt algorithm of another size")
    buf[0] = np.frombuffer(body, dtype=buf[0]._data.dtype).reshape(buf[0]._data.shape)
    return Algorithm(buf[0])


class Tunings:
    """key -> the choice a plan timed, with how often a choice was timed and reused (in
    this process, or from the disk: a choice timed by another process)."""

    def __init__(self, name: str = "gemm", version: Callable[[], str] | None = None) -> None:
        self.name = name  # the counters' prefix in saturn.stats()
        self.version = version  # the library's version, part of a stored choice's key
        self._choices: dict[tuple, Any] = {}
        self.timed = 0
        self.reused = 0
        self.loaded = 0

    def _path(self, key: tuple):
        """Where a choice is stored (None: not stored: the cache is off, or the GPU or
        the library's version cannot be told)."""
        if os.environ.get("SATURN_COMPILE_CACHE", "1") == "0" or self.version is None:
            return None
        try:
            where = (gpu_name(key[-1]), self.version())
        except Exception:
            return None
        if not where[0]:
            return None
        text = repr((self.name, where, key[:-1]))  # the ordinal apart: the GPU's name stands
        return cache_dir("tunings") / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.bin"

    def key(self, ptrs: tuple[int, ...], *problem: object) -> tuple:
        """A product's key: what it computes (``problem``: hashable layouts, epilogue,
        compute type, ...), its operands' alignments and its GPU."""
        return (*problem, tuple(alignment(p) for p in ptrs), device_of(ptrs[0]))

    def get(self, key: tuple) -> Any | None:
        choice = self._choices.get(key)
        if choice is None:
            choice = self._load(key)
            if choice is None:
                return None
            self._choices[key] = choice
            self.loaded += 1
        self.reused += 1
        return choice

    def _load(self, key: tuple) -> Any | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            return _decode(path.read_bytes())
        except Exception:  # absent, unreadable or of another form: timed again
            return None

    def put(self, key: tuple, choice: Any) -> None:
        self._choices[key] = choice
        self.timed += 1
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, _encode(choice))
        except Exception:  # a read-only or full disk: the choice stays this process's
            pass

    def forget(self, key: tuple) -> None:
        """A choice that did not build after all (a stale file): timed again, then stored."""
        self._choices.pop(key, None)
        self.reused -= 1

    def clear(self) -> None:
        self._choices.clear()
        self.timed = self.reused = self.loaded = 0

    def stats(self) -> dict[str, int]:
        return {
            f"{self.name}_tunings": self.timed,
            f"{self.name}_tunings_reused": self.reused,
            f"{self.name}_tunings_from_disk": self.loaded,
        }


class BuiltPlans:
    """Library plans built and tuned in this process, shared by every step that asks the
    same (decision 0143): a plan takes its operands' pointers at each call, so steps whose
    problem, stream and pointer alignments are equal can run one plan. Building a cuDNN
    plan is host work paid per step otherwise (the operation graph, the heuristic's query,
    a plan built, the chosen one built again; a depthwise convolution's engines compiled by
    NVRTC, up to a second each), even where the choice was timed before (``Tunings``).
    The least recently asked plans beyond ``limit`` are dropped from the table (steps that
    hold them keep them)."""

    def __init__(self, name: str, limit: int = 1024) -> None:
        self.name = name
        self.limit = limit
        self._plans: OrderedDict[tuple, Any] = OrderedDict()
        self.shared = 0

    def get_or_make(self, key: tuple, make: Callable[[], Any]) -> Any:
        """The plan built for ``key`` before, else ``make()`` (kept unless it raises)."""
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            self.shared += 1
            return plan
        plan = make()
        self._plans[key] = plan
        while len(self._plans) > self.limit:
            self._plans.popitem(last=False)
        return plan

    def stats(self) -> dict[str, int]:
        return {f"{self.name}_plans_shared": self.shared}

    def clear(self) -> None:
        self._plans.clear()
        self.shared = 0


# one table per process: cuBLASLt's handles and algorithms are the process's
TUNINGS = Tunings("gemm", cublaslt_version)
CONV_TUNINGS = Tunings("conv", cudnn_version)
CONV_PLANS = BuiltPlans("conv")
