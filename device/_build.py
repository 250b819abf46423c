"""Build the C++ extension once and cache it, keyed on torch and the sources.

The extension uses lean headers (ATen core and ``torch/library.h``, no pybind),
so it compiles in seconds; it is linked against the running torch and loaded
with ``torch.ops.load_library``. A failed build raises ``ExtensionBuildError``
carrying the compiler's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
LIB_NAME = "libsaturn_device"
FLAGS = ["-std=c++20", "-fPIC", "-Wall", "-Wno-unused-parameter"]
# SATURN_DEBUG_BUILD=1 builds with debug information and no optimisation (own cache key).
OPT = ["-g", "-O0"] if os.environ.get("SATURN_DEBUG_BUILD") == "1" else ["-O2"]


class ExtensionBuildError(RuntimeError):
    """The C++ extension did not compile or link; the message holds the compiler output."""


def cache_dir() -> Path:
    """Where saturn caches built artefacts (``SATURN_CACHE_DIR`` overrides)."""
    root = os.environ.get("SATURN_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "saturn"


def _compiler() -> str:
    # The system compiler first: a toolchain named by CXX may link libstdc++ statically
    # (seen on a GPU image), giving the extension its own iostream state, which crashes at
    # the first formatted message. SATURN_CXX overrides; CXX is the last resort.
    for cxx in (
        os.environ.get("SATURN_CXX"),
        shutil.which("c++"),
        shutil.which("g++"),
        os.environ.get("CXX"),
    ):
        if cxx:
            return cxx
    raise ExtensionBuildError("no C++ compiler found (install g++ or set SATURN_CXX)")


def _check_links_shared_libstdcxx(lib: Path) -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        return
    dynamic = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True).stdout
    if "libstdc++" not in dynamic:
        raise ExtensionBuildError(
            f"{lib} does not link libstdc++ dynamically: the compiler linked it statically, "
            "which breaks sharing C++ objects with torch; set SATURN_CXX to the system g++"
        )


def _torch_paths() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _key(cxx: str, csrc: Path) -> str:
    h = hashlib.sha256()
    for part in (
        torch.__version__,
        torch.__file__,
        sys.version,
        platform.machine(),
        cxx,
        *FLAGS,
        *OPT,
    ):
        h.update(part.encode())
    for f in sorted(csrc.glob("*")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExtensionBuildError(
            "building saturn's C++ extension failed:\n$ "
            + " ".join(cmd)
            + "\n"
            + proc.stdout
            + proc.stderr
        )


def build(csrc: Path = CSRC) -> Path:
    """Return the path of the built library, compiling it first if no cached copy exists."""
    cxx = _compiler()
    out_dir = cache_dir() / "ext" / _key(cxx, csrc)
    lib = out_dir / f"{LIB_NAME}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        if lib.exists():
            return lib
        # once per torch and compiler: say so, a build takes a while on a small machine
        print(
            f"saturn: building its C++ extension for torch {torch.__version__} "
            f"(once; cached in {out_dir})",
            file=sys.stderr,
            flush=True,
        )
        include, libdir = _torch_paths()
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        common = [*FLAGS, *OPT, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}"]
        sources = sorted(csrc.glob("*.cpp"))
        objects = [out_dir / (s.stem + ".o") for s in sources]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            jobs = [
                pool.submit(_run, [cxx, *common, "-c", str(s), "-o", str(o)])
                for s, o in zip(sources, objects, strict=True)
            ]
            for job in jobs:
                job.result()
        tmp = out_dir / f"{LIB_NAME}.so.tmp"
        _run(
            [
                cxx,
                "-shared",
                *map(str, objects),
                "-o",
                str(tmp),
                f"-L{libdir}",
                f"-Wl,-rpath,{libdir}",
                "-lc10",
                "-ltorch_cpu",
                "-ltorch",
                "-ldl",
            ]
        )
        _check_links_shared_libstdcxx(tmp)
        tmp.rename(lib)
        for o in objects:
            o.unlink(missing_ok=True)
    return lib
