"""Errors at the edges of saturn.eqsat: each names the file and line it comes from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if not self.line:
            return self.file
        return f"{self.file}:{self.line}:{self.col}"


class EqsatError(Exception):
    """Base class: a message and, where known, the source location."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.message = message
        self.loc = loc
        super().__init__(f"{loc}: {message}" if loc else message)


class GraphError(EqsatError):
    """A malformed graph (text or imported)."""


class RuleError(EqsatError):
    """A rule file that does not parse or does not type-check."""


class ValidationError(EqsatError):
    """A program that breaks an invariant after a named step (import, extract, lower)."""
