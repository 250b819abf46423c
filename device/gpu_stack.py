"""What compiling for a GPU needs beyond torch, checked once per process at the first GPU
compile. Without these a compiled graph still runs, but the library calls that need them go
through PyTorch instead (each with its reason logged): the warning says so once, up front,
and names the extra that installs them."""

from __future__ import annotations

import importlib.util
import warnings

# module -> what saturn uses it for
LIBRARIES = {
    "cupy": "device arrays for nvmath and cuDNN, library timings",
    "nvmath": "float32 matrix products through cuBLASLt",
    "cudnn": "convolutions and fused attention (the cuDNN frontend)",
}
_checked = False


def missing() -> list[str]:
    """The modules of ``LIBRARIES`` this process cannot import."""
    return [m for m in LIBRARIES if importlib.util.find_spec(m) is None]


def check_once() -> None:
    """Warn, once per process, when a GPU library saturn plans with is not installed."""
    global _checked
    if _checked:
        return
    _checked = True
    gone = missing()
    if gone:
        uses = "; ".join(f"{m}: {LIBRARIES[m]}" for m in gone)
        warnings.warn(
            f"saturn: compiling for a GPU without {', '.join(gone)} ({uses}); those library "
            "calls run through PyTorch. Install saturn's CUDA extra for the driver's CUDA "
            "major: pip install 'torch-saturn[cu13]' (or [cu12])",
            stacklevel=3,
        )
