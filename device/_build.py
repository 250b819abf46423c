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
FLAGS = ["-std=c++20", "-O2", "-fPIC", "-Wall", "-Wno-unused-parameter"]


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
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise ExtensionBuildError("no C++ compiler found (set CXX or install g++)")
    return cxx


def _torch_paths() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _key(cxx: str) -> str:
    h = hashlib.sha256()
    for part in (torch.__version__, torch.__file__, sys.version, platform.machine(), cxx, *FLAGS):
        h.update(part.encode())
    for f in sorted(CSRC.glob("*")):
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


def build() -> Path:
    """Return the path of the built library, compiling it first if no cached copy exists."""
    cxx = _compiler()
    out_dir = cache_dir() / "ext" / _key(cxx)
    lib = out_dir / f"{LIB_NAME}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        if lib.exists():
            return lib
        include, libdir = _torch_paths()
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        common = [*FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}"]
        sources = sorted(CSRC.glob("*.cpp"))
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
            [cxx, "-shared", *map(str, objects), "-o", str(tmp), f"-L{libdir}",
             f"-Wl,-rpath,{libdir}", "-lc10", "-ltorch_cpu", "-ltorch", "-ldl"]
        )
        tmp.rename(lib)
        for o in objects:
            o.unlink(missing_ok=True)
    return lib
