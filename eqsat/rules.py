"""Loading rule files: saturn's own under ``rules/`` and any a user adds.

Each file is parsed with its own name, so a syntax or type error raises ``RuleError`` that
names the file and line. ``(include "other.egg")`` resolves against the including file's
folder (not the working directory, as egglog's own include would). Rulesets a user's file
declares are added to the saturation loop after saturn's.
"""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import egglog.bindings as eb

from .errors import RuleError, SourceLoc
from .graph import float_bits

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
# saturn's rule files, in load order. patterns.egg declares an opt-in ruleset.
DEFAULT_FILES = (
    "schema.egg",
    "placement.egg",
    "simplify.egg",
    "decompose.egg",
    "fusion.egg",
    "gemm.egg",
    "gather.egg",
    "patterns.egg",
)
# Rulesets that run by default, in order within one iteration; analysis runs to a fixpoint
# after each. Opt-in rulesets (they may change results in the last bits) run only on request.
DEFAULT_RULESETS = ("simplify", "decompose", "gemm", "placement", "fusion")
OPT_IN_RULESETS = ("patterns",)

_SPAN = re.compile(r"In (\d+):(\d+)-\d+ of ([^:]+):")


def _error(exc: Exception, path: Path) -> RuleError:
    text = str(exc)
    m = _SPAN.search(text)
    if m:
        loc = SourceLoc(m.group(3), int(m.group(1)), int(m.group(2)))
        message = text[m.end() :].strip()
    else:
        loc = SourceLoc(str(path))
        message = text.strip()
    return RuleError(message or "egglog rejected the file", loc)


@dataclass
class RuleSet:
    """The rule files of one compile, loaded into an e-graph by ``load_into``."""

    files: list[Path] = field(default_factory=list)
    user_rulesets: list[str] = field(default_factory=list)
    loaded: list[Path] = field(default_factory=list)  # every file read, includes too

    def load_into(self, egraph: eb.EGraph) -> None:
        seen: set[Path] = set()
        for f in self.files:
            self._load(egraph, f, seen, user=f.parent != RULES_DIR)

    def _load(self, egraph: eb.EGraph, path: Path, seen: set[Path], user: bool) -> None:
        path = path.resolve()
        if path in seen:
            return
        seen.add(path)
        self.loaded.append(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise RuleError(f"cannot read rule file: {e.strerror}", SourceLoc(str(path))) from None
        try:
            commands = egraph.parse_program(scalar_literals(text), filename=str(path))
        except eb.EggSmolError as e:
            raise _error(e, path) from None
        batch: list = []
        for cmd in commands:
            if isinstance(cmd, eb.Include):
                self._run(egraph, batch, path)
                batch = []
                self._load(egraph, path.parent / cmd.path, seen, user)
                continue
            if user and isinstance(cmd, eb.AddRuleset) and cmd.name not in self.user_rulesets:
                self.user_rulesets.append(cmd.name)
            batch.append(cmd)
        self._run(egraph, batch, path)

    @staticmethod
    def _run(egraph: eb.EGraph, commands: list, path: Path) -> None:
        if not commands:
            return
        try:
            egraph.run_program(*commands)
        except eb.EggSmolError as e:
            raise _error(e, path) from None


class Lease:
    """An e-graph holding a set of rule files' rules, lent to one saturation. Typechecking
    and compiling saturn's rules is most of a small graph's compile (50 ms a compile, 3 ms
    to lend), so each set of files is loaded once per process and lent: the borrower works
    above a ``(push)`` and ``give_back`` pops to it, which restores the e-graph as loaded
    (the same state, class numbers included, as a fresh load: extraction sees the same
    e-graph either way). A set lent already (another thread's compile, a saturation not
    closed yet) or whose files changed since it was loaded gets a fresh load of its own.
    A lease that is collected without ``give_back`` gives back then. A loaded set is
    retired after ``_LENDS`` lends: egglog keeps its run reports across a pop, so each push
    copies a little more (0.1 ms and 0.1 MB a lend measured; retiring bounds both)."""

    def __init__(self, egraph: eb.EGraph, ruleset: RuleSet, pooled: _Loaded | None) -> None:
        self.egraph, self.ruleset = egraph, ruleset
        self._pushes = [0]  # pushes since the lease began (shared with the finalizer)
        self._done = None
        if pooled is not None:
            self._done = weakref.finalize(self, _give_back, pooled, self._pushes)
            self.push()

    def push(self) -> None:
        self.egraph.run_program(*self.egraph.parse_program("(push)"))
        self._pushes[0] += 1

    def pop(self) -> None:
        self.egraph.run_program(*self.egraph.parse_program("(pop)"))
        self._pushes[0] -= 1

    def give_back(self) -> None:
        """Restore a lent e-graph as loaded and return it (a fresh one is just dropped)."""
        if self._done is not None:
            self._done()


@dataclass
class _Loaded:
    egraph: eb.EGraph
    ruleset: RuleSet
    stamp: tuple  # (file, mtime, size) of every file read, includes too
    lent: bool = False
    lends: int = 1


_POOL: dict[tuple, _Loaded] = {}  # resolved files -> their loaded e-graph, least recent first
_POOL_SIZE = 4
_LENDS = 32
_POOL_LOCK = threading.Lock()


def _stamp(paths: list[Path]) -> tuple | None:
    try:
        return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    except OSError:
        return None


def _give_back(pooled: _Loaded, pushes: list[int]) -> None:
    """Pop what the lease pushed; an e-graph that cannot be restored (egglog refused or
    panicked) leaves the pool, and later borrowers load afresh."""
    restored = False
    try:
        for _ in range(pushes[0]):
            pooled.egraph.run_program(*pooled.egraph.parse_program("(pop)"))
        restored = True
    except eb.EggSmolError:
        pass  # dropped below; the compile that borrowed it is already done
    finally:
        with _POOL_LOCK:
            pooled.lent = False
            if not restored:
                for k in [k for k, v in _POOL.items() if v is pooled]:
                    del _POOL[k]


def borrow(files: list[Path]) -> Lease:
    """An e-graph with ``files``' rules loaded (``RuleError`` names a bad file's line)."""
    key = tuple(Path(f).resolve() for f in files)
    with _POOL_LOCK:
        pooled = _POOL.get(key)
        if pooled is not None and pooled.lent:
            pooled = None  # in use: this borrower loads its own, not pooled
            pool = False
        else:
            pool = True
            if pooled is not None and (
                pooled.lends >= _LENDS or _stamp(pooled.ruleset.loaded) != pooled.stamp
            ):
                del _POOL[key]  # retired, or a file changed since it was loaded: load again
                pooled = None
            if pooled is not None:
                pooled.lent = True
                pooled.lends += 1
                _POOL[key] = _POOL.pop(key)  # most recently used last
    if pooled is not None:
        return Lease(pooled.egraph, pooled.ruleset, pooled)
    egraph, ruleset = eb.EGraph(), RuleSet(list(files))
    ruleset.load_into(egraph)
    stamp = _stamp(ruleset.loaded)
    if not pool or stamp is None:
        return Lease(egraph, ruleset, None)
    with _POOL_LOCK:
        if key in _POOL:  # another thread loaded the same files meanwhile
            return Lease(egraph, ruleset, None)
        pooled = _POOL[key] = _Loaded(egraph, ruleset, stamp, lent=True)
        for k in [k for k, v in _POOL.items() if not v.lent][: max(0, len(_POOL) - _POOL_SIZE)]:
            del _POOL[k]
    return Lease(egraph, ruleset, pooled)


_RULE_NAME = re.compile(
    r":ruleset\s+(\S+)\s+:name\s+\"([^\"]+)\"|"
    r":name\s+\"([^\"]+)\"\s+:ruleset\s+([^\s)]+)"
)


def rule_owners(files: list[Path]) -> dict[str, str]:
    """rule name -> ruleset, read from the rule files."""
    out: dict[str, str] = {}
    for f in files:
        for m in _RULE_NAME.finditer(Path(f).read_text()):
            if m.group(1):
                out[m.group(2)] = m.group(1)
            else:
                out[m.group(3)] = m.group(4)
    return out


# a number literal as a Scalar's value: "(Scalar 0.5 d)", "(Scalar -0.0 d)", "(Scalar inf d)"
_SCALAR_LITERAL = re.compile(
    r"\(Scalar(\s+)([-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf|nan))(?=[\s)])"
)


def scalar_literals(text: str) -> str:
    """Rule text with every ``(Scalar <number> ...)`` written as a float (a decimal point,
    an exponent, ``inf``, ``nan``, signed) turned into the float64 bit pattern the e-graph
    stores, as ``.graph`` files write them; integers are bit patterns already and stay."""

    def bits(m: re.Match) -> str:
        return f"(Scalar{m.group(1)}{float_bits(float(m.group(2)))}"

    return _SCALAR_LITERAL.sub(bits, text)


def rule_index(files: list[Path]) -> list[tuple[str, str, Path, int]]:
    """(ruleset, rule name, file, line of the rule's first line) of every named rule."""
    out = []
    for f in files:
        text = Path(f).read_text()
        for m in _RULE_NAME.finditer(text):
            ruleset, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            kinds = ("rule", "rewrite", "birewrite")
            start = max(text.rfind(f"({kw}", 0, m.start()) for kw in kinds)
            line = text.count("\n", 0, max(start, 0)) + 1
            out.append((ruleset, name, Path(f), line))
    return out


def rule_files(extra: list[str | Path] | None = None) -> list[Path]:
    """saturn's rule files followed by the user's (files, or folders of ``*.egg``)."""
    files = [RULES_DIR / f for f in DEFAULT_FILES]
    for item in extra or []:
        p = Path(item)
        if p.is_dir():
            files += sorted(p.glob("*.egg"))
        elif p.exists():
            files.append(p)
        else:
            raise RuleError("no such rule file or folder", SourceLoc(str(p)))
    return files
