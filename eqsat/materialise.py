"""Which shared loop bodies to write out once: trials over a greedy extraction.

Greedy extraction chooses per class, so a loop body several kernels recompute (Inline)
looks cheap to each of them alone. ``extract_shared`` tries such bodies materialised (Ld),
grouped across repeated layers, and keeps a trial when the whole program gets cheaper
(decision 0079). A trial re-chooses only the bodies reading the group and the kernels
evaluating them; its effect on the program's cost is counted where the choices changed
(``_LiveProgram``, decision 0086), so a trial costs what it touches, not the program.
"""

from __future__ import annotations

import heapq

from . import optable as ot
from .egraph import EGraphView
from .extract import MOVEMENT, Choice, CostModel, _check_roots, _Extractor

_THROUGH = ("ToDev", *MOVEMENT)  # what an operand of a pattern's kernel may be read through


class _LiveProgram:
    """The chosen program as reference counts: ``refs[c]`` is how many e-nodes of the
    program read class ``c`` (as ``_references`` counts them), a class is in the program
    when read or a root, and ``cost`` is what its Tensor classes own, summed.

    ``switch`` changes one class's choice and follows what enters or leaves the program,
    so a change costs the classes whose membership changes, not the program. The counts
    equal a fresh count whatever the order of the switches: every step keeps
    ``refs[c] = readings by members``, and in an acyclic choice map no class outside the
    program can be read by a member (a reader with no reader of its own would be first).
    """

    def __init__(self, best: dict[int, Choice], roots: list[int]):
        self.best = best
        self.roots = set(roots)
        self.refs = _references(best, roots)
        self.members = set(self.refs) | self.roots
        chosen = [best[c] for c in self.members if c in best]
        self.cost = sum(ch.own for ch in chosen if not ch.expr)  # ``program_cost``'s sum
        self.missing = len(self.members) - len(chosen)  # members with no choice
        self.touched: set[int] = set()  # classes whose count or choice changed

    def _enter(self, cid: int) -> None:
        stack = [cid]
        while stack:
            c = stack.pop()
            n = self.refs.get(c, 0) + 1
            self.refs[c] = n
            self.touched.add(c)
            if n > 1 or c in self.roots:
                continue
            self.members.add(c)
            ch = self.best.get(c)
            if ch is None:
                self.missing += 1
                continue
            if not ch.expr:
                self.cost += ch.own
            stack.extend(ch.enode.kids)

    def _leave(self, cid: int) -> None:
        stack = [cid]
        while stack:
            c = stack.pop()
            n = self.refs[c] - 1
            self.refs[c] = n
            self.touched.add(c)
            if n > 0 or c in self.roots:
                continue
            del self.refs[c]
            self.members.discard(c)
            ch = self.best.get(c)
            if ch is None:
                self.missing -= 1
                continue
            if not ch.expr:
                self.cost -= ch.own
            stack.extend(ch.enode.kids)

    def switch(self, cid: int, new: Choice | None) -> None:
        """Class ``cid`` now chooses ``new`` (None: it has no choice)."""
        old = self.best.get(cid)
        if new is None:
            self.best.pop(cid, None)
        else:
            self.best[cid] = new
        self.touched.add(cid)
        if cid not in self.members:
            return
        self.missing += (new is None) - (old is None)
        if new is not None:
            if not new.expr:
                self.cost += new.own
            for k in new.enode.kids:
                self._enter(k)
        if old is not None:
            if not old.expr:
                self.cost -= old.own
            for k in old.enode.kids:
                self._leave(k)

    @property
    def feasible(self) -> bool:
        return self.missing == 0


def _references(best: dict[int, Choice], roots: list[int]) -> dict[int, int]:
    """How many chosen e-nodes of the program read each class, in the order a walk from
    the roots meets them."""
    refs: dict[int, int] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for k in best[c].enode.kids:
            refs[k] = refs.get(k, 0) + 1
            stack.append(k)
    return refs


class _Candidates:
    """The bodies worth a trial, grouped: the same body at the same place of every repeated
    layer (equal readers, body cost and type) is one group. Kept up to date from the
    classes a trial touched; the next group is the one saving most, then the largest, then
    the first made (the order a listing of the program from its roots meets them)."""

    def __init__(self, view: EGraphView, model: CostModel, live: _LiveProgram):
        self.view, self.model, self.live = view, model, live
        self.tried: set[int] = set()
        self.key_of: dict[int, tuple] = {}
        self.groups: dict[tuple, dict[int, None]] = {}
        self.made: dict[tuple, int] = {}
        self.heap: list[tuple] = []
        self.ld_type: dict[int, object] = {}
        for c in live.refs:  # the program's listing order
            self.update(c)

    def _key(self, c: int) -> tuple | None:
        n = self.live.refs.get(c, 0)
        ch = self.live.best.get(c)
        if n < 2 or c in self.tried or ch is None or ch.enode.op != "Inline":
            return None
        if c not in self.ld_type:
            ld = next((en for en in self.view.classes[c] if en.op == "Ld"), None)
            self.ld_type[c] = self.model.types.get(ld.kids[0]) if ld is not None else None
        t = self.ld_type[c]
        saving = (n - 1) * ch.tree
        if t is None or saving <= self.model.machine.launch_us:
            return None
        return (round(saving, 6), n, repr(t))

    def update(self, c: int) -> None:
        key = self._key(c)
        old = self.key_of.get(c)
        if key == old:
            return
        if old is not None:
            del self.groups[old][c]
            del self.key_of[c]
            self._push(old)
        if key is not None:
            if key not in self.groups:
                self.groups[key] = {}
                self.made[key] = len(self.made)
            self.groups[key][c] = None
            self.key_of[c] = key
            self._push(key)

    def _push(self, key: tuple) -> None:
        size = len(self.groups[key])
        if size:
            heapq.heappush(self.heap, (-key[0], -size, self.made[key], key))
        else:
            del self.groups[key], self.made[key]

    def pop(self) -> list[int] | None:
        """The next group to try, taken out of the candidates for good."""
        while self.heap:
            _, size, made, key = heapq.heappop(self.heap)
            group = self.groups.get(key)
            if group is None or len(group) != -size or self.made[key] != made:
                continue  # an entry from before the group changed
            members = list(group)
            for c in members:
                del self.key_of[c]
            del self.groups[key], self.made[key]
            self.tried.update(members)
            return members
        return None


def extract_shared(
    view: EGraphView, model: CostModel, roots: list[int], max_tries: int | None = None
) -> dict[int, Choice]:
    """Greedy extraction, then shared loop bodies recomputed by several readers (Inline)
    tried materialised once (Ld), kept where the program gets cheaper (each reader alone
    cannot see it); only bodies whose repeated arithmetic could pay for a launch are tried.
    Every candidate is tried once (``max_tries`` bounds the trials when given)."""
    ex = _Extractor(view, model)
    forced: dict[int, str] = {}
    best = ex.run({}, list(ex.ids), forced)
    _check_roots(best, roots)
    live = _LiveProgram(best, roots)
    cands = _Candidates(view, model, live)

    def trial(group: list[int]) -> bool:
        """Every class of ``group`` materialised; kept if the program gets cheaper."""
        trial_forced = {**forced, **dict.fromkeys(group, "Ld")}
        log: dict[int, tuple[Choice | None, float]] = {}
        ex.run(best, ex.readers(group, best), trial_forced, log=log)
        after = {c: best.get(c) for c in log}
        for c, (old, _) in log.items():  # back to before, then each change counted
            if old is None:
                best.pop(c, None)
            else:
                best[c] = old
        before, live.touched = live.cost, set()
        for c in log:
            live.switch(c, after[c])
        if live.feasible and live.cost < before - 1e-9:
            forced.update(trial_forced)
            changed.update(log)
            for c in live.touched:
                cands.update(c)
            return True
        for c, (old, own) in reversed(log.items()):
            live.switch(c, old)
            if not ex.is_expr[c]:
                ex.set_own(c, own)
        return False

    changed: set[int] = set()  # classes the kept trials chose anew
    tries = 0
    while max_tries is None or tries < max_tries:
        group = cands.pop()
        if group is None:
            break
        tries += 1
        trial(group)
    if changed:  # the choices above the materialised bodies, on their new costs
        start = {p for c in changed for p in ex.parents[c]}
        best = ex.run(best, list(ex.ids), forced, start=start)
        _check_roots(best, roots)
    for _ in range(4):  # a pattern whose inner values escape declines (see _escaping)
        escaping = _escaping(view, best, roots)
        if not escaping:
            break
        above: set[int] = set()
        for c in escaping:
            forced[c] = "!Custom"
            above.update(ex.ancestors(c))
        best = ex.run(best, list(above), forced)
        _check_roots(best, roots)
    return best


def _escaping(view: EGraphView, best: dict[int, Choice], roots: list[int]) -> list[int]:
    """Classes whose chosen ``Custom`` kernel came from a pattern over a written-out
    computation some of whose inner values the program also computes (a training forward
    returns them for the backward). Such a pattern declines: the kernel would recompute
    what the program computes anyway. The inner values are found through the class's other
    e-nodes (the written-out form), down to the kernel's own operands, host or device twin."""
    used = set(roots) | set(_references(best, roots))  # every class the program reads
    to_dev: dict[int, list[int]] = {}
    host_of: dict[int, int] = {}
    for c, enodes in view.classes.items():
        for en in enodes:
            if en.op == "ToDev":
                to_dev.setdefault(en.kids[0], []).append(c)
            if en.op == "ToHost":
                host_of[en.kids[0]] = c
    out = []
    for c in used:
        en = best[c].enode
        if en.op != "Custom":
            continue
        stop = {c}
        lst = en.kids[0]
        while True:  # the operand list: TCons (ToDev x) rest
            cons = next((e for e in view.classes[lst] if e.op == "TCons"), None)
            if cons is None:
                break
            # an operand and what it is a view of (a transposed, expanded key): the
            # operand's, not the written-out computation's inner values
            todo = [cons.kids[0]]
            while todo:
                x = todo.pop()
                if x in stop:
                    continue
                stop.add(x)
                todo.extend(e.kids[0] for e in view.classes[x] if e.op in _THROUGH)
            # and what the program computes the operand from (two masks summed into one:
            # each mask is read by the operand, not kept alive by the written-out form),
            # a bounded walk: a class it misses only makes the pattern decline
            # (its own walk: a class the view walk above reached still has its inputs read)
            level, seen = [cons.kids[0]], {cons.kids[0]}
            for _ in range(16):
                level = list({k: None for c in level for k in best[c].enode.kids if k not in seen})
                seen.update(level)
                stop.update(level)
            lst = cons.kids[1]
        # a device value's host twin (ToDev h): the same value, the operand's too
        stop |= {e.kids[0] for x in list(stop) for e in view.classes[x] if e.op == "ToDev"}
        written = [c, host_of.get(c, c)]
        inner: set[int] = set()
        frontier = [
            k
            for w in written
            for e in view.classes[w]
            if e.op not in ("Custom", "ToHost", "ToDev", "Opaque")
            for k in e.kids
        ]
        depth = 0
        while frontier and depth < 12:
            nxt = []
            for k in frontier:
                if k in stop or k in inner:
                    continue
                if view.sort.get(k) != "Tensor":
                    continue
                # constants and leaves (an input, NoBias) are read, not computed
                if all(e.op in ot.CONSTANTS or not e.kids for e in view.classes[k]):
                    continue
                inner.add(k)
                for e in view.classes[k]:
                    if e.op not in ("ToHost", "ToDev"):
                        nxt.extend(e.kids)
            frontier, depth = nxt, depth + 1
        twins = {t for k in inner for t in to_dev.get(k, [])} - stop
        if (inner | twins) & used:
            out.append(c)
    return out
