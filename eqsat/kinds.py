"""The kernel kinds: every kind a ``Kernel`` of a ``Program`` can have, with its facts.

A kind's name is written here once (``Kind``); every other module names it through
``Kind`` and asks this table what it is (``FACTS``) instead of comparing strings. Each
interpreter of a program (the numpy reference, saturn:0's step loop, the GPU runner)
holds one ``KindTable`` of its per-kind implementations, so a kind one of them lacks is
an error that names the interpreter and the kind, and ``tests/eqsat/test_kinds.py``
checks that every interpreter covers every kind.

Adding a kind: a member and its facts here, its reference (``evaluate.py``), its runners
(``device/recipe.py``, ``device/gpu_runner.py``), its emitter (``codegen/``), its lowering
and the rule that makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    LOOP = "loop"  # an elementwise body over a domain
    REDUCE = "reduce"  # a body reduced along some axes, then an epilogue
    ROWS = "rows"  # per-row reductions (stages) then a body reading them
    GEMM = "gemm"  # a matrix product with an epilogue (cuBLASLt)
    CONV = "conv"  # a 2-d convolution (cuDNN)
    GATHER = "gather"  # rows of a table taken at indices
    SCATTER = "scatter"  # rows added into a table at indices
    CONCAT = "concat"  # pieces joined along one axis
    PAD = "pad"  # a constant border around a tensor
    CUSTOM = "custom"  # a registered custom op's kernel

    def __repr__(self) -> str:
        # as the string it equals: a kernel's digest (its name, its cache key) hashes the
        # repr of its fields, the same for a kind named here or read from program text
        return repr(self.value)


@dataclass(frozen=True)
class KindFacts:
    # generated from a scalar body (``Kernel.body``): fused by the e-graph, emitted by
    # codegen's loop/reduce/rows emitters, run on saturn:0 by codegen.cpu
    body: bool = False
    # reads rows of its first operand at its second (an index that may be out of range:
    # checked on the device, unless ranges.indices_in_range proves it in range)
    indices: bool = False


FACTS: dict[Kind, KindFacts] = {
    Kind.LOOP: KindFacts(body=True),
    Kind.REDUCE: KindFacts(body=True),
    Kind.ROWS: KindFacts(body=True),
    Kind.GEMM: KindFacts(),
    Kind.CONV: KindFacts(),
    Kind.GATHER: KindFacts(indices=True),
    Kind.SCATTER: KindFacts(indices=True),
    Kind.CONCAT: KindFacts(),
    Kind.PAD: KindFacts(),
    Kind.CUSTOM: KindFacts(),
}
assert set(FACTS) == set(Kind)


def facts(kind: str) -> KindFacts:
    """The facts of a kind given by its name (a ``Kind`` or the string a program holds)."""
    found = FACTS.get(kind)  # a member hashes and compares as its string
    if found is None:
        known = [k.value for k in Kind]
        raise ValueError(f"unknown kernel kind {kind!r}; kinds: {known}")
    return found


def is_body(kind: str) -> bool:
    return facts(kind).body


class KindTable[F: Callable]:
    """One interpreter's implementation of each kind, registered with ``@table.on(...)``.
    ``table[kind]`` raises ``NotImplementedError`` naming the interpreter and the kind
    where it has none (a kind another target runs, or one added without it)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._by_kind: dict[Kind, F] = {}

    def on(self, *kinds: Kind) -> Callable[[F], F]:
        def register(fn: F) -> F:
            for k in kinds:
                if k in self._by_kind:
                    raise ValueError(f"{self.what}: kind {k.value} registered twice")
                self._by_kind[Kind(k)] = fn
            return fn

        return register

    def __getitem__(self, kind: str) -> F:
        fn = self._by_kind.get(kind)  # a member hashes and compares as its string
        if fn is None:
            raise NotImplementedError(f"{self.what} cannot run a {kind} kernel")
        return fn

    def covers(self) -> set[Kind]:
        return set(self._by_kind)
