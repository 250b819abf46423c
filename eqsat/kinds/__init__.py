"""The kernel kinds: every kind a ``Kernel`` of a ``Program`` can have, one module each.

A kind's module (``kinds/pad.py``, ...) defines its ``SPEC`` (``kinds/spec.py``): its
name, facts, e-graph term and schema declaration, typing, cost, lowering, numpy reference,
how saturn:0 runs it and which codegen module launches it on a GPU. This package finds the
modules and names the kinds (``Kind``, in each spec's ``order``); every other module names
a kind through ``Kind`` and asks its spec (``spec``, ``facts``) instead of comparing
strings. Each interpreter of a program holds a ``KindTable``, so a kind one of them lacks
is an error naming the interpreter and the kind (``tests/eqsat/test_kinds.py`` checks
that every interpreter covers every kind).

Adding a kind: its module here, its emitter in ``codegen/`` (which registers its GPU
launcher), the importer handler that produces the op it implements, and the rule that
makes its term.
"""

from __future__ import annotations

import importlib
import pkgutil
from enum import StrEnum

from .spec import KindFacts, KindSpec, KindTable, Type, nbytes

__all__ = [
    "BY_KIND",
    "FACTS",
    "TERMS",
    "Kind",
    "KindFacts",
    "KindSpec",
    "KindTable",
    "Type",
    "facts",
    "is_body",
    "nbytes",
    "spec",
]


def _specs() -> list[KindSpec]:
    found = []
    for m in pkgutil.iter_modules(__path__):
        if m.name != "spec":
            found.append(importlib.import_module(f"{__name__}.{m.name}").SPEC)
    found.sort(key=lambda s: s.order)
    orders = [s.order for s in found]
    if len(set(orders)) != len(orders):
        raise ValueError(f"two kernel kinds share an order: {[(s.name, s.order) for s in found]}")
    return found


class _Named(StrEnum):
    def __repr__(self) -> str:
        # as the string it equals: a kernel's digest (its name, its cache key) hashes the
        # repr of its fields, the same for a kind named here or read from program text
        return repr(self.value)


SPECS: list[KindSpec] = _specs()
Kind = _Named("Kind", [(s.name.upper(), s.name) for s in SPECS], module=__name__)
Kind.__doc__ = "A kernel kind: a member equals (and prints as) the name a program's text holds."
BY_KIND: dict[Kind, KindSpec] = {Kind(s.name): s for s in SPECS}
FACTS: dict[Kind, KindFacts] = {k: s.facts for k, s in BY_KIND.items()}
TERMS: dict[str, KindSpec] = {s.term: s for s in SPECS if s.term}  # e-graph term -> its kind


def spec(kind: str) -> KindSpec:
    """The spec of a kind given by its name (a ``Kind`` or the string a program holds)."""
    found = BY_KIND.get(kind)  # a member hashes and compares as its string
    if found is None:
        known = [k.value for k in Kind]
        raise ValueError(f"unknown kernel kind {kind!r}; kinds: {known}")
    return found


def facts(kind: str) -> KindFacts:
    return spec(kind).facts


def is_body(kind: str) -> bool:
    return facts(kind).body
