"""The GPU launchers of the kernel kinds whose machine code codegen owns outright (takes,
row adds, concatenations, pads): each kind's emitter module (its spec's ``emitter``)
registers a launcher class, built from the kernel once before the first call and launched
at every call with the operands as they lie (anything with ``data_ptr()``, ``shape`` and
``stride()``). The GPU runner asks ``launcher`` and knows no kind of these by name."""

from __future__ import annotations

import importlib
from typing import Protocol

from saturn.eqsat.kinds import SPECS, KindTable, spec

from .generated import Generated


class LaunchContext(Protocol):
    """What a launcher may ask of the runner that calls it."""

    err_ptr: int  # a device word an index out of range sets (read after the call)

    def copy(self, src, dst) -> None:  # a strided copy on the runner's stream
        ...


class Launcher(Protocol):
    def expected(self) -> list[Generated]:
        """What its first launch will most likely load, to build in parallel before."""
        ...

    def launch(self, stream: int, out, operands: list, ctx: LaunchContext) -> None: ...


LAUNCHERS: KindTable = KindTable("codegen's GPU launchers")


def launcher(kernel, cc: tuple[int, int]) -> Launcher:
    """The launcher of ``kernel`` for compute capability ``cc``: its kind's emitter module
    is imported here (it registers itself), so a new kind needs no entry in this file."""
    module = spec(kernel.kind).emitter
    if module is None:
        raise NotImplementedError(f"codegen has no launcher of its own for {kernel.kind} kernels")
    importlib.import_module(module)
    return LAUNCHERS[kernel.kind](kernel, cc)


def emitted_kinds() -> list[str]:
    """The kinds whose launcher an emitter module registers."""
    return [s.name for s in SPECS if s.emitter]
