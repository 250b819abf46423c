"""saturn: a PyTorch device and ``torch.compile`` backend whose graph compiler is an e-graph.

``import saturn`` builds (once, cached) and loads the C++ extension that registers
the ``saturn`` device: ``saturn:0`` is a CPU reference device, ``saturn:1..n`` are
the GPUs. ``torch.saturn`` is the device module.
"""

from __future__ import annotations

import sys


def _core_cli() -> bool:
    """Whether this process is ``python -m saturn.eqsat``, the compiler core's command
    line, which needs neither torch nor the device (it starts in a second instead of
    five). While ``-m`` locates the module, ``sys.argv[0]`` is "-m" (Python's documented
    behaviour); ``sys.orig_argv`` names the module."""
    argv = getattr(sys, "orig_argv", [])
    named = any(a == "saturn.eqsat" and argv[i - 1] == "-m" for i, a in enumerate(argv) if i)
    return sys.argv[:1] == ["-m"] and named


if not _core_cli():
    from ._package import *  # noqa: F403 (registers the device; the public names)
    from ._package import __all__  # noqa: F401
