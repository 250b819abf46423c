"""Random programs of PyTorch ops, compiled by saturn and compared with eager on the CPU.

A program is Python source (so dynamo traces it as it traces a user's code) over a few
inputs: elementwise arithmetic with broadcasting and Python scalars (special values
included), comparisons and ``where``, integer arithmetic, casts, reductions, views,
copies, indexing with negative indices, and matrix products, in mixed dtypes. Each run
checks, against eager PyTorch on CPU copies of the same inputs:

- values: floats within ``RTOL`` with NaN where eager has NaN, integers and booleans
  exactly;
- ownership: a compiled output shares memory with an input exactly where eager's does,
  and writing to an output changes no input that eager's would not;
- freshness: the inputs are then written in one of the ways PyTorch does not count
  (in place, through ``.data``, numpy, DLPack), and a second call must see the writes.

``generate(seed)`` is deterministic; ``check(program, device)`` returns a list of
mismatches (empty when the program passed).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

RTOL = {torch.float32: 2e-5, torch.float64: 1e-12}
SPECIAL = ["0.0", "-0.0", "1.0", "-1.0", "0.5", "2.0", "3.0", "float('inf')", "float('-inf')"]
UNARY = [
    "torch.neg({})",
    "torch.abs({})",
    "torch.exp({})",
    "torch.log({})",
    "torch.sqrt({})",
    "torch.tanh({})",
    "torch.sigmoid({})",
    "torch.relu({})",
    "torch.rsqrt({})",
    "torch.nn.functional.silu({})",
    "torch.floor({})",
    "torch.sin({})",
    "torch.reciprocal({})",
]
BINARY = [
    "{} + {}",
    "{} - {}",
    "{} * {}",
    "{} / {}",
    "torch.maximum({}, {})",
    "torch.minimum({}, {})",
]
INT_BINARY = ["{} + {}", "{} - {}", "{} * {}"]
SCALAR_BINARY = [*INT_BINARY, "{} / {}"]
CLAMPS = ["torch.clamp({}, min={})", "torch.clamp({}, max={})"]
COMPARE = ["{} > {}", "{} < {}", "{} == {}", "{} >= {}"]
FLOAT_DTYPES = [torch.float32, torch.float64]
INT_DTYPES = [torch.int32, torch.int64]


@dataclass
class Value:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass
class Program:
    seed: int
    source: str
    inputs: list[tuple[str, torch.dtype, tuple[int, ...], str]]  # name, dtype, shape, layout
    lines: list[str] = field(default_factory=list)
    # signs of zero are compared unless the program has torch.maximum or torch.minimum,
    # whose ties of -0.0 and +0.0 PyTorch's CPU kernels resolve differently on their scalar
    # and vector paths, or a matrix product
    signed_zeros: bool = True

    def function(self):
        scope: dict = {"torch": torch}
        exec(compile(self.source, f"<fuzz program {self.seed}>", "exec"), scope)
        return scope["program"]


class _Builder:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.values: list[Value] = []
        self.lines: list[str] = []
        self.count = 0
        self.signed_zeros = True

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def add(self, expr: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Value:
        self.signed_zeros &= "torch.maximum" not in expr and "torch.minimum" not in expr
        # nor with a matrix product: the sign of a zero dot product is the library's (CPU
        # BLAS and eager CUDA's float32 and bfloat16 products give +0.0 for a one-term -0.0,
        # eager CUDA's float64 keeps -0.0, as saturn's cuBLASLt plan does in float32: GPU
        # fuzz seed 1960; measured in bench/RESULTS.md)
        self.signed_zeros &= " @ " not in expr
        v = Value(self.fresh(), dtype, shape)
        self.lines.append(f"    {v.name} = {expr}")
        self.values.append(v)
        return v

    def pick(self, pred=lambda v: True) -> Value | None:
        pool = [v for v in self.values if pred(v)]
        return self.rng.choice(pool) if pool else None

    def partner(self, v: Value) -> Value | None:
        """Another value of v's dtype class whose shape broadcasts with v's."""

        def ok(w: Value) -> bool:
            if (w.dtype.is_floating_point != v.dtype.is_floating_point) or w.dtype == torch.bool:
                return False
            try:
                torch.broadcast_shapes(v.shape, w.shape)
            except RuntimeError:
                return False
            return True

        return self.pick(ok)

    # --- op kinds: each returns False where it does not apply to what is there -------

    def elementwise(self) -> bool:
        v = self.pick(lambda v: v.dtype.is_floating_point)
        if v is None:
            return False
        r = self.rng.random()
        if r < 0.35:
            self.add(self.rng.choice(UNARY).format(v.name), v.dtype, v.shape)
            return True
        if r < 0.6:
            c = self.rng.choice(SPECIAL)
            if self.rng.random() < 0.2:
                self.add(self.rng.choice(CLAMPS).format(v.name, c), v.dtype, v.shape)
                return True
            op = self.rng.choice(SCALAR_BINARY)
            args = (v.name, c) if self.rng.random() < 0.7 else (c, v.name)
            self.add(op.format(*args), v.dtype, v.shape)
            return True
        return self.with_partner(v, BINARY)

    def integer(self) -> bool:
        v = self.pick(lambda v: v.dtype in INT_DTYPES)
        if v is None:
            return False
        r = self.rng.random()
        if r < 0.5:
            c = self.rng.choice(["1", "-3", "7", "0"])
            self.add(self.rng.choice(INT_BINARY).format(v.name, c), v.dtype, v.shape)
        elif r < 0.8:
            d = self.rng.choice(["3", "5", "1"])
            op = self.rng.choice(["{} // {}", "{} % {}"])
            self.add(op.format(v.name, d), v.dtype, v.shape)
            return self.with_partner(v, INT_BINARY)
        return True

    def with_partner(self, v, ops) -> bool:
        """``v`` op a second value it broadcasts with, in their promoted dtype."""
        w = self.partner(v)
        if w is None:
            return False
        dtype = torch.promote_types(v.dtype, w.dtype)
        shape = tuple(torch.broadcast_shapes(v.shape, w.shape))
        self.add(self.rng.choice(ops).format(v.name, w.name), dtype, shape)
        return True

    def compare_where(self) -> bool:
        v = self.pick(lambda v: v.dtype != torch.bool)
        if v is None:
            return False
        w = self.partner(v)
        if w is None:
            return False
        shape = tuple(torch.broadcast_shapes(v.shape, w.shape))
        cond = self.add(self.rng.choice(COMPARE).format(v.name, w.name), torch.bool, shape)
        if self.rng.random() < 0.6:
            dtype = torch.promote_types(v.dtype, w.dtype)
            self.add(f"torch.where({cond.name}, {v.name}, {w.name})", dtype, shape)
        return True

    def cast(self) -> bool:
        v = self.pick(lambda v: v.dtype != torch.bool)
        if v is None:
            return False
        to = self.rng.choice([*FLOAT_DTYPES, *INT_DTYPES])
        if v.dtype.is_floating_point and not to.is_floating_point:
            # values that fit: out-of-range conversions have a test of their own
            expr = f"torch.clamp({v.name}, -1000.0, 1000.0).nan_to_num(0.0).to({to})"
        else:
            expr = f"{v.name}.to({to})"
        self.add(expr, to, v.shape)
        return True

    def reduce(self) -> bool:
        v = self.pick(lambda v: v.shape and v.dtype != torch.bool)
        if v is None:
            return False
        dim = self.rng.randrange(len(v.shape))
        keep = self.rng.random() < 0.4
        shape = tuple(1 if d == dim else n for d, n in enumerate(v.shape) if keep or d != dim)
        ops = ["sum", "amax", "amin"] + (["mean"] if v.dtype.is_floating_point else [])
        op = self.rng.choice(ops)
        dtype = torch.int64 if op == "sum" and not v.dtype.is_floating_point else v.dtype
        self.add(f"{v.name}.{op}({dim}, keepdim={keep})", dtype, shape)
        return True

    def view(self) -> bool:
        v = self.pick(lambda v: len(v.shape) >= 1)
        if v is None:
            return False
        r = self.rng.random()
        rank = len(v.shape)
        if r < 0.2 and rank >= 2:
            a, b = self.rng.sample(range(rank), 2)
            shape = list(v.shape)
            shape[a], shape[b] = shape[b], shape[a]
            self.add(f"{v.name}.transpose({a}, {b})", v.dtype, tuple(shape))
        elif r < 0.35 and rank >= 2:
            perm = list(range(rank))
            self.rng.shuffle(perm)
            self.add(f"{v.name}.permute({perm})", v.dtype, tuple(v.shape[p] for p in perm))
        elif r < 0.55 and v.shape[0] >= 2:
            start = self.rng.choice([1, -2])
            n = v.shape[0]
            length = len(range(n)[start:])
            self.add(f"{v.name}[{start}:]", v.dtype, (length, *v.shape[1:]))
        elif r < 0.65 and rank >= 2 and v.shape[-1] >= 2:
            length = len(range(v.shape[-1])[::2])
            self.add(f"{v.name}[..., ::2]", v.dtype, (*v.shape[:-1], length))
        elif r < 0.8:
            n = math.prod(v.shape)
            self.add(f"{v.name}.reshape(-1)", v.dtype, (n,))
        elif r < 0.9:
            self.add(f"{v.name}.unsqueeze(0)", v.dtype, (1, *v.shape))
        else:
            ones = [d for d, n in enumerate(v.shape) if n == 1]
            if not ones:
                return False
            shape = tuple(3 if d in ones else n for d, n in enumerate(v.shape))
            self.add(f"{v.name}.expand({list(shape)})", v.dtype, shape)
        return True

    def copy(self) -> bool:
        v = self.pick()
        if v is None:
            return False
        expr = self.rng.choice(
            [
                "{}.clone()",
                "{}.contiguous()",
                "{}.to({dtype})",
                "{} * 1" if v.dtype != torch.bool else "{}.clone()",
            ]
        )
        self.add(expr.format(v.name, dtype=v.dtype), v.dtype, v.shape)
        return True

    def index(self) -> bool:
        v = self.pick(lambda v: v.shape and v.shape[0] >= 2)
        if v is None:
            return False
        n = v.shape[0]
        r = self.rng.random()
        if r < 0.5:  # advanced indexing: negatives count from the end
            ids = [self.rng.randrange(-n, n) for _ in range(self.rng.randrange(1, 5))]
            index = f"torch.tensor({ids}, device={v.name}.device)"
            self.add(f"{v.name}[{index}]", v.dtype, (len(ids), *v.shape[1:]))
        elif r < 0.8:
            ids = [self.rng.randrange(0, n) for _ in range(self.rng.randrange(1, 5))]
            expr = f"torch.index_select({v.name}, 0, torch.tensor({ids}, device={v.name}.device))"
            self.add(expr, v.dtype, (len(ids), *v.shape[1:]))
        else:
            if v.dtype == torch.bool:
                return False
            if len(v.shape) < 2:
                return False
            ids = [self.rng.randrange(0, n) for _ in range(2)]
            shape = (2, *v.shape[1:])
            ones = ", ".join(["1"] * (len(v.shape) - 1))
            expr = (
                f"torch.gather({v.name}, 0, torch.tensor({ids}, device={v.name}.device)"
                f".view(2, {ones}).expand({list(shape)}))"
            )
            self.add(expr, v.dtype, shape)
        return True

    def matmul(self) -> bool:
        v = self.pick(lambda v: len(v.shape) == 2 and v.dtype.is_floating_point)
        if v is None:
            return False
        w = self.pick(
            lambda w: len(w.shape) == 2 and w.dtype == v.dtype and w.shape[0] == v.shape[1]
        )
        if w is None:
            return False
        self.add(f"{v.name} @ {w.name}", v.dtype, (v.shape[0], w.shape[1]))
        return True


KINDS = [
    ("elementwise", 5),
    ("integer", 2),
    ("compare_where", 2),
    ("cast", 1),
    ("reduce", 2),
    ("view", 3),
    ("copy", 2),
    ("index", 2),
    ("matmul", 1),
]
SHAPES = [(3, 4), (4,), (2, 3, 4), (1, 4), (3, 1), (4, 3)]


def generate(seed: int) -> Program:
    rng = random.Random(seed)
    b = _Builder(rng)
    inputs = []
    for i in range(rng.randrange(1, 4)):
        dtype = rng.choice([*FLOAT_DTYPES, torch.float32, *INT_DTYPES])
        shape = rng.choice(SHAPES)
        layout = (
            rng.choice(["packed", "packed", "packed", "transposed"])
            if len(shape) >= 2
            else "packed"
        )
        name = f"x{i}"
        inputs.append((name, dtype, shape, layout))
        b.values.append(Value(name, dtype, shape))
    kinds, weights = zip(*KINDS, strict=True)
    steps = rng.randrange(2, 8)
    done = 0
    for _ in range(steps * 4):
        if done == steps:
            break
        kind = rng.choices(kinds, weights)[0]
        done += getattr(b, kind)()
    made = [v for v in b.values if v.name.startswith("t")] or b.values
    outs = rng.sample(made, min(len(made), rng.randrange(1, 4)))
    args = ", ".join(n for n, *_ in inputs)
    body = "\n".join(b.lines)
    ret = ", ".join(v.name for v in outs)
    source = f"def program({args}):\n{body}\n    return ({ret},)\n"
    return Program(seed, source, inputs, b.lines, b.signed_zeros)


def _reversed(t: torch.Tensor) -> torch.Tensor:
    return t.permute(*reversed(range(t.dim())))


def make_inputs(program: Program, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _, dtype, shape, layout in program.inputs:
        full = shape[::-1] if layout == "transposed" else shape
        if dtype.is_floating_point:
            t = torch.randn(full, generator=g, dtype=dtype) * 3
            flat = t.view(-1)
            for k in range(0, flat.numel(), 5):  # special values among ordinary ones
                flat[k] = [0.0, -0.0, float("inf"), float("-inf"), float("nan")][(k // 5) % 5]
        else:
            t = torch.randint(-50, 50, full, generator=g, dtype=dtype)
        out.append(_reversed(t) if layout == "transposed" else t)
    return out


def _to(t: torch.Tensor, device: str) -> torch.Tensor:
    """t on ``device`` with t's strides (a transposed input stays transposed)."""
    if t.is_contiguous():
        return t.to(device)
    return _reversed(_reversed(t).contiguous().to(device))


def _shares(out: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    ptr = out.untyped_storage().data_ptr()
    return any(ptr == x.untyped_storage().data_ptr() for x in inputs)


def compare(
    got: torch.Tensor, want: torch.Tensor, what: str, signs: bool = True, loose: bool = True
) -> list[str]:
    """``loose``: float32 tolerance whatever the dtype (a float64 value computed from a
    float32 one, whose transcendental functions differ from PyTorch's by an ulp)."""
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return [
            f"{what}: {got.dtype}{list(got.shape)} against eager {want.dtype}{list(want.shape)}"
        ]
    if want.dtype.is_floating_point:
        if not torch.equal(got.isnan(), want.isnan()):
            return [f"{what}: NaN at other positions\n  got  {got}\n  want {want}"]
        zeros = (got == 0) & (want == 0)
        if signs and not torch.equal(got.signbit()[zeros], want.signbit()[zeros]):
            return [f"{what}: signs of zero differ\n  got  {got}\n  want {want}"]
        g, w = got.nan_to_num(0.0), want.nan_to_num(0.0)
        tol = RTOL[torch.float32] if loose else RTOL[want.dtype]
        if not torch.allclose(g, w, rtol=tol, atol=tol):
            return [f"{what}: values differ\n  got  {got}\n  want {want}"]
        return []
    if not torch.equal(got, want):
        return [f"{what}: values differ\n  got  {got}\n  want {want}"]
    return []


MUTATIONS = ["in_place", "data", "numpy", "dlpack"]


def _mutate(x: torch.Tensor, how: str) -> None:
    """Write new values into x, the way ``how`` names; numpy and DLPack only where x is a
    CPU tensor (the caller mirrors the write on the eager copy with ``in_place``)."""
    one = 1 if not x.dtype.is_floating_point else 1.5
    if how == "in_place":
        x.add_(one)
    elif how == "data":
        x.data.add_(one)
    elif how == "numpy":
        x.numpy()[...] += one
    elif how == "dlpack":
        torch.from_dlpack(x).add_(one)


def check(program: Program, device: str, seed: int = 0, io: str = "device") -> list[str]:
    """Run ``program`` compiled (inputs on ``device`` when io is "device", CPU tensors
    compiled for ``device`` when "cpu") and eagerly on the CPU; return the mismatches."""
    fn = program.function()
    want_in = make_inputs(program, seed)
    mine = [_to(t, device) if io == "device" else t.clone() for t in want_in]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="saturn", options={"device": device}, dynamic=False)
    problems: list[str] = []
    with torch.no_grad():
        want = fn(*want_in)
        got = compiled(*mine)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            problems += compare(g, w, f"output {k}", program.signed_zeros)
            if _shares(g, mine) != _shares(w, want_in):
                problems.append(
                    f"output {k}: shares an input's memory where eager's "
                    f"{'does' if _shares(w, want_in) else 'does not'}"
                )
            elif w.is_contiguous() and not g.is_contiguous():
                problems.append(f"output {k}: strides {g.stride()}, eager's {w.stride()}")
        # writing to an output reaches an input only where eager's does
        before = [t.cpu().clone() for t in mine]
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            if _shares(w, want_in) or g.dtype == torch.bool:
                continue
            if torch._debug_has_internal_overlap(w) == 1:  # eager's is not writable either
                continue
            if torch._debug_has_internal_overlap(g) == 1:
                problems.append(f"output {k}: elements share memory where eager's do not")
                continue
            g.add_(1)
        for i, (t, b) in enumerate(zip(mine, before, strict=True)):
            if not torch.equal(t.cpu().nan_to_num(0.0), b.nan_to_num(0.0)):
                problems.append(f"input {i} changed when an output was written")
        # writes PyTorch does not count reach the next call
        rng = random.Random(seed)
        for t, w in zip(mine, want_in, strict=True):
            how = rng.choice(MUTATIONS if t.device.type == "cpu" else ["in_place", "data"])
            _mutate(t, how)
            _mutate(w, "in_place")
        want = fn(*want_in)
        got = compiled(*mine)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            problems += compare(
                g, w, f"output {k} after the inputs were written", program.signed_zeros
            )
    return problems
