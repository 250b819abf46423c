"""saturn: a PyTorch device and ``torch.compile`` backend whose graph compiler is an e-graph.

``import saturn`` builds (once, cached) and loads the C++ extension that registers
the ``saturn`` device: ``saturn:0`` is a CPU reference device, ``saturn:1..n`` are
the GPUs. ``torch.saturn`` is the device module.

The compiler core needs neither torch nor the device: ``import saturn.eqsat`` and
``import saturn.codegen`` (and ``python -m saturn.eqsat``) in a process that has not
imported torch leave both alone. The device is then registered on first use of a
public name here, or, if torch is imported later, by torch itself through the
``torch.backends`` entry point (``saturn_autoload``), which does nothing in a process
that never imported saturn.
"""

from __future__ import annotations

import sys
from typing import Any

# what the compiler core is made of: importing only these needs no torch
_CORE = ("saturn.eqsat", "saturn.codegen", "saturn.rules")


def _serving_core_import() -> bool:
    """Whether this package is being imported on the way to a compiler-core module
    (``import saturn.eqsat...``, ``python -m saturn.eqsat``): the import system's
    ``_find_and_load`` frames name the module asked for."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_find_and_load" and "importlib" in f.f_code.co_filename:
            name = f.f_locals.get("name")
            if isinstance(name, str) and name.startswith(_CORE):
                return True
        f = f.f_back
    return False


def _core_cli() -> bool:
    """Whether this process is ``python -m saturn.eqsat`` (runpy imports the parent
    package by itself first). While ``-m`` locates the module, ``sys.argv[0]`` is "-m"
    (Python's documented behaviour); ``sys.orig_argv`` names the module."""
    argv = getattr(sys, "orig_argv", [])
    named = any(a.startswith(_CORE) and argv[i - 1] == "-m" for i, a in enumerate(argv) if i)
    return sys.argv[:1] == ["-m"] and named


_core_only = "torch" not in sys.modules and (_core_cli() or _serving_core_import())

# public name -> (module, attribute)
_PUBLIC = {
    "NotCompiledError": ("backend", "NotCompiledError"),
    "stats": ("backend", "stats"),
    "custom_op": ("custom_ops", "custom_op"),
    "explain": ("explain", "explain"),
    "device_module": ("device_module", None),
    "device_count": ("device_module", "device_count"),
    "fallback_counts": ("device_module", "fallback_counts"),
    "memory_stats": ("device_module", "memory_stats"),
}
__all__ = sorted(_PUBLIC)


def _register() -> None:
    """Build and load the extension and register the device (``_package``), once."""
    global _core_only
    import importlib

    _core_only = False  # first: importing torch below calls the autoload entry point
    try:
        importlib.import_module("saturn._package")
    except BaseException:
        _core_only = True
        raise


def _public(name: str) -> Any:
    import importlib

    module, attr = _PUBLIC[name]
    m = importlib.import_module(f"saturn.{module}")
    value = m if attr is None else getattr(m, attr)
    globals()[name] = value
    return value


if not _core_only:
    _register()
    for _name in _PUBLIC:
        _public(_name)


def __getattr__(name: str) -> Any:
    # reached only for names not bound yet: after an import of the core alone
    if name in _PUBLIC:
        if _core_only:
            _register()
        return _public(name)
    raise AttributeError(f"module 'saturn' has no attribute {name!r}")
