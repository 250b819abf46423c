"""Generated kernel source on disk: the cache folder, and importing a module from it.

Numba reads a function's source from its file (and its on-disk cache re-imports the
module by name), so generated source is written under the cache folder and imported as a
real module, once per process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

_LOCK = threading.Lock()


def cache_dir(kind: str) -> Path:
    """``$SATURN_CACHE_DIR/kind`` (default ``~/.cache/saturn/kind``)."""
    root = os.environ.get("SATURN_CACHE_DIR")
    if root:
        return Path(root) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "saturn" / kind


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def import_source(source: str, kind: str) -> ModuleType:
    """The module whose text is ``source``, written under ``cache_dir(kind)``."""
    key = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"saturn_{kind.replace('-', '_')}_{key}"
    with _LOCK:
        if name in sys.modules:
            return sys.modules[name]
        d = cache_dir(kind)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{name}.py"
        if not path.exists():
            write_atomic(path, source.encode())
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
