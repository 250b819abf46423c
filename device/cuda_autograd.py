"""CUDA autograd in a process that registered saturn (decision 0094).

PyTorch's autograd engine asks ``at::getAccelerator()`` for the one device type whose
streams it tracks, and that is PrivateUse1 once any PrivateUse1 backend is named, as
saturn's is (pytorch/pytorch#161129). A backward over CUDA tensors then finds no stream on
its nodes and fails ``opt_ready_stream && opt_parent_stream``. The flag PyTorch reads
(``c10::privateuse1_backend_name_set``) has no setter, so for the length of a backward
whose roots are CUDA tensors saturn clears it and sets it again afterwards: the engine then
sees CUDA as the accelerator, exactly as in a process that never imported saturn.

The flag is found through the exported function that reads it
(``c10::is_privateuse1_backend_registered``, whose x86-64 code is one rip-relative byte
load), and the address is proved before use by flipping the byte and watching that
function's answer follow. Where the code is not that load (another build or
architecture) nothing is installed and a CUDA backward fails as before.

While a CUDA backward runs, saturn's device name reads as ``privateuseone`` to other
threads (``torch.device("saturn")`` does not parse): a program that works on saturn
tensors in another thread during a CUDA backward is not supported. Backwards whose roots
are saturn or CPU tensors run unchanged.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("saturn")

_LOAD = b"\x0f\xb6\x05"  # movzbl disp32(%rip), %eax
_lock = threading.Lock()
_depth = 0  # nested CUDA backwards (a hook's own backward) restore the flag once
_flag: ctypes.c_uint8 | None = None
_why = "not installed"


def _find_flag() -> ctypes.c_uint8 | None:
    """The byte PyTorch keeps ``privateuse1_backend_name_set`` in, proved by flipping it."""
    global _why
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    try:
        fn = lib["_ZN3c1033is_privateuse1_backend_registeredEv"]
    except AttributeError:
        _why = "libc10 exports no is_privateuse1_backend_registered"
        return None
    fn.restype, fn.argtypes = ctypes.c_bool, []
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    code = ctypes.string_at(addr, 7)
    if code[:3] != _LOAD:
        _why = f"is_privateuse1_backend_registered is not one byte load ({code.hex()})"
        return None
    flag = ctypes.c_uint8.from_address(addr + 7 + int.from_bytes(code[3:7], "little", signed=True))
    if flag.value != 1 or not fn():
        _why = "the flag does not read as registered"
        return None
    flag.value = 0
    follows = not fn()
    flag.value = 1
    if not follows or not fn():
        _why = "the byte found is not the flag"
        return None
    return flag


@contextmanager
def cuda_is_the_accelerator():
    """Within: ``at::getAccelerator()`` answers as without saturn (CUDA on a GPU machine)."""
    global _depth
    if _flag is None:
        yield
        return
    with _lock:
        _depth += 1
        _flag.value = 0
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _flag.value = 1


def _on_cuda(outputs) -> bool:
    """Whether a backward's roots are CUDA tensors (or edges into CUDA nodes)."""
    if isinstance(outputs, torch.Tensor | torch.autograd.graph.GradientEdge):
        outputs = (outputs,)
    for t in outputs:
        if isinstance(t, torch.Tensor):
            if t.device.type == "cuda":
                return True
        elif isinstance(t, torch.autograd.graph.GradientEdge):
            meta = getattr(t.node, "_input_metadata", ())
            if any(m.device.type == "cuda" for m in meta):
                return True
    return False


def _wrap(run: Callable) -> Callable:
    def _engine_run_backward(t_outputs, *args, **kwargs):
        if _on_cuda(t_outputs):
            with cuda_is_the_accelerator():
                return run(t_outputs, *args, **kwargs)
        return run(t_outputs, *args, **kwargs)

    _engine_run_backward.__wrapped__ = run  # type: ignore[attr-defined]
    _engine_run_backward._saturn = True  # type: ignore[attr-defined]
    return _engine_run_backward


def install() -> None:
    """Wrap the engine's Python entry (``torch.autograd.backward`` and ``grad`` call it)
    where CUDA is built in and the flag is found; otherwise log why not."""
    global _flag, _why
    if _flag is not None or not torch.backends.cuda.is_built():
        return
    try:
        _flag = _find_flag()
    except (OSError, ValueError) as e:
        _why, _flag = f"libc10 not readable: {e}", None
    if _flag is None:
        log.info("saturn: CUDA autograd after import saturn is not restored (%s)", _why)
        return
    import torch.autograd.graph as graph

    for module in (graph, torch.autograd):
        run = module._engine_run_backward
        if not getattr(run, "_saturn", False):
            module._engine_run_backward = _wrap(run)
    _why = ""


def status() -> str:
    """Empty when installed, else why not (what the INFO log said)."""
    return _why
