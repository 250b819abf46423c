"""Generated CUDA kernels compiled to cubins, cached on disk, and built in parallel.

Numba compiles a generated kernel to PTX in about a second (its type inference and
lowering hold the GIL), and a model has tens of distinct kernels: compiled one after
another at the first call, that is most of a large model's first call. So the kernels a
compiled graph will launch are built before it runs, spread over worker processes that
import only this folder and stay for the process (``precompile``, ``build_pool``), and
every kernel's PTX, entry name and cubin are kept on disk keyed by its source, the target
and the compiler's versions, for every later call and process (``build``). This module
needs no GPU: building is Numba, NVVM and nvJitLink.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .sources import cache_dir, import_source, write_atomic

if TYPE_CHECKING:
    from .generated import Generated

log = logging.getLogger("saturn")

HARDWARE_BF16 = (8, 0)  # the first compute capability with cvt.rn.bf16.f32 (halfbits)

# fewest kernels to build worth starting worker processes for (each imports Numba, ~1 s)
PARALLEL_FROM = 3


class KernelError(RuntimeError):
    """A kernel the CUDA emitter cannot build, or a launch whose operands do not fit."""


def python_function(g: Generated, kind: str = "cuda-kernels"):
    """The kernel's Python function, from a real file (Numba reads source from files)."""
    return getattr(import_source(g.source, kind), g.name)


def _module_kind(cc: tuple[int, int]) -> str:
    """Where ``ptx`` imports a kernel's module from for ``cc``: Numba compiles a module's
    device functions once per signature, whatever the target, and the bfloat16 store is one
    instruction from 8.0 and integer arithmetic before it (``halfbits.f32_bf16``), so an
    older target gets modules of its own."""
    return "cuda-kernels" if cc >= HARDWARE_BF16 else f"cuda-kernels-sm{cc[0]}{cc[1]}"


def signature(g: Generated):
    from numba import types

    ptrs = [types.CPointer(getattr(types, t)) for t in g.pointer_types]
    return tuple(ptrs + [types.int64] * len(g.params.ints))


_building = threading.local()  # .cc: the compute capability ``ptx`` is building for


def _target_device_hook() -> None:
    """numba-cuda compiles a device function that a kernel calls (``forceinline`` helpers)
    for the *current* device's compute capability, creating a CUDA context to ask for it:
    none exists on a machine without a GPU, and a build worker should not make one. While
    ``ptx`` builds for ``cc`` on this thread, the current device answers with ``cc`` (its
    only attribute numba reads there); elsewhere it is numba's own."""
    from numba.cuda import dispatcher

    real = dispatcher.get_current_device
    if getattr(real, "saturn_hook", False):
        return

    def current_device():
        cc = getattr(_building, "cc", None)
        return real() if cc is None else SimpleNamespace(compute_capability=cc)

    current_device.saturn_hook = True
    dispatcher.get_current_device = current_device


def ptx(g: Generated, cc: tuple[int, int]) -> str:
    from numba import cuda

    _target_device_hook()
    _building.cc = cc
    try:
        fn = python_function(g, _module_kind(cc))
        text, _ = cuda.compile_ptx(fn, signature(g), cc=cc, fastmath=False)
    finally:
        _building.cc = None
    return text.rstrip("\x00")  # Numba's PTX ends with a NUL the linkers reject


def entry_name(ptx_text: str) -> str:
    m = re.search(r"\.visible \.entry (\S+)\(", ptx_text)
    if not m:
        raise KernelError("no kernel entry in the generated PTX")
    return m.group(1)


@cache
def versions() -> str:
    """What the built code depends on besides its source and target."""
    import numba

    try:
        import numba_cuda

        nc = numba_cuda.__version__
    except Exception:  # pragma: no cover - older layouts
        nc = "?"
    try:
        from cuda.bindings import driver

        _, drv = driver.cuDriverGetVersion()
    except Exception:  # no driver here (building only): nothing built will be loaded here
        drv = "none"
    return f"numba {numba.__version__} numba-cuda {nc} driver {drv}"


def path(g: Generated, cc: tuple[int, int], version: str | None = None) -> Path:
    """The file that holds ``g`` built for ``cc``: its entry name and its code together
    (one file, written at once: Numba's entry names carry a per-process counter, so the
    same source built by two processes has two names, and a name kept apart from its code
    could be paired with the other process's code)."""
    key = f"{g.source}|{cc}|{version or versions()}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    d = cache_dir("cuda-kernels")
    d.mkdir(parents=True, exist_ok=True)
    return d / f"k_{digest}_sm{cc[0]}{cc[1]}.kernel"


def built(g: Generated, cc: tuple[int, int], version: str | None = None) -> bool:
    return path(g, cc, version).exists()


def build(g: Generated, cc: tuple[int, int], version: str | None = None) -> tuple[str, str, bytes]:
    """``g`` compiled for ``cc`` (or found on disk): (entry name, "cubin" or "ptx", code),
    PTX for the driver to compile where no linker could make a cubin. The file is written
    atomically: another process building the same kernel at once (pytest-xdist, one
    process per GPU, ``precompile``'s workers) reads either nothing or a whole one."""
    out = path(g, cc, version)
    if out.exists():
        entry, kind, code = out.read_bytes().split(b"\n", 2)
        return entry.decode(), kind.decode(), code
    text = ptx(g, cc)
    entry, kind, code = entry_name(text), "ptx", text.encode()
    from cuda.core import Linker, LinkerOptions, ObjectCode

    tmp = out.with_suffix(f".{os.getpid()}.ptx")
    try:
        # cuda.core hands in-memory PTX to nvJitLink as a file name: give it a file
        tmp.write_bytes(code)
        linker = Linker(
            ObjectCode.from_ptx(str(tmp)), options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}")
        )
        kind, code = "cubin", bytes(linker.link("cubin").code)
    except Exception as e:  # no usable linker: the driver compiles the PTX at load
        log.warning(
            "saturn: linking a cubin failed (%s); loading PTX instead",
            str(e).splitlines()[0][:200],
        )
    finally:
        tmp.unlink(missing_ok=True)
    write_atomic(out, b"\n".join((entry.encode(), kind.encode(), code)))
    return entry, kind, code


@dataclass(frozen=True)
class Job:
    """What building a kernel needs, as plain data a worker process reads (a Generated
    would need the emitter, and with it the compiler core, imported there)."""

    name: str
    source: str
    pointer_types: tuple[str, ...]
    ints: tuple[str, ...]

    @property
    def params(self) -> Job:  # signature() reads g.params.ints
        return self


def job(g: Generated) -> Job:
    return Job(g.name, g.source, tuple(g.pointer_types), tuple(g.params.ints))


def warm(cc: tuple[int, int]) -> None:
    """Numba imported and its compiler run once on a small kernel: what a build worker
    does when it starts, before it has work (``build_pool``)."""
    try:
        from numba import cuda

        def one(x):
            x[0] = 1.0

        _target_device_hook()
        _building.cc = cc
        cuda.compile_ptx(one, "void(float32[::1])", cc=cc)
    except Exception:  # the first real build pays it instead, and raises its own errors
        pass
    finally:
        _building.cc = None


def workers() -> int:
    """Worker processes for a build: ``$SATURN_BUILD_JOBS``, else one per core (at most
    32). Processes that compile at once (pytest-xdist, one per GPU) may want fewer each."""
    jobs = os.environ.get("SATURN_BUILD_JOBS")
    if jobs:
        try:
            return max(1, int(jobs))
        except ValueError:
            log.warning("saturn: SATURN_BUILD_JOBS=%r is not a whole number; ignored", jobs)
    return max(1, min(len(os.sched_getaffinity(0)), 32))


def start_workers(cc: tuple[int, int]) -> None:
    """Start the process's build workers for ``cc`` now (a GPU compile's start), so that
    their start-up runs beside tracing and saturation (``build_pool``)."""
    n = workers()
    if n >= 2:
        from . import build_pool

        build_pool.pool(n, cc)


def precompile(gens: list, cc: tuple[int, int]) -> int:
    """Build the kernels of ``gens`` (Generated) not yet on disk on the process's build
    workers; how many were to build. A kernel whose build fails here is left to
    ``build`` at its first launch, which raises there with its own error. Without workers
    started for ``cc``, fewer than ``PARALLEL_FROM`` kernels are left to their launch."""
    from . import build_pool

    try:
        version = versions()
        todo = list({g.source: job(g) for g in gens if not built(g, cc, version)}.values())
        n = workers()
        if not todo or n < 2 or (len(todo) < PARALLEL_FROM and not build_pool.started(cc)):
            return 0
        failed = build_pool.pool(n, cc).run(todo, version)
        if failed:
            log.info("saturn: kernel builds in workers failed: %s", "; ".join(failed)[:500])
        return len(todo)
    except Exception as e:  # builds at first launch instead, one after another
        log.info("saturn: kernels not built in parallel: %s", str(e)[:200])
        return 0
