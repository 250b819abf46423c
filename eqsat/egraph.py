"""The e-graph of one compile: built from a graph, saturated under bounds, read back.

``Saturation`` borrows an e-graph holding the rule files' rules (``rules.borrow``: loaded
once per process, given back by ``close``), adds the graph's terms (with dtype and rank facts),
and runs one iteration at a time: every enabled ruleset once, then the analysis ruleset to
a fixpoint. It stops when an iteration changes nothing (saturated) or a bound is hit
(iterations, e-graph size, wall time) and says which. ``snapshot()`` reads the e-graph into
plain Python (``EGraphView``) for extraction and drawing.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

import egglog.bindings as eb

from . import optable as ot
from .errors import EqsatError, GraphError
from .graph import Graph
from .rules import DEFAULT_RULESETS, OPT_IN_RULESETS, Lease, borrow, rule_files, rule_index

EQ_SORTS = ("Tensor", "Expr", "TList")
ANALYSES = ("dtype", "rank", "float-dtype", "int-dtype", "device-dtype")
MATCH_LIMIT = 1_000  # the back-off scheduler's least per-rule match limit per run (egg's)
_SCHED = "saturn-back-off"
# a run expected to end within this share of the time bound past it still starts; the
# expectation is twice the last run's time scaled by growth (a run's time varies with the
# machine's load, and an overshoot cannot be taken back, an early stop costs little)
TIME_SLACK = 0.05
TIME_MARGIN = 2.0
LARGE_RUN = 0.05  # share of the time bound past which a run's estimate gets LARGE_MARGIN
LARGE_MARGIN = 3.0
RUN_OVERHEAD = 0.002  # s of a run that does not grow with the e-graph (scheduling, rebuild)
CHECKPOINT_ENODES = 4  # checkpoints hold at most this many times max_enodes e-nodes
MIN_ENODES = 50_000  # the default size bound's floor
ENODES_PER_OP = 25  # and its share per graph op (real models saturate at 5-10 per op)


@dataclass(frozen=True)
class Bounds:
    """When saturation stops: after ``iterations`` passes over the rulesets, once the
    e-graph would pass ``max_enodes`` (the pass that would is undone), or after
    ``seconds`` of wall time. Checked after every ruleset run, and every run is kept
    small by a back-off scheduler (``Saturation``); a run that would end past the time
    bound (judged from the ruleset's runs so far and how much the e-graph grew since) is
    not started, so each bound holds whatever the rules do. A run cannot be interrupted:
    the time bound is overshot by at most the run that crosses it
    (``SaturationReport.last_run``). ``max_enodes`` None (the default) scales with the
    graph: MIN_ENODES or ENODES_PER_OP per op, whichever is more, so a model ten times
    deeper saturates as fully while a rule set that multiplies e-nodes still stops."""

    iterations: int = 12
    max_enodes: int | None = None
    seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in ("iterations", "max_enodes"):
            v = getattr(self, name)
            if name == "max_enodes" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise EqsatError(f"{name} must be a whole number >= 1, got {v!r}")
        v = self.seconds
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise EqsatError(f"seconds must be a finite number > 0, got {v!r}")

    def size_bound(self, ops: int) -> int:
        """The e-node bound for a graph of ``ops`` operations."""
        if self.max_enodes is not None:
            return self.max_enodes
        return max(MIN_ENODES, ENODES_PER_OP * ops)


@dataclass
class IterationStats:
    index: int
    matches: dict[str, int]  # rule name -> matches this iteration
    enodes: int
    seconds: float
    changed: bool
    stopped: str = ""  # the bound this pass crossed, if any
    undone: bool = False  # the pass crossed the size bound and was rolled back


@dataclass
class SaturationReport:
    iterations: list[IterationStats] = field(default_factory=list)
    stop_reason: str = ""  # "saturated" or the bound that stopped it
    seconds: float = 0.0  # wall time of the whole saturation
    longest_run: float = 0.0  # the longest single ruleset run
    # the final ruleset run: when it began (s after the start) and how long it took. Every
    # run begins within the time bound; the one that crosses it cannot be interrupted, so
    # it is how far the bound was overshot
    last_start: float = 0.0
    last_run: float = 0.0

    @property
    def saturated(self) -> bool:
        return self.stop_reason == "saturated"

    def rule_totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.iterations:
            for rule, n in it.matches.items():
                out[rule] = out.get(rule, 0) + n
        return dict(sorted(out.items()))

    def summary(self) -> str:
        lines = [
            f"saturation: {self.stop_reason} after {len(self.iterations)} iterations"
            f" ({self.seconds:.2f} s)"
        ]
        for it in self.iterations:
            fired = ", ".join(f"{k} x{v}" for k, v in sorted(it.matches.items()) if v)
            lines.append(
                f"  iter {it.index}: {it.enodes} e-nodes, {it.seconds * 1e3:.1f} ms"
                f"{'' if it.changed else ' (no change)'}"
                f"{' (undone: it crossed the size bound)' if it.undone else ''}"
                f": {fired or 'no matches'}"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class ENode:
    op: str
    kids: tuple[int, ...]  # e-class ids of the e-sorted arguments, in order
    attrs: tuple  # primitive arguments, in order


@dataclass
class EGraphView:
    """A read-only copy of the e-graph: classes, their e-nodes, and the graph's roots."""

    classes: dict[int, list[ENode]]
    sort: dict[int, str]
    named: dict[str, int]  # graph node name -> e-class
    outputs: list[int]

    def enode_count(self) -> int:
        return sum(len(v) for v in self.classes.values())


def _vid(v) -> int:
    return int(str(v)[6:-1])  # "Value(12)"


def node_term(node, graph: Graph, names: dict[str, str]) -> str:
    """The egglog term of one graph node, its operands by their global names."""
    args = [names[a] for a in node.args]
    if node.op in ("Input", "Param"):
        return f'({node.op} "{node.name}")'
    if node.op == "Scalar":
        return f'(Scalar {node.attrs[0]} "{node.attrs[1]}")'
    if node.op == "Item":
        return f"(Item {args[0]} {int(node.attrs[0])})"
    if node.op == "Opaque":
        lst = "(TNil)"
        for a in reversed(args):
            lst = f"(TCons {a} {lst})"
        # the same in every process (str hash is salted per process): a recipe's e-graph,
        # and so its tie-breaks, must not depend on the process that compiled it
        uid = int.from_bytes(hashlib.blake2b(node.name.encode(), digest_size=8).digest()) >> 2
        return f'(Opaque "{node.attrs[0]}" {uid} {lst})'
    row = ot.BY_NAME[node.op]
    parts = list(args)
    for (_, kind), a in zip(row.attrs, node.attrs, strict=True):
        if kind == "ints":
            parts.append(
                "(vec-of " + " ".join(str(int(x)) for x in a) + ")" if a else "(vec-empty)"
            )
        elif kind == "str":
            parts.append(f'"{a}"')
        elif kind == "float":
            parts.append(repr(float(a)))
        else:
            parts.append(str(int(a)))
    return f"({node.op} {' '.join(parts)})"


def graph_program(graph: Graph) -> tuple[str, dict[str, str]]:
    """egglog commands adding the graph's terms and facts; the global name of each node."""
    names: dict[str, str] = {}
    lines = []
    for i, node in enumerate(graph.nodes.values()):
        g = f"$n{i}"
        lines.append(f"(let {g} {node_term(node, graph, names)})")
        lines.append(f'(set (dtype {g}) "{node.dtype}")')
        lines.append(f"(set (rank {g}) {len(node.shape)})")
        names[node.name] = g
    return "\n".join(lines) + "\n", names


class Saturation:
    """One e-graph: rules loaded, the graph added, saturated step by step."""

    def __init__(
        self,
        graph: Graph,
        rules: list | None = None,
        rewrites: list[str] | None = None,
        bounds: Bounds | None = None,
        facts: str = "",
    ):
        """``facts``: egglog facts the target machine adds to the rules' (its kernels for
        half types, ``schema.half_facts``), asserted before the graph."""
        self.graph = graph
        self.bounds = bounds or Bounds()
        self.max_enodes = self.bounds.size_bound(len(graph.nodes))
        unknown = [r for r in rewrites or [] if r not in OPT_IN_RULESETS]
        if unknown:
            raise EqsatError(
                f"unknown rewrites {unknown}; opt-in rulesets: {list(OPT_IN_RULESETS)}"
            )
        self._lease: Lease | None = borrow(rule_files(rules))
        self.ruleset = self._lease.ruleset
        try:
            self._start_graph(graph, rewrites, facts)
        except BaseException:
            self.close()
            raise

    def _start_graph(self, graph: Graph, rewrites: list[str] | None, facts: str) -> None:
        self.rulesets = [*DEFAULT_RULESETS, *self.ruleset.user_rulesets, *(rewrites or [])]
        text, self.names = graph_program(graph)
        try:
            if facts:
                self._run(facts, "<machine facts>")
            self._run(text, "<graph>")
        except eb.EggSmolError as e:
            raise GraphError(f"the graph does not fit the term language: {e}") from None
        # One back-off scheduler for the whole saturation (egg's policy): a rule that
        # matches more than its limit in a run is not applied and sits out a few runs,
        # its limit and ban doubling each time. Rules that grow the e-graph without
        # bound (associativity, commutativity) then grow it a step at a time, and no run
        # is long or large enough to carry a bound far past its value. The limit scales
        # with the graph, so rules matching each node a few times are never held back.
        limit = min(max(MATCH_LIMIT, 4 * self.enodes()), max(1, self.max_enodes // 10))
        self._run(f"(let-scheduler {_SCHED} (back-off :match-limit {limit}))", "<schedule>")
        self._runs = {
            r: self.egraph.parse_program(f"(run-schedule (run-with {_SCHED} {r}))", "<schedule>")
            for r in [*self.rulesets, "analysis"]
        }
        self.report = SaturationReport()
        self._deadline = math.inf
        self._start = time.perf_counter()
        self._kept = 0
        self._pass_checkpoint = False
        self._size = 0  # e-nodes after the last run (what _over read)
        self._stale = True  # whether a run changed the e-graph since _size was read
        self._last: dict[str, tuple[float, int]] = {}  # ruleset -> (its last run's s, size)
        self._longest: dict[str, float] = {}  # ruleset -> its longest run's s
        self._rate: dict[str, float] = {}  # ruleset -> its costliest run's s per e-node
        self._fired: tuple[str, dict[str, int]] | None = None  # last changing run's rules

    @property
    def egraph(self) -> eb.EGraph:
        if self._lease is None:
            raise EqsatError(
                "this saturation is closed (compile_graph closes its own once it has read "
                "the e-graph back); saturate again to look at the e-graph"
            )
        return self._lease.egraph

    def close(self) -> None:
        """Give the rules' e-graph back (``rules.Lease``): what the graph added is dropped,
        the report and any snapshot taken stay."""
        if self._lease is not None:
            self._lease.give_back()
            self._lease = None

    def __enter__(self) -> Saturation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, text: str, name: str):
        return self.egraph.run_program(*self.egraph.parse_program(text, filename=name))

    def enodes(self) -> int:
        out = self._run("(print-size)", "<size>")
        return sum(
            n for fname, n in out[0].sizes if fname not in ANALYSES and not fname.startswith("$")
        )

    def _measure(self) -> int:
        """The e-graph's e-nodes, read again only after a run that changed it (a run
        reporting no update leaves every table as it was; most runs of a saturating graph
        change nothing, and each reading is an egglog call)."""
        if self._stale:
            self._size, self._stale = self.enodes(), False
        return self._size

    def _run_ruleset(self, name: str, matches: dict[str, int]) -> tuple[bool, bool]:
        """One scheduled run of a ruleset: (whether it changed the e-graph, whether the
        scheduler held no rule back)."""
        t0 = time.perf_counter()
        try:
            out = self.egraph.run_program(*self._runs[name])
            took = time.perf_counter() - t0
            self.report.longest_run = max(self.report.longest_run, took)
            self.report.last_start = t0 - self._start
            self.report.last_run = took
            self._longest[name] = max(took, self._longest.get(name, 0.0))
            if name in self._last:  # a ruleset's first run compiles its rules: no measure
                work = max(0.0, took - RUN_OVERHEAD) / max(self._size, 1)
                self._rate[name] = max(work, self._rate.get(name, 0.0))
            self._last[name] = (took, self._size)
        except BaseException as e:  # egglog panics (conflicting analysis facts) are not Exceptions
            raise EqsatError(
                f"saturation failed in ruleset {name}: {e}{self._culprits()}"
            ) from None
        report = out[0].report
        self._stale = self._stale or report.updated
        for rule, n in report.num_matches_per_rule.items():
            matches[rule] = matches.get(rule, 0) + n
        if name != "analysis" and report.updated:
            self._fired = (name, {r: n for r, n in report.num_matches_per_rule.items() if n})
        return report.updated, report.can_stop

    def _culprits(self) -> str:
        """The rules of the last run that changed the e-graph, with file and line: an
        analysis that panics (two values merged whose rank or dtype differ) was handed the
        merge by one of them."""
        if self._fired is None:
            return ""
        name, fired = self._fired
        where = {n: f"{f}:{line}" for _, n, f, line in rule_index(self.ruleset.loaded)}
        rules = ", ".join(f"{r} x{n} ({where.get(r, 'no file')})" for r, n in sorted(fired.items()))
        return (
            f"; the last rules to change the e-graph (ruleset {name}): {rules}. A rule that "
            "makes two values equal must keep their rank and dtype"
        )

    def _over(self) -> str:
        """The bound a run has crossed ("" while within them)."""
        if time.perf_counter() > self._deadline:
            return f"time bound ({self.bounds.seconds} s)"
        if self._measure() > self.max_enodes:
            return f"size bound ({self.max_enodes} e-nodes)"
        return ""

    def _would_overrun(self, name: str) -> str:
        """The time bound, if a run of ``name`` now would likely end past it: its last run's
        time, scaled by how much the e-graph grew since (matching grows with it). A run
        cannot be interrupted, so without this the bound overshoots by one run (a tenth
        of a second and more on rules that explode); with it, by a misjudged one."""
        last = self._last.get(name)
        if last is None or self._deadline == math.inf:
            return ""
        # the longest run so far counts too: a rule the back-off scheduler lets back in
        # makes a run several times its predecessor (0.5 s bounds overshot by up to 35%)
        took, size = last
        grown = took * max(1.0, self._size / max(size, 1))
        # a rule back from a ban searches (and applies its matches on) the e-graph as it is
        # now: its ruleset's costliest run per e-node, at today's size (a run at 100,000
        # e-nodes took 0.16 s after runs of a millisecond while the rule sat out)
        full = self._rate.get(name, 0.0) * self._size
        estimate = max(grown, self._longest[name], full)
        # a run that is a large share of the bound is what a load change makes overshoot
        # it: such runs get a wider margin (the default bound's runs are a few percent of it)
        margin = TIME_MARGIN if estimate < LARGE_RUN * self.bounds.seconds else LARGE_MARGIN
        expected = margin * estimate
        if time.perf_counter() + expected > self._deadline + TIME_SLACK * self.bounds.seconds:
            return f"time bound ({self.bounds.seconds} s)"
        return ""

    def _analyse(self, matches: dict[str, int]) -> tuple[bool, str]:
        """The analysis ruleset to a fixpoint, one scheduled run at a time."""
        changed = False
        while True:
            over = self._would_overrun("analysis")
            if over:
                return changed, over
            self._checkpoint()
            updated, settled = self._run_ruleset("analysis", matches)
            changed |= updated
            over = self._over()
            if over or (not updated and settled):
                return changed, over

    def step(self) -> IterationStats:
        """Every enabled ruleset once, then the analyses to a fixpoint; stops early at a
        bound (``stats.stopped``)."""
        t0 = time.perf_counter()
        matches: dict[str, int] = {}
        changed, settled, over = False, True, ""
        for r in self.rulesets:
            over = self._would_overrun(r)
            if over:
                break
            self._checkpoint()
            updated, can_stop = self._run_ruleset(r, matches)
            changed, settled = changed or updated, settled and can_stop
            over = self._over()
            if over:
                break
        if not over:
            updated, over = self._analyse(matches)
            changed |= updated
        stats = IterationStats(
            len(self.report.iterations) + 1,
            matches,
            self._measure(),
            time.perf_counter() - t0,
            changed or not settled,  # a held-back rule may still change it
            over,
        )
        self.report.iterations.append(stats)
        return stats

    def _checkpoint(self) -> None:
        """Once per pass, as soon as the e-graph holds half the size bound: a copy to go
        back to if the pass crosses the bound. Copies cost time (egglog copies every
        table) and memory (they stack), so none is taken far from the bound, and their
        e-nodes are capped at CHECKPOINT_ENODES times the bound."""
        if self._pass_checkpoint:
            return
        size = self._measure()
        if 2 * size < self.max_enodes:
            return
        if self._kept + size > CHECKPOINT_ENODES * self.max_enodes:
            return
        self._lease.push()
        self._kept += size
        self._pass_checkpoint = True

    def run(self) -> SaturationReport:
        start = time.perf_counter()
        self._start, self._deadline = start, start + self.bounds.seconds
        self._kept = 0  # e-nodes held by checkpoints
        self._size, self._stale = self.enodes(), False
        _, over = self._analyse({})
        while not over:
            if len(self.report.iterations) >= self.bounds.iterations:
                self.report.stop_reason = f"iteration bound ({self.bounds.iterations})"
                break
            self._pass_checkpoint = False
            stats = self.step()
            over = stats.stopped
            if over.startswith("size") and self._pass_checkpoint:
                self._lease.pop()  # undo the pass: stop before it
                self._stale = True
                stats.undone, stats.enodes = True, self._measure()
            if not stats.changed:
                self.report.stop_reason = "saturated"
                break
        if over:
            self.report.stop_reason = over
        self.report.seconds = time.perf_counter() - start
        return self.report

    def snapshot(self) -> EGraphView:
        frozen = self.egraph.freeze()
        classes: dict[int, list[ENode]] = {}
        sort: dict[int, str] = {}
        globals_: dict[str, int] = {}
        for fname, fn in frozen.functions.items():
            if fn.is_let_binding:
                for row in fn.rows:
                    globals_[fname] = _vid(row.output)
                continue
            if fn.output_sort not in EQ_SORTS:
                continue
            in_sorts = list(fn.input_sorts)
            for row in fn.rows:
                if row.subsumed:
                    continue
                kids, attrs = [], []
                for s, v in zip(in_sorts, row.inputs, strict=True):
                    if s in EQ_SORTS:
                        kids.append(_vid(v))
                    else:
                        attrs.append(self._decode(s, v))
                cid = _vid(row.output)
                sort[cid] = fn.output_sort
                classes.setdefault(cid, []).append(ENode(fname, tuple(kids), tuple(attrs)))
        named = {n: globals_[g] for n, g in self.names.items()}
        outputs = [named[o] for o in self.graph.outputs]
        return EGraphView(classes, sort, named, outputs)

    def _decode(self, sort: str, v):
        e = self.egraph
        if sort == "i64":
            return e.value_to_i64(v)
        if sort == "f64":
            return e.value_to_f64(v)
        if sort == "String":
            return e.value_to_string(v)
        if sort == "IVec":
            return tuple(e.value_to_i64(x) for x in e.value_to_vec(v))
        if sort == "bool":
            return e.value_to_bool(v)
        raise EqsatError(f"cannot read a value of sort {sort}")
