"""``saturn_autoload``: torch's ``torch.backends`` entry point for saturn (PyTorch's
out-of-tree device autoload, RFC #122468). ``import torch`` calls ``register``.

It registers the device only in a process that imported saturn's compiler core before torch
(``import saturn.eqsat``: saturn is then loaded without its device, see
``saturn/__init__.py``); everywhere else it returns at once, so installing saturn never
loads it into other programs' ``import torch``. This module imports nothing itself."""

from __future__ import annotations

import sys
import warnings


def register() -> None:
    saturn = sys.modules.get("saturn")
    if saturn is None or not getattr(saturn, "_core_only", False):
        return  # saturn not imported, or it registers the device itself
    try:
        saturn._register()
    except Exception as e:  # never break ``import torch``; the next use of saturn raises
        warnings.warn(f"saturn: the device could not be registered: {e}", stacklevel=1)
