"""Random integer programs with values at and near both ends of each integer dtype.

Every integer op of the op table (negation, abs, relu, +, -, *, floor division and
remainder, maximum, minimum, clamps, comparisons, where, casts, sum, amax, amin, prod,
take, index_add, cat, pad) and PyTorch's other integer spellings (truncating division,
fmod, cumsum, sum in the input's own dtype), over uint8, int8, int16, int32 and int64,
mixed so that promotion happens, with Python int scalars (which wrap into the tensor's
dtype: ``uint8 - 1`` is ``uint8 + 255``). Inputs hold each dtype's minimum, maximum and
their neighbours, -2..2 and random values, so sums, products and negations overflow.
Results must be bit-equal to eager PyTorch on the CPU: PyTorch's integer arithmetic wraps
in two's complement, and so must a fused kernel.

Divisors are never 0 (eager CPU raises) nor -1 with a dividend at the minimum (eager CPU
dies of SIGFPE for int32 and int64): a tensor divisor is rewritten by ``where`` first.
"""

from __future__ import annotations

import random

import torch

from . import fuzz
from .fuzz import Program, Value

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
SCALARS = ["1", "-1", "2", "-3", "7", "100"]
DIVISORS = ["2", "3", "7", "-2", "-5", "100"]
BINARY = ["{} + {}", "{} - {}", "{} * {}", "torch.maximum({}, {})", "torch.minimum({}, {})"]
SCALAR_OPS = ["{} + {}", "{} - {}", "{} * {}", "{1} - {0}", "{1} * {0}"]
DIVISION = ["{} // {}", "{} % {}", "torch.div({}, {}, rounding_mode='trunc')", "torch.fmod({}, {})"]
UNARY = ["-{}", "torch.abs({})", "torch.relu({})"]
COMPARE = ["{} > {}", "{} < {}", "{} == {}", "{} >= {}", "{} <= {}", "{} != {}"]
SHAPES = [(12,), (3, 4), (4, 3), (2, 6)]


def ends(dtype: torch.dtype, shape: tuple[int, ...], rng: random.Random) -> torch.Tensor:
    """Both ends of ``dtype`` and their neighbours, small values, and random ones."""
    lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    pool = [lo, lo + 1, lo + 2, hi - 2, hi - 1, hi, *(v for v in range(-2, 3) if lo <= v)]
    n = 1
    for d in shape:
        n *= d
    vals = [rng.choice(pool) if rng.random() < 0.75 else rng.randint(lo, hi) for _ in range(n)]
    return torch.tensor(vals, dtype=dtype).reshape(shape)


class _Builder(fuzz._Builder):
    def pick(self, pred=lambda v: True) -> Value | None:
        # integers only: a float cast of one is an output, not an operand
        return super().pick(lambda v: v.dtype in INTS and pred(v))

    def binary(self) -> bool:
        v = self.pick()
        w = v and self.partner(v)
        if w is None:
            return False
        shape = tuple(torch.broadcast_shapes(v.shape, w.shape))
        dtype = torch.promote_types(v.dtype, w.dtype)
        self.add(self.rng.choice(BINARY).format(v.name, w.name), dtype, shape)
        return True

    def scalar(self) -> bool:
        v = self.pick()
        if v is None:
            return False
        r = self.rng.random()
        if r < 0.6:
            expr = self.rng.choice(SCALAR_OPS).format(v.name, self.rng.choice(SCALARS))
        elif r < 0.8:
            expr = self.rng.choice(UNARY).format(v.name)
        else:
            kind = self.rng.choice(["min", "max"])
            expr = f"torch.clamp({v.name}, {kind}={self.rng.choice(SCALARS)})"
        self.add(expr, v.dtype, v.shape)
        return True

    def division(self) -> bool:
        v = self.pick()
        if v is None:
            return False
        op = self.rng.choice(DIVISION)
        if self.rng.random() < 0.5:
            self.add(op.format(v.name, self.rng.choice(DIVISORS)), v.dtype, v.shape)
            return True
        w = self.partner(v)
        if w is None:
            return False
        # the divisor is guarded in the dtype the division computes in (a 0-dim one takes
        # the other operand's: int64 -2**32 is an int32 zero)
        dtype = torch.result_type(
            torch.empty(v.shape, dtype=v.dtype), torch.empty(w.shape, dtype=w.dtype)
        )
        d = f"{w.name}.to({dtype})"
        safe = self.add(f"torch.where(({d} == 0) | ({d} == -1), 3, {d})", dtype, w.shape)
        shape = tuple(torch.broadcast_shapes(v.shape, w.shape))
        self.add(op.format(v.name, safe.name), dtype, shape)
        return True

    def compare_where(self) -> bool:
        v = self.pick()
        w = v and self.partner(v)
        if w is None:
            return False
        shape = tuple(torch.broadcast_shapes(v.shape, w.shape))
        cond = self.add(self.rng.choice(COMPARE).format(v.name, w.name), torch.bool, shape)
        dtype = torch.promote_types(v.dtype, w.dtype)
        self.add(f"torch.where({cond.name}, {v.name}, {w.name})", dtype, shape)
        return True

    def cast(self) -> bool:
        v = self.pick()
        if v is None:
            return False
        to = self.rng.choice([*INTS, torch.float32, torch.float64])
        self.add(f"{v.name}.to({to})", to, v.shape)
        return True

    def reduce(self) -> bool:
        v = self.pick(lambda v: len(v.shape) >= 1)
        if v is None:
            return False
        dim = self.rng.randrange(len(v.shape))
        shape = tuple(n for d, n in enumerate(v.shape) if d != dim)
        op = self.rng.choice(["sum", "own_sum", "amax", "amin", "prod", "cumsum"])
        if op == "own_sum":  # summed in its own dtype: wraps there
            self.add(f"{v.name}.sum({dim}, dtype={v.dtype})", v.dtype, shape)
        elif op == "cumsum":
            self.add(f"{v.name}.cumsum({dim})", torch.int64, v.shape)
        else:
            dtype = torch.int64 if op in ("sum", "prod") else v.dtype
            self.add(f"{v.name}.{op}({dim})", dtype, shape)
        return True

    def gather(self) -> bool:
        v = self.pick(lambda v: len(v.shape) >= 1 and v.shape[0] >= 2)
        if v is None:
            return False
        n = v.shape[0]
        ids = [self.rng.randrange(-n, n) for _ in range(self.rng.randrange(1, 5))]
        index = f"torch.tensor({ids}, device={v.name}.device)"
        r = self.rng.random()
        if r < 0.4:
            self.add(f"{v.name}[{index}]", v.dtype, (len(ids), *v.shape[1:]))
        elif r < 0.7 and v.dtype in (torch.int32, torch.int64):  # sums wrap in the dtype
            w = self.pick(lambda w: w.dtype == v.dtype and _rows_like(w, v))
            if w is None or w.shape[0] < len(ids):
                return False
            pos = [i % n for i in ids]
            src = f"{w.name}[:{len(ids)}]"
            self.add(
                f"{v.name}.index_add(0, torch.tensor({pos}, device={v.name}.device), {src})",
                v.dtype,
                v.shape,
            )
        elif r < 0.85:
            w = self.pick(lambda w: w.dtype == v.dtype and _rows_like(w, v))
            if w is None:
                return False
            self.add(f"torch.cat([{v.name}, {w.name}])", v.dtype, (n + w.shape[0], *v.shape[1:]))
        else:
            # a fill value the dtype holds: PyTorch 2.11 refuses uint8 -1 in pad, 2.14 wraps
            lo = torch.iinfo(v.dtype).min
            value = self.rng.choice([c for c in SCALARS if int(c) >= lo])
            shape = (*v.shape[:-1], v.shape[-1] + 3)
            self.add(f"torch.nn.functional.pad({v.name}, (1, 2), value={value})", v.dtype, shape)
        return True


def _of(v: Value) -> tuple[torch.dtype, tuple[int, ...]]:
    return v.dtype, v.shape


KINDS = [
    ("binary", 4),
    ("scalar", 4),
    ("division", 2),
    ("compare_where", 1),
    ("cast", 2),
    ("reduce", 2),
    ("gather", 2),
]


def generate(seed: int) -> Program:
    rng = random.Random(seed)
    b = _Builder(rng)
    inputs = []
    main = INTS[seed % len(INTS)]  # every dtype in turn; others mixed in
    for i in range(rng.randrange(1, 4)):
        dtype = main if i == 0 or rng.random() < 0.5 else rng.choice(INTS)
        shape = rng.choice(SHAPES) if i == 0 else rng.choice([*SHAPES, (4,), (1, 3), (3, 1)])
        inputs.append((f"x{i}", dtype, shape))
        b.values.append(Value(f"x{i}", dtype, shape))
    kinds, weights = zip(*KINDS, strict=True)
    steps, done = rng.randrange(2, 8), 0
    for _ in range(steps * 4):
        if done == steps:
            break
        done += getattr(b, rng.choices(kinds, weights)[0])()
    made = [v for v in b.values if v.name.startswith("t")] or b.values
    # the last value (the deepest chain) and up to two others
    outs = [made[-1], *rng.sample(made[:-1], min(len(made) - 1, rng.randrange(0, 3)))]
    args = ", ".join(n for n, *_ in inputs)
    ret = ", ".join(v.name for v in outs)
    source = f"def program({args}):\n" + "\n".join(b.lines) + f"\n    return ({ret},)\n"
    return Program(seed, source, inputs, b.lines)


def make_inputs(program: Program) -> list[torch.Tensor]:
    rng = random.Random(program.seed)
    return [ends(dtype, shape, rng) for _, dtype, shape in program.inputs]


def check(program: Program, device: str) -> list[str]:
    """Run ``program`` compiled for ``device`` (inputs there) and eagerly on the CPU;
    return where they are not bit-equal."""
    fn = program.function()
    inputs = make_inputs(program)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="saturn", options={"device": device}, dynamic=False)
    with torch.no_grad():
        try:
            want = fn(*inputs)
        except RuntimeError as e:  # PyTorch refuses a scalar out of the dtype's range in
            # some versions and ops: the compiled call must refuse it the same way
            try:
                compiled(*[x.to(device) for x in inputs])
            except RuntimeError:
                return []
            return [f"eager raised {e}; compiled did not"]
        got = compiled(*[x.to(device) for x in inputs])
    problems = []
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        g = g.cpu()
        if g.dtype != w.dtype or g.shape != w.shape:
            problems.append(f"output {k}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}")
        elif not torch.equal(g, w):
            bad = (g != w).nonzero()[:4].tolist()
            problems.append(f"output {k}: at {bad}\n  got  {g}\n  want {w}")
    return problems


def _rows_like(w, v) -> bool:
    """Whether ``w`` has rows shaped as ``v``'s (both at least 1-D)."""
    return len(w.shape) >= 1 and w.shape[1:] == v.shape[1:]
