"""What a kernel kind is: its facts, and the functions each stage of the compiler asks of
it (``KindSpec``), and the per-interpreter tables (``KindTable``) that run it.

Each kind's module in this package defines one ``SPEC``; ``kinds/__init__.py`` finds them
and names the kinds (``Kind``). A kind's module imports only the core's tables (op table,
shape functions, program, numpy semantics), never the stages that ask it, so a stage reads
every kind through its spec without an import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import optable as ot

Type = tuple[str, tuple[int, ...]]  # (dtype, shape)


@dataclass(frozen=True)
class KindFacts:
    # generated from a scalar body (``Kernel.body``): fused by the e-graph, emitted by
    # codegen's loop/reduce/rows emitters, run on saturn:0 by codegen.cpu
    body: bool = False
    # reads rows of its first operand at its second (an index that may be out of range:
    # checked on the device, unless ranges.indices_in_range proves it in range)
    indices: bool = False
    # a value another kernel writes beside its own output (a rows kernel's per-row
    # statistic, ``kinds/row_stat.py``): its step marks where the value is ready, and no
    # interpreter launches or computes it on its own
    side: bool = False


@dataclass(frozen=True)
class KindSpec:
    """Everything the compiler knows of one kernel kind, asked by the stage named."""

    name: str  # as a program's text holds it
    order: int  # its place among the kinds (and its term's in the schema): a new kind's is last
    facts: KindFacts = KindFacts()
    # the e-graph term that makes it and its schema declaration (comment and constructor
    # lines, extra constructors it needs after them); None where no rule makes it directly
    # (rows kernels are formed from extracted ones)
    term: str | None = None
    declare: tuple[str, ...] = ()
    # extract: the type of ``term`` from its attributes and its first ``typed_kids``
    # children's types (all where None), and its cost in microseconds on a machine from
    # its type and its children's (None where untyped)
    typed_kids: int | None = None
    type_of: Callable[[tuple, list[Type]], Type] | None = None
    cost: Callable[[Any, Type, list[Type | None]], float] | None = None
    # lowering: (e-node, library, lowering) -> Kernel, where ``library(kind, operand
    # classes, attrs)`` makes a kernel reading its operands through strides; None for the
    # body kinds, whose bodies kernel_bodies.py lowers
    lower: Callable | None = None
    # the numpy reference: (kernel, operand arrays) -> output array; for a ``side`` kind,
    # (kernel, the values its writer wrote beside its output) -> its value
    reference: Callable | None = None
    # the values a kernel of this kind writes beside its output, as the reference computes
    # them: (kernel, operand arrays) -> arrays (a rows kernel's statistics, read by the
    # ``side`` steps after it)
    side_values: Callable | None = None
    # saturn:0 through the host's ops: (kernel, operands, run) -> output, ``run(op name,
    # operands, attrs)`` running an op of the table on the host; None where saturn:0's
    # step loop has a runner of its own (bodies, libraries, custom ops)
    host: Callable | None = None
    # codegen's module that registers the kind's GPU launcher (codegen/launchers.py);
    # None where the GPU runner builds it itself (bodies, library plans, custom ops)
    emitter: str | None = None
    describe: str = ""  # what runs it, for a reader (driver's --emit kernels)
    # layout passes (eqsat/channels_last.py): the attributes of this kind's kernel with its
    # one operand and its output both permuted by ``order`` (the same elements, the axes
    # in another order); None where the kind has no such form
    permuted: Callable[[dict, tuple[int, ...]], dict] | None = None
    # a kind that reads at indices: what a user wrote that makes one, and the indices in
    # range, for the error an index out of range raises
    index_error: str = ""


def nbytes(t: Type) -> int:
    return math.prod(t[1]) * ot.ITEMSIZE[t[0]]


def streamed(m, t: Type, kids: list[Type | None]) -> float:
    """One launch that writes its output once."""
    return m.launch_us + nbytes(t) / m.device_bytes_per_us


def copied(m, t: Type, kids: list[Type | None]) -> float:
    """One launch that reads (at most) what it writes."""
    return m.launch_us + 2 * nbytes(t) / m.device_bytes_per_us


def library_call(m, t: Type, a: Type, b: Type, k: int) -> float:
    """A library call: its fixed cost, its multiply-adds and the bytes it moves."""
    flops = 2 * math.prod(t[1]) * k
    return (
        m.library_call_us
        + flops / m.gemm_flops_per_us
        + (nbytes(a) + nbytes(b) + nbytes(t)) / m.device_bytes_per_us
    )


class KindTable[F: Callable]:
    """One interpreter's implementation of each kind, registered with ``@table.on(...)``.
    ``table[kind]`` raises ``NotImplementedError`` naming the interpreter and the kind
    where it has none (a kind another target runs, or one added without it)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._by_kind: dict[str, F] = {}

    def on(self, *kinds: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            for k in kinds:
                if k in self._by_kind:
                    raise ValueError(f"{self.what}: kind {k} registered twice")
                self._by_kind[k] = fn
            return fn

        return register

    def __getitem__(self, kind: str) -> F:
        fn = self._by_kind.get(kind)  # a member hashes and compares as its string
        if fn is None:
            raise NotImplementedError(f"{self.what} cannot run a {kind} kernel")
        return fn

    def covers(self) -> set[str]:
        return set(self._by_kind)
