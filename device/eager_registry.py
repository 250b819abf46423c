"""Registering saturn's Python kernels with the dispatcher, hidden from Dynamo.

A kernel of saturn's written in Python (an eager op on saturn tensors, a custom op's device
function) is called by the dispatcher. Inside a ``torch.compile``d function that runs part
of its code eagerly (after a graph break, or DDP's forward around its compiled pieces),
Dynamo's frame hook is active, and it would try to compile the kernel's own frames as user
code: tracing saturn's runtime (launch arguments, numpy arrays) fails or misbehaves. Each
kernel is registered wrapped in ``torch._dynamo.disable``, which turns the hook off for the
call and everything it calls (about half a microsecond a call)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def impl(lib: torch.library.Library, name: str, fn: Callable, key: str = "PrivateUse1") -> None:
    """``lib.impl(name, fn, key)`` with ``fn`` out of Dynamo's reach."""
    lib.impl(name, torch._dynamo.disable(fn), key)
