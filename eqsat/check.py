"""``python -m saturn.eqsat check RULES.egg ...``: fuzz each rule's two sides.

For every rule of the form ``(rewrite L R)`` or ``(rule ((= e L) guards...) ((union e R)))``
whose sides are graph terms (no loop bodies, device twins or attribute variables), and for
every dtype of ``DTYPES``:

1. the rule's guards decide: a graph holding ``L`` over rank-0 inputs of that dtype is
   saturated with the rule's file loaded, and the dtype counts only where the rule fired;
2. ``L`` and ``R`` are evaluated by the numpy evaluator (``evaluate.py``, the op table's
   semantics) over special values: NaN, both infinities, both zeros, a subnormal, the
   largest finite values, ordinary numbers; integer extremes for integer dtypes;
3. results must agree bit for bit (NaN with NaN, -0.0 with -0.0).

A rule with attribute variables (``(rewrite (View (Neg x) s) (Neg (View x s)))``: ``s`` sits
where the op table puts an attribute) is checked on inputs of shape ``SHAPED`` instead,
its variables bound to values from ``ATTR_VALUES`` that make both sides graphs (the graph
parser's shape checks decide), at most ``MAX_BINDINGS`` bindings, each input filled with
the special values in several orders.

A counterexample names the rule, its file and line, the dtype, the inputs and both results.
Rules of other forms are listed as not checked, with the reason."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import optable
from .egraph import Bounds, Saturation
from .errors import EqsatError
from .evaluate import eval_graph, np_dtype
from .graph import Graph, bits_float, parse_graph, read_sexprs

DTYPES = ("f16", "f32", "f64", "i32", "i64")
MAX_CASES = 400  # input combinations per rule and dtype (all of them for one or two inputs)
SHAPED = (2, 3)  # the inputs' shape where a rule has attribute variables
# candidate values of an attribute variable, by the op table's attribute kind: integers
# (dims, slice bounds, steps, flags) and integer lists (shapes, permutations, dims)
ATTR_VALUES = {
    "int": ("0", "1", "2", "3", "-1"),
    "ints": ("[6]", "[3 2]", "[2 3]", "[1 6]", "[4 2 3]", "[1 0]", "[0 1]", "[1]", "[2 1 3]"),
    # a scalar's value where a rule leaves it a variable (Scalar b d)
    "bits": ("0.5", "-0.0", "inf", "nan", "-3.0"),
}
MAX_BINDINGS = 8  # attribute bindings tried per rule and dtype, spread over those that fit
MAX_CANDIDATES = 400  # bindings parsed per rule and dtype (evenly spaced) to find those that fit
FILLS = 12  # orders of the special values an input of shape SHAPED is filled with


def special_values(dtype: str) -> list:
    t = np_dtype(dtype)
    if np.issubdtype(t, np.floating):
        info = np.finfo(t)
        return [t(v) for v in (np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -2.5)] + [
            info.smallest_subnormal,
            -info.smallest_subnormal,
            info.max,
            info.min,
        ]
    info = np.iinfo(t)
    return [t(v) for v in (0, 1, -1, 2, -3, 7)] + [t(info.max), t(info.min), t(info.max - 1)]


@dataclass
class Rule:
    name: str
    file: Path
    line: int
    lhs: object  # s-expression
    rhs: object
    dvars: frozenset[str] = frozenset()  # variables a guard binds to a dtype
    guarded: bool = False  # a (rule ...) with guards; a (rewrite L R) fires wherever L is

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Report:
    checked: list[str]
    skipped: list[str]  # "name (file:line): why"
    counterexamples: list[str]

    def __str__(self) -> str:
        lines = [f"checked {len(self.checked)} rules, skipped {len(self.skipped)}"]
        lines += [f"  not checked: {s}" for s in self.skipped]
        lines += [f"COUNTEREXAMPLE {c}" for c in self.counterexamples]
        return "\n".join(lines)


def _text(x) -> str:
    """An s-expression back as text."""
    if isinstance(x, tuple) and x[0] == "[":
        return "[" + " ".join(_text(i) for i in x[2]) + "]"
    if isinstance(x, tuple):
        return "(" + " ".join(_text(i) for i in x[1]) + ")"
    return f'"{x.text}"' if x.quoted else x.text


def _atoms(x) -> list:
    if isinstance(x, tuple):
        items = x[2] if x[0] == "[" else x[1]
        return [a for i in items for a in _atoms(i)]
    return [x]


def _head(x) -> str:
    return x[1][0].text if isinstance(x, tuple) and x[0] != "[" and x[1] else ""


def read_rules(path: Path) -> tuple[list[Rule], list[str]]:
    """The rules of a file in the checked forms, and the others with the reason."""
    rules, skipped = [], []
    for form in read_sexprs(path.read_text(), str(path)):
        head = _head(form)
        if head not in ("rule", "rewrite", "birewrite"):
            continue
        items = form[1]
        kw = {items[i].text: items[i + 1] for i in range(len(items) - 1) if _is_kw(items[i])}
        name = kw[":name"].text if ":name" in kw else f"<unnamed rule at line {form[0].loc.line}>"
        line = form[0].loc.line
        if head in ("rewrite", "birewrite"):
            rules.append(Rule(name, path, line, items[1], items[2]))
            continue
        query, actions = items[1], items[2]
        lhs = [q for q in query[1] if _head(q) == "=" and not isinstance(q[1][1], tuple)]
        acts = actions[1] if isinstance(actions, tuple) else []
        if len(lhs) >= 1 and len(acts) == 1 and _head(acts[0]) == "union":
            e = lhs[0][1][1].text
            union = acts[0][1]
            if isinstance(union[1], tuple) or union[1].text != e:
                skipped.append(f"{name} ({path}:{line}): the union is not of the matched value")
                continue
            dvars = frozenset(
                q[1][1].text
                for q in query[1]
                if _head(q) == "=" and not isinstance(q[1][1], tuple) and _head(q[1][2]) == "dtype"
            )
            rules.append(Rule(name, path, line, lhs[0][1][2], union[2], dvars, True))
        else:
            skipped.append(f"{name} ({path}:{line}): not (= e L) ... ((union e R))")
    return rules, skipped


def _is_kw(t) -> bool:
    return not isinstance(t, tuple) and t.text.startswith(":") and not t.quoted


_NOT_GRAPH = {"Loop", "Reduce", "Ld", "ToDev", "ToHost", "Inline", "Custom", "TCons", "TNil"}


def _graph_term(x, dtype: str, dvars: set[str], bound: dict[str, str] | None = None) -> str:
    """An s-expression of the rule as a graph term: dtype variables bound, attribute
    variables replaced by ``bound``'s values, scalars written as numbers (a rule's integer
    there is float64 bits)."""
    if isinstance(x, tuple) and x[0] == "[":
        return _text(x)
    if isinstance(x, tuple):
        items = x[1]
        if _head(x) == "Scalar" and len(items) == 3:
            v = items[1].text
            if bound and v in bound:
                v = bound[v]
            elif v.lstrip("-").isdigit():
                v = repr(bits_float(int(v)))
            return f"(Scalar {v} {dtype})"
        return "(" + " ".join(_graph_term(i, dtype, dvars, bound) for i in items) + ")"
    if x.text in dvars:
        return dtype
    if bound and not x.quoted and x.text in bound:
        return bound[x.text]
    return f'"{x.text}"' if x.quoted else x.text


def _vars(rule: Rule) -> tuple[list[str], set[str], dict[str, str], str]:
    """(tensor variables, dtype variables, attribute variables with their kind, why the
    rule cannot be checked or ""). A variable is an attribute where the op table puts one
    (after the op's tensor operands)."""
    heads = {a.text for a in _atoms(rule.lhs) + _atoms(rule.rhs)}
    if heads & _NOT_GRAPH:
        return [], set(), {}, "a side is a device program (loop bodies, crossings)"
    dvars: set[str] = set(rule.dvars)
    tensors: list[str] = []
    attrs: dict[str, str] = {}
    for side in (rule.lhs, rule.rhs):
        stack = [side]
        while stack:
            x = stack.pop()
            if not isinstance(x, tuple) or x[0] == "[":
                continue
            items = x[1]
            if _head(x) == "Scalar" and len(items) == 3 and not isinstance(items[2], tuple):
                dvars.add(items[2].text)
                bits = items[1]
                if isinstance(bits, tuple):  # a value computed from the match's bits
                    why = "a scalar computed from the match (its special-value test checks it)"
                    return [], set(), {}, why
                if not isinstance(bits, tuple) and bits.text[:1].islower() and side is rule.lhs:
                    attrs.setdefault(bits.text, "bits")
                continue
            row = optable.BY_NAME.get(_head(x))
            for i, a in enumerate(items[1:]):
                if isinstance(a, tuple):
                    stack.append(a)
                elif a.text[:1].islower() and not a.quoted and side is rule.lhs:
                    kind = row.attrs[i - row.arity][1] if row and i >= row.arity else ""
                    if kind in ATTR_VALUES:
                        attrs.setdefault(a.text, kind)
                    elif a.text not in tensors and a.text not in dvars:
                        tensors.append(a.text)
    if not tensors:
        return [], dvars, attrs, "no tensor variable"
    return tensors, dvars - set(tensors), attrs, ""


def _inputs_text(tensors: list[str], dtype: str, shape: tuple[int, ...]) -> str:
    dims = " ".join(map(str, shape))
    return "".join(f"(input {v} {dtype} [{dims}])\n" for v in tensors)


def _graph(term: str, tensors: list[str], dtype: str, shape: tuple[int, ...] = ()) -> str:
    return f"{_inputs_text(tensors, dtype, shape)}(let result {term})\n(output result)\n"


def _graph_all(terms: list[str], tensors: list[str], dtype: str, shape: tuple[int, ...]) -> Graph:
    """One graph holding every term (over the same inputs), each an output."""
    lets = "".join(f"(let result_{i} {t})\n" for i, t in enumerate(terms))
    outputs = " ".join(f"result_{i}" for i in range(len(terms)))
    return parse_graph(f"{_inputs_text(tensors, dtype, shape)}{lets}(output {outputs})\n")


def _fires(rule: Rule, lhs: Graph) -> bool:
    """Whether the rule matches ``lhs`` within two iterations: saturation alone (what
    extraction and lowering would make of it is not the question)."""
    report = Saturation(lhs, rules=[rule.file], bounds=Bounds(2)).run()
    return report.rule_totals().get(rule.name, 0) > 0


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if np.issubdtype(a.dtype, np.floating):
        nan = np.isnan(a)
        if not np.array_equal(nan, np.isnan(b)):
            return False
        return bool(np.array_equal(a[~nan].view(np.uint8), b[~nan].view(np.uint8)))
    return bool(np.array_equal(a, b))


def _spread(items: list, n: int) -> list:
    """At most ``n`` of ``items``, evenly spaced, the first and the last kept."""
    if len(items) <= n:
        return items
    step = (len(items) - 1) / (n - 1)
    return [items[round(i * step)] for i in range(n)]


def _bindings(attrs: dict[str, str]) -> list[dict[str, str]]:
    """Every assignment of candidate values to the attribute variables (the graph parser
    rejects the ones that do not fit the inputs' shape)."""
    names = sorted(attrs)
    pools = [ATTR_VALUES[attrs[n]] for n in names]
    return [dict(zip(names, vals, strict=True)) for vals in itertools.product(*pools)]


def _inputs(tensors: list[str], dtype: str, shape: tuple[int, ...]) -> list[dict]:
    """Input combinations: every pair of special values at rank 0 (a sample past
    MAX_CASES); with a shape, FILLS orders of the special values per input."""
    values = special_values(dtype)
    rng = np.random.default_rng(0)
    if not shape:
        combos = list(itertools.product(values, repeat=len(tensors)))
        if len(combos) > MAX_CASES:
            combos = [combos[i] for i in rng.choice(len(combos), MAX_CASES, replace=False)]
        return [{v: np.array(x) for v, x in zip(tensors, c, strict=True)} for c in combos]
    n = int(np.prod(shape))
    pool = np.array(values)
    return [
        {v: rng.choice(pool, n).reshape(shape).astype(pool.dtype) for v in tensors}
        for _ in range(FILLS)
    ]


def _show(x: np.ndarray) -> str:
    return repr(x) if x.ndim == 0 else f"{x.tolist()} ({x.dtype})"


def _counterexample(lhs: Graph, rhs_term: str, rhs: Graph | None, cases: list[dict]) -> str:
    """The first inputs on which the two sides differ, with both results ("" if none)."""
    with np.errstate(all="ignore"):
        for inputs in cases:
            (want,) = eval_graph(lhs, inputs)
            got = inputs[rhs_term] if rhs is None else eval_graph(rhs, inputs)[0]
            if not _same(want, got):
                args = ", ".join(f"{v}={_show(x)}" for v, x in inputs.items())
                return f"{args}: left {_show(np.asarray(want))}, right {_show(np.asarray(got))}"
    return ""


def check_rule(rule: Rule) -> tuple[str, list[str]]:
    """("" or why not checked, counterexamples)."""
    tensors, dvars, attrs, why = _vars(rule)
    if why:
        return why, []
    shape = SHAPED if attrs else ()
    found: list[str] = []
    fired_any = built_any = False
    not_terms = ""
    for dtype in DTYPES:
        pairs = []  # (binding, left graph, right term, right graph or None)
        for bound in _spread(_bindings(attrs), MAX_CANDIDATES):
            try:
                lhs_term = _graph_term(rule.lhs, dtype, dvars, bound)
                lhs = parse_graph(_graph(lhs_term, tensors, dtype, shape))
                rhs_term = _graph_term(rule.rhs, dtype, dvars, bound)
                rhs = (
                    None
                    if rhs_term in tensors
                    else parse_graph(_graph(rhs_term, tensors, dtype, shape))
                )
            except EqsatError as e:  # not a term of this dtype or shape: the next one
                not_terms = not_terms or f"its sides are not graph terms ({str(e).splitlines()[0]})"
                continue
            pairs.append((bound, lhs, rhs_term, rhs, lhs_term))
            built_any = True
        pairs = _spread(pairs, MAX_BINDINGS)  # over the bindings that fit
        if rule.guarded and len(pairs) > 1:
            # one saturation of every binding's left side together: where the rule matches
            # none of them, the guards decline this dtype (asked binding by binding below
            # only where it matches some)
            together = _graph_all([t for *_, t in pairs], tensors, dtype, shape)
            try:
                declined = not _fires(rule, together)
            except Exception:  # asked again binding by binding below, which reports it
                declined = False
            if declined:
                continue
        for bound, lhs, rhs_term, rhs, _ in pairs:
            try:
                # a rewrite has no guards: it fires wherever its left side is a graph term
                if rule.guarded and not _fires(rule, lhs):
                    continue  # the guards decline this dtype
            except EqsatError as e:
                found.append(f"{rule.name} ({rule.where}) {dtype}: saturation failed: {e}")
                continue
            except Exception as e:  # a term the checker built wrongly, not the rule's fault
                return f"its left side does not compile as a graph ({type(e).__name__}: {e})", []
            fired_any = True
            at = "".join(f" {k}={v}" for k, v in bound.items())
            try:
                bad = _counterexample(lhs, rhs_term, rhs, _inputs(tensors, dtype, shape))
            except NotImplementedError as e:  # an op the numpy reference does not evaluate
                return f"{e} (the rule cannot be evaluated)", []
            if bad:
                found.append(f"{rule.name} ({rule.where}) {dtype}{at}: {bad}")
                break  # one per dtype: the first binding that shows it
    if not fired_any:
        where = f"inputs of shape {list(shape)}" if shape else "rank-0 inputs"
        declined = "it fired for none of " + ", ".join(DTYPES) + f" on {where}"
        return (declined if built_any else not_terms), []
    return "", found


def check_files(paths: list[str | Path]) -> Report:
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.egg")) if p.is_dir() else [p]
    report = Report([], [], [])
    for f in files:
        rules, skipped = read_rules(f)
        report.skipped += skipped
        for rule in rules:
            why, found = check_rule(rule)
            if why:
                report.skipped.append(f"{rule.name} ({rule.where}): {why}")
            else:
                report.checked.append(rule.name)
            report.counterexamples += found
    return report
