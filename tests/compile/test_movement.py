"""Data movement in compiled graphs. Row takes: embedding, index_select along any axis,
x[index] and flip (a take by a constant reversed index) run as one device kernel
(``gather``) instead of a host op that copies the whole table across every call.
Concatenations past the equal-pieces selection: a tree of two-operand ``concat`` kernels.
Values against eager PyTorch on the CPU (bit for bit: both move bits), the program's steps
as proof of where the work ran, and an index out of range raising IndexError as PyTorch
does, on saturn:0 and (marker gpu) on saturn:1 under replay."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn import backend

from .helpers import DEV, compile_and_compare, last_compiled

GPU = "saturn:1"


def host_ops(prog) -> list[str]:
    return [s.op.split("#")[0] for s in prog.steps if s.kind == "host"]


def table(rows: int = 10, cols: int = 6, dtype=torch.float32) -> torch.Tensor:
    t = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
    t[0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return t.to(dtype)


CASES = {  # (function, index shape, index bound)
    "embedding": (lambda t, i: torch.nn.functional.embedding(i, t) * 2, (2, 3), 10),
    "index_select dim 0": (lambda t, i: t.index_select(0, i) + 1, (5,), 10),
    "index_select dim 1": (lambda t, i: t.view(5, 2, 6).index_select(1, i) - 1, (3,), 2),
    "index_select dim 2": (lambda t, i: t.view(2, 5, 6).index_select(2, i), (4,), 6),
    "x[index] of a 3-D tensor": (lambda t, i: t.view(10, 3, 2)[i].sum(-1), (2, 2), 10),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_takes_are_device_kernels(name, index_dtype):
    fn, ishape, bound = CASES[name]
    t = table()
    i = torch.randint(0, bound, ishape, generator=torch.Generator().manual_seed(1))
    i.view(-1)[0] = 0  # the row holding NaN, both infinities and -0.0
    compile_and_compare(fn, t, i.to(index_dtype))
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    assert [k.kind for k in prog.kernels].count("gather") == 1, prog.to_text()


def test_an_embedding_layer_in_a_model():
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(50, 16)
            self.pos = torch.nn.Embedding(8, 16)
            self.head = torch.nn.Linear(16, 50)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            return self.head(self.tok(ids) + self.pos(pos))

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 8))
    compile_and_compare(LM(), ids, atol=2e-5)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and [k.kind for k in prog.kernels].count("gather") == 1
    # the positions are rows 0..7 of their table, in range: a slice (a view), not a take
    assert [s.attrs for s in prog.steps if s.op == "Slice"] == [(0, 0, 8, 1)], prog.to_text()


def test_an_evenly_spaced_constant_index_is_a_slice_where_in_range():
    t = table()
    compile_and_compare(lambda t: t[torch.arange(2, 10, 3, device=t.device)] * 2, t)
    prog = last_compiled().compiled.program
    assert [s.attrs for s in prog.steps if s.op == "Slice"] == [(0, 2, 9, 3)]
    assert "gather" not in [k.kind for k in prog.kernels]
    # one row past the end: the take, which raises PyTorch's error (the call reruns
    # uncompiled, decision 0050)
    torch._dynamo.reset()
    with pytest.raises(IndexError, match="index 10 is out of bounds for dimension 0 with size 10"):
        torch.compile(lambda t: t[torch.arange(0, 11, device=t.device)], backend="saturn")(
            t.to(DEV)
        )


def test_an_index_out_of_range_raises_and_the_next_call_runs():
    t = table()

    def f(t, i):
        return torch.nn.functional.embedding(i, t) + 1

    torch._dynamo.reset()
    cf = torch.compile(f, backend="saturn", dynamic=False)
    td = t.to(DEV)
    good = torch.tensor([[1, 9], [0, 3]])
    cf(td, good.to(DEV))
    for bad in (10, -1):
        with pytest.raises(IndexError, match="out of range"):
            cf(td, torch.tensor([[1, bad], [0, 3]]).to(DEV))
    torch.testing.assert_close(cf(td, good.to(DEV)).cpu(), f(t, good), equal_nan=True)


def test_a_boolean_mask_is_not_a_take():
    """x[mask] selects the rows where the mask is true (its length depends on the values):
    no graph saturn compiles for it holds a take (Dynamo runs the selection itself)."""
    t = table()
    mask = torch.tensor([True, False] * 5)
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    got = torch.compile(lambda t, m: t[m] * 2, backend="saturn")(t.to(DEV), mask.to(DEV))
    torch.testing.assert_close(got.cpu(), t[mask] * 2, equal_nan=True)
    new = backend.CACHE.compiles - compiles
    hits = list(backend.CACHE.items.values())[-new:] if new else []
    for hit in hits:  # whatever this call compiled holds no take
        assert "gather" not in [k.kind for k in hit.compiled.program.kernels]


GATHERS = {  # (function, x shape, index shape, dim): gather and scatter at flat positions
    "last axis (cross-entropy's pick)": (lambda x, i: torch.gather(x, 1, i) * 2, (4, 7), (4, 1), 1),
    "first axis": (lambda x, i: x.gather(0, i) + 1, (5, 3), (2, 3), 0),
    "middle axis, a narrower index": (lambda x, i: x.gather(1, i), (2, 6, 4), (2, 3, 3), 1),
    "negative dim": (lambda x, i: x.gather(-1, i) - 1, (3, 5), (3, 2), 1),
}


def special_values(shape) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return x


@pytest.mark.parametrize("name", GATHERS)
def test_gathers_are_takes_at_flat_positions(name):
    """``gather`` decomposed (device/decompositions.py) into an index loop and one take of
    the operand's elements: no host op, and the values bit for bit (NaN, both
    infinities, -0.0 among them)."""
    fn, xshape, ishape, dim = GATHERS[name]
    i = torch.randint(0, xshape[dim], ishape, generator=torch.Generator().manual_seed(6))
    i.view(-1)[0] = 0  # the NaN
    compile_and_compare(fn, special_values(xshape), i, rtol=0, atol=0)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    assert [k.kind for k in prog.kernels].count("gather") == 1, prog.to_text()


@pytest.mark.parametrize("name", GATHERS)
def test_scatters_of_a_value_and_scatter_adds_are_row_adds(name):
    """``scatter`` of a value and ``scatter_add`` at the same positions (repeated ones
    among them): a row add (of counts, or of the source) at flat positions. Small
    integers as values, so the atomic adds' order cannot round."""
    _, xshape, ishape, dim = GATHERS[name]
    i = torch.randint(0, xshape[dim], ishape, generator=torch.Generator().manual_seed(7))
    x = special_values(xshape)
    src = torch.randint(-4, 5, ishape, generator=torch.Generator().manual_seed(8)).float()
    got = compile_and_compare(lambda x, i: x.scatter(dim, i, -0.0) * 3, x, i, rtol=0, atol=0)
    # -0.0 written, not added to a zero (which would give +0.0)
    assert torch.equal(got.cpu().signbit(), (x.scatter(dim, i, -0.0) * 3).signbit())
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and "scatter" in [k.kind for k in prog.kernels]
    compile_and_compare(lambda x, i, s: x.scatter_add(dim, i, s), x, i, src, rtol=0, atol=0)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and "scatter" in [k.kind for k in prog.kernels]


def test_cross_entropy_trains_with_no_host_op():
    """Cross-entropy with ignored targets: the loss and the logits' gradient as eager's,
    the forward's pick a take and the backward's -1 at each target a row add of counts
    and a select, both graphs free of host ops (each crossed the whole logits before)."""
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(9))
    t = torch.tensor([3, -100, 9, 0, 3, -100])
    xd = x.to(DEV).requires_grad_()
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles

    def f(x, t):
        return torch.nn.functional.cross_entropy(x, t)

    loss = torch.compile(f, backend="saturn", dynamic=False)(xd, t.to(DEV))
    loss.backward()
    xr = x.clone().requires_grad_()
    want = f(xr, t)
    want.backward()
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, rtol=1e-6, atol=1e-7)
    assert backend.CACHE.compiles - compiles == 2
    forward, backward = (c.compiled.program for c in list(backend.CACHE.items.values())[-2:])
    assert host_ops(forward) == [] and host_ops(backward) == []
    assert "gather" in [k.kind for k in forward.kernels], forward.to_text()
    assert "scatter" in [k.kind for k in backward.kernels], backward.to_text()


@pytest.mark.parametrize("bad", [7, -1])
def test_a_gather_index_out_of_range_raises(bad):
    """The take reads nothing out of range (a negative index does not wrap, as in
    PyTorch); the call then reruns uncompiled, so the user sees PyTorch's own error
    naming their index."""
    x, i = special_values((4, 7)), torch.tensor([[1], [bad], [0], [6]])
    torch._dynamo.reset()
    cf = torch.compile(lambda x, i: torch.gather(x, 1, i), backend="saturn", dynamic=False)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x, 1, i)
    with pytest.raises(RuntimeError, match=f"index {bad} is out of bounds"):
        cf(x.to(DEV), i.to(DEV))


def test_gathers_the_decomposition_declines_stay_pytorch_ops():
    """A sparse gradient, and an empty index, keep PyTorch's op (a host op on saturn:0)."""
    x, i = special_values((4, 7)), torch.tensor([[1], [2], [0], [6]])
    compile_and_compare(lambda x, i: torch.gather(x, 1, i, sparse_grad=True), x, i, rtol=0, atol=0)
    assert host_ops(last_compiled().compiled.program) == ["aten.gather.default"]
    empty = torch.zeros(4, 0, dtype=torch.int64)
    compile_and_compare(lambda x, i: torch.gather(x, 1, i) + 1, x, empty, rtol=0, atol=0)
    assert host_ops(last_compiled().compiled.program) == ["aten.gather.default"]


# --- on the GPU ---------------------------------------------------------------------------


def raises_as_eager(cf, recipe, fn, args) -> None:
    """The compiled call fails where eager CPU does, with eager's exception type and
    message (the user's index in it): the recipe's kernel refuses the index and the call
    reruns uncompiled (docs/decisions/0050)."""
    with pytest.raises(Exception) as eager:
        fn(*[a.cpu() for a in args])
    failed = recipe.failed_calls
    with pytest.raises(eager.type) as got:
        cf(*args)
    assert str(got.value).splitlines()[0] == str(eager.value).splitlines()[0]
    assert recipe.failed_calls == failed + 1


def compile_gpu(fn, *args):
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    cf = torch.compile(fn, backend="saturn", dynamic=False)
    cf(*args)
    assert backend.CACHE.compiles == compiles + 1
    return cf, last_compiled().recipe


def matches_bit_for_bit_replayed(cf, recipe, args, want) -> None:
    """Three calls (step by step, captured, replayed) give ``want``'s bits, with no
    crossing and no CPU fallback."""
    fb = saturn.fallback_counts()
    for _ in range(3):
        got = cf(*args)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
    assert recipe.last.crossings == 0 and saturn.fallback_counts() == fb
    assert recipe.runner.replays >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_takes_run_on_the_gpu_and_replay(dtype):
    t = table(dtype=dtype) if dtype != torch.bool else table() > 0
    i = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(2))

    def f(t, i):
        return torch.nn.functional.embedding(i, t)

    td, idd = t.to(GPU), i.to(GPU)
    cf, recipe = compile_gpu(f, td, idd)
    prog = recipe.program
    assert host_ops(prog) == [] and [k.kind for k in prog.kernels] == ["gather"]
    matches_bit_for_bit_replayed(cf, recipe, (td, idd), f(t, i))


@pytest.mark.gpu
def test_an_index_out_of_range_raises_on_the_gpu_under_replay():
    t = table()

    def f(t, i):
        return torch.nn.functional.embedding(i, t) * 3

    td = t.to(GPU)
    good = torch.tensor([[1, 9], [0, 3]])
    cf, recipe = compile_gpu(f, td, good.to(GPU))
    bad_in = torch.tensor([[1, 2], [0, 3]]).to(GPU)  # the same buffer, its values changed
    for _ in range(3):
        cf(td, bad_in)
    assert recipe.runner.replays >= 1
    for bad in (10, -1, 2**40):
        bad_in.copy_(torch.tensor([[1, bad], [0, 3]]))
        with pytest.raises(IndexError, match="out of range"):
            cf(td, bad_in)
    bad_in.copy_(good)
    torch.testing.assert_close(cf(td, bad_in).cpu(), f(t, good), equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_take_read_inside_a_layer_norm_matches_and_raises_under_replay(dtype):
    """Token rows taken inside the layer norm's rows kernel (``fuse_row_takes``): equal to
    eager CPU over three calls (step by step, captured, replayed; float32 at 1e-5,
    bfloat16 within one rounding: saturn rounds float32 arithmetic once), then ids out of
    range raise through the replayed graph, and good ids work again after."""
    t = torch.randn(50, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    w, b = torch.randn(64).to(dtype), torch.randn(64).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2.0**-7

    def f(t, i, w, b):
        return torch.nn.functional.layer_norm(torch.nn.functional.embedding(i, t), (64,), w, b)

    good = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(4))
    args = [t.to(GPU), good.to(GPU), w.to(GPU), b.to(GPU)]
    cf, recipe = compile_gpu(f, *args)
    prog = recipe.program
    kinds = [k.kind for k in prog.kernels]
    assert host_ops(prog) == [] and kinds == ["rows"], prog.to_text()
    assert recipe.runner.fused_takes == 1 and recipe.runner._unbounded_indices
    fb = saturn.fallback_counts()
    want = f(t, good, w, b)
    for _ in range(3):
        torch.testing.assert_close(cf(*args).cpu(), want, rtol=tol, atol=tol)
    assert recipe.runner.replays >= 1 and saturn.fallback_counts() == fb
    for bad in (50, -1, 2**40):
        args[1].copy_(good.masked_fill(good == good[1, 2], bad))
        raises_as_eager(cf, recipe, f, args)
    args[1].copy_(good)
    torch.testing.assert_close(cf(*args).cpu(), want, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_the_index_check_waits_for_the_take_not_the_call():
    """The error word is copied to the host right after the last step that may set it
    (the embedding, a forward's first kernel), and the call waits for that copy alone, not
    for the product and the work after it: the check is placed there, fires through the
    replayed graph on an id out of range, and good ids work again after."""
    t = torch.randn(50, 64, generator=torch.Generator().manual_seed(3))
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(5))

    def f(t, i, w):
        x = torch.nn.functional.embedding(i, t)
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (64,)) @ w).sum(-1)

    good = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(4))
    args = [t.to(GPU), good.to(GPU), w.to(GPU)]
    cf, recipe = compile_gpu(f, *args)
    prog, runner = recipe.program, recipe.runner
    kernels = [s.output for s in prog.steps if s.kind == "kernel"]
    assert host_ops(prog) == [] and runner._unbounded_indices, prog.to_text()
    assert runner._word_step == kernels[0] and len(kernels) > 1, prog.to_text()
    want = f(t, good, w)
    for _ in range(3):
        torch.testing.assert_close(cf(*args).cpu(), want, rtol=1e-5, atol=1e-4)
    assert runner.replays >= 1
    args[1].copy_(good.masked_fill(good == good[1, 2], 50))
    raises_as_eager(cf, recipe, f, args)
    args[1].copy_(good)
    torch.testing.assert_close(cf(*args).cpu(), want, rtol=1e-5, atol=1e-4)


FLIPS = {  # (function, shape); axes of one element do not move
    "last axis": (lambda x: x.flip(-1) * 2, (3, 5)),
    "first axis": (lambda x: x.flip(0) + 1, (4, 3, 2)),
    "a middle axis": (lambda x: x.flip(1), (2, 5, 3)),
    "two axes": (lambda x: x.flip(0, 2) - 1, (3, 2, 4)),
    "unit axes only": (lambda x: x.flip(1) * 3, (4, 1)),
}


@pytest.mark.parametrize("case", sorted(FLIPS))
def test_flips_are_takes_by_a_constant_index(case):
    fn, shape = FLIPS[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    compile_and_compare(fn, x)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    moved = sum(n > 1 for n in shape) if case != "unit axes only" else 0
    want = {"two axes": 2}.get(case, min(moved, 1))
    assert [k.kind for k in prog.kernels].count("gather") == want, prog.to_text()


# --- concatenations past the equal-pieces form ------------------------------------------

CAT_CASES = {  # (function, shapes of a and b)
    "class token before patches": (lambda a, b: torch.cat([a, b], 1) * 2, ((2, 1, 8), (2, 9, 8))),
    "a cache grown by one step": (
        lambda a, b: torch.cat([a, b[:, :, :1]], 2) + 1,
        ((2, 3, 7, 4), (2, 3, 2, 4)),
    ),
    "five pieces of a permuted tensor": (
        lambda a, b: torch.cat([a, b.transpose(1, 2), a, a, b.transpose(1, 2)], 1),
        ((2, 1, 8), (2, 8, 9)),
    ),
    "promoted dtypes": (
        lambda a, b: torch.cat([a, (b > 0).to(torch.int64)], 1),
        ((2, 1, 8), (2, 9, 8)),
    ),
}


def special_pair(shapes) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(s, generator=g) for s in shapes)
    a.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])
    return a, b


@pytest.mark.parametrize("case", sorted(CAT_CASES))
def test_concatenations_of_unequal_pieces_are_device_kernels(case):
    fn, shapes = CAT_CASES[case]
    a, b = special_pair(shapes)
    compile_and_compare(fn, a, b)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    kinds = [k.kind for k in prog.kernels]
    # five pieces: a tree of four joins, of which [a, b.T] appears twice and is made once
    assert kinds.count("concat") == (3 if case.startswith("five") else 1), prog.to_text()


def test_concatenations_of_few_equal_pieces_stay_selections():
    """Up to four equal pieces the importer writes a selection among views, which fuses
    into its readers: no concat kernel."""
    a, b = special_pair(((2, 4, 8), (2, 4, 8)))
    compile_and_compare(lambda a, b: torch.cat([a, b], 1) * 2, a, b)
    assert "concat" not in [k.kind for k in last_compiled().compiled.program.kernels]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_concatenations_run_on_the_gpu_and_replay(dtype):
    a, b = special_pair(((2, 1, 8), (2, 9, 8)))
    a, b = a.to(dtype), b.to(dtype)

    def f(a, b):
        return torch.cat([a, b, a, b.flip(1)[:, :3]], 1)

    ad, bd = a.to(GPU), b.to(GPU)
    cf, recipe = compile_gpu(f, ad, bd)
    prog = recipe.program
    kinds = [k.kind for k in prog.kernels]
    assert host_ops(prog) == [] and {"concat", "gather"} <= set(kinds), prog.to_text()
    matches_bit_for_bit_replayed(cf, recipe, (ad, bd), f(a, b))
    # the flip's index is a constant in range: no error word read, the call stays async
    assert not recipe.runner._unbounded_indices


# --- constant pads and the pools that read them -----------------------------------------

POOL_CASES = {
    "ResNet stem pool (3, 2, 1)": lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1),
    "overlapping (2, 1)": lambda x: torch.nn.functional.max_pool2d(x, 2, 1) * 2,
    "dilated and padded": lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1, dilation=2),
    "padded, stride 1": lambda x: torch.nn.functional.max_pool2d(x, 3, 1, 1) - x,
    "average, padded": lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, 1),
    "average, overlapping": lambda x: torch.nn.functional.avg_pool2d(x, 2, 1) * 2,
}


def special_image() -> torch.Tensor:
    x = torch.randn(2, 3, 9, 10, generator=torch.Generator().manual_seed(4))
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    x[1, 2, 4, 4] = float("nan")  # inside: every window over it gives NaN
    return x


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pools_with_overlap_padding_or_dilation_are_one_loop(case):
    """The image padded (-inf for a max, zeros for an average: one pad kernel) and the
    maximum or the sum of one strided slice per window position fused into one loop; NaN
    and infinities as in PyTorch's pooling."""
    x = special_image()
    compile_and_compare(POOL_CASES[case], x)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    kinds = [k.kind for k in prog.kernels]
    assert kinds.count("loop") == 1 and kinds.count("pad") == ("overlapping" not in case)


CEIL_POOLS = {  # (kernel, stride, padding): squeezenet's (3, 2, 0) and partial windows
    "squeezenet (3, 2, 0)": (3, 2, 0),
    "padded (3, 2, 1)": (3, 2, 1),
    "one-wide last window (2, 3, 0)": (2, 3, 0),
    "tiling but partial (2, 2, 0)": (2, 2, 0),
}


@pytest.mark.parametrize("case", sorted(CEIL_POOLS))
def test_max_pools_in_ceil_mode_are_one_loop(case):
    """Ceil mode's last, partial windows read -inf past the image's end (a pad kernel),
    which never wins; the odd-sized image makes every case have one."""
    k, s, p = CEIL_POOLS[case]
    x = special_image()
    fn = lambda x: torch.nn.functional.max_pool2d(x, k, s, p, ceil_mode=True)  # noqa: E731
    assert fn(x).shape != torch.nn.functional.max_pool2d(x, k, s, p).shape  # partial windows
    compile_and_compare(fn, x)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    assert [k.kind for k in prog.kernels].count("pad") == 1, prog.to_text()


def test_average_pools_in_ceil_mode_stay_the_op():
    """An average's partial window divides by the elements it holds: declined."""
    x = special_image()
    compile_and_compare(lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, 0, ceil_mode=True), x)
    ops = host_ops(last_compiled().compiled.program)
    assert ops == ["aten.avg_pool2d.default"], ops


PAD_CASES = {
    "float, two axes": (lambda x: torch.nn.functional.pad(x, (1, 2, 0, 3), value=-1.5) + 1, False),
    "zeros, last axis": (lambda x: torch.nn.functional.pad(x, (1, 1)), False),
    "integers": (lambda x: torch.nn.functional.pad(x, (2, 0, 1, 1), value=7), True),
    # negative amounts crop (F.pad's backward): slices, then the pad where some grow
    "crop and pad": (lambda x: torch.nn.functional.pad(x, (-1, 2, 1, -2), value=3.0) * 1, False),
}

CROPS = {
    "crop only": lambda x: torch.nn.functional.pad(x, (-1, -2)),
    "crop two axes": lambda x: torch.nn.functional.pad(x, (0, -1, -2, 0)) + 1,
}


@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_constant_pads_are_device_kernels(case):
    fn, integers = PAD_CASES[case]
    x = torch.randint(-5, 5, (3, 4)) if integers else special_image()
    compile_and_compare(fn, x)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and "pad" in [k.kind for k in prog.kernels], prog.to_text()


@pytest.mark.parametrize("case", sorted(CROPS))
def test_pads_that_only_crop_are_views(case):
    compile_and_compare(CROPS[case], special_image())
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and "pad" not in [k.kind for k in prog.kernels], prog.to_text()


def test_a_pad_by_zero_amounts_is_read_in_place_by_its_reader():
    """Swin pads each window stage to a multiple of the window (0 when the image already
    is one): the copy is computed inside the loop that reads it, no pad kernel."""
    fn = lambda x: torch.nn.functional.pad(x, (0, 0, 0, 0)).exp() + 1  # noqa: E731
    compile_and_compare(fn, special_image())
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [] and [k.kind for k in prog.kernels] == ["loop"], prog.to_text()


def test_a_pad_that_converts_its_value_stays_the_op():
    fn = lambda x: torch.nn.functional.pad(x.to(torch.int32), (1, 1), value=2.5)  # noqa: E731
    compile_and_compare(fn, special_image().nan_to_num())
    assert "aten.constant_pad_nd.default" in host_ops(last_compiled().compiled.program)


def test_a_resnet_stem_runs_without_host_steps():
    stem = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 7, 2, 3, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1),
    )
    torch.manual_seed(0)
    compile_and_compare(stem, torch.randn(2, 3, 32, 32), atol=2e-5)
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["stem pool", "pad", "ceil pool"])
def test_pads_and_padded_pools_run_on_the_gpu_and_replay(dtype, which):
    x = special_image().to(dtype)
    if which == "pad":
        fn = lambda x: torch.nn.functional.pad(x, (1, 2, 3, 0), value=-2.0)  # noqa: E731
    elif which == "ceil pool":  # squeezenet's
        fn = lambda x: torch.nn.functional.max_pool2d(x, 3, 2, ceil_mode=True)  # noqa: E731
    else:
        fn = lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1)  # noqa: E731
    xd = x.to(GPU)
    cf, recipe = compile_gpu(fn, xd)
    prog = recipe.program
    assert host_ops(prog) == [] and "pad" in [k.kind for k in prog.kernels], prog.to_text()
    matches_bit_for_bit_replayed(cf, recipe, (xd,), fn(x))


# --- rows added at an index (index_put with accumulate) ------------------------------------

ADDS = {  # (function, index shape, values shape); the table is 10 x 6
    "rows of a 2-D table": (
        lambda t, i, v: t.index_put((i,), v, accumulate=True) * 2,
        (7,),
        (7, 6),
    ),
    "a 2-D index into a 3-D table": (
        lambda t, i, v: t.view(10, 3, 2).index_put((i,), v, accumulate=True),
        (2, 3),
        (2, 3, 3, 2),
    ),
    "values broadcast to every row": (
        lambda t, i, v: t.index_put((i,), v, accumulate=True) - 1,
        (4,),
        (6,),
    ),
}


def add_inputs(ishape, vshape, dtype=torch.float32, index_dtype=torch.int64):
    g = torch.Generator().manual_seed(5)
    i = torch.randint(-10, 10, ishape, generator=g)  # negatives count from the end
    i.view(-1)[:2] = torch.tensor([3, 3])  # a repeated row
    v = torch.randn(vshape, generator=g) * 4
    if dtype.is_floating_point:
        v.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    return table(dtype=dtype), i.to(index_dtype), v.to(dtype)


@pytest.mark.parametrize("name", ADDS)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_rows_added_at_an_index_are_device_kernels(name, index_dtype):
    fn, ishape, vshape = ADDS[name]
    compile_and_compare(fn, *add_inputs(ishape, vshape, index_dtype=index_dtype))
    prog = last_compiled().compiled.program
    assert host_ops(prog) == [], prog.to_text()
    assert [k.kind for k in prog.kernels].count("scatter") == 1, prog.to_text()


def test_integer_rows_added_are_device_kernels():
    fn, ishape, vshape = ADDS["rows of a 2-D table"]
    t, i, v = add_inputs(ishape, vshape, dtype=torch.int64)
    compile_and_compare(fn, t, i, v)
    assert "scatter" in [k.kind for k in last_compiled().compiled.program.kernels]


DECLINED_ADDS = {  # each stays PyTorch's op
    "without accumulate": lambda t, i, v: t.index_put((i,), v) * 2,
    "two indices": lambda t, i, v: t.index_put((i, i.abs() % 6), v[:, 0], accumulate=True),
    "a bfloat16 table": lambda t, i, v: t.bfloat16().index_put((i,), v.bfloat16(), True),
}


@pytest.mark.parametrize("name", DECLINED_ADDS)
def test_other_index_puts_stay_the_op(name):
    t, i, v = add_inputs((7,), (7, 6))
    i = i.abs()  # no repeated index meets another value without accumulate: one answer
    i.view(-1)[:2] = torch.tensor([3, 4])
    compile_and_compare(DECLINED_ADDS[name], t, i, v)
    prog = last_compiled().compiled.program
    assert "scatter" not in [k.kind for k in prog.kernels], prog.to_text()
    assert any(op in ("aten.index_put.default", "IndexAdd") for op in host_ops(prog))


def test_a_row_add_out_of_range_raises():
    fn, ishape, vshape = ADDS["rows of a 2-D table"]
    t, i, v = add_inputs(ishape, vshape)
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="saturn", dynamic=False)
    td, vd = t.to(DEV), v.to(DEV)
    cf(td, i.to(DEV), vd)
    for bad in (10, -11):
        i.view(-1)[4] = bad
        with pytest.raises(IndexError, match="out of"):
            cf(td, i.to(DEV), vd)


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_an_embedding_gradient_adds_rows_at_ids_clamped_into_the_table(padding_idx):
    """saturn's decomposition of an embedding's backward (decompositions.py) clamps the ids
    into the table and zeroes the rows of ids outside it and of the padding id: the row
    add's index is then provably in range (no bounds check read back after the call), and
    the gradient is eager's, the padding row's included."""
    from saturn.eqsat.ranges import indices_in_range

    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 6, padding_idx=padding_idx)
    dev = torch.nn.Embedding(10, 6, padding_idx=padding_idx).to(DEV)
    dev.load_state_dict(ref.state_dict())
    ids = torch.tensor([[3, 3, 9], [0, 5, 3]])  # a repeated id, the padding id, the last row
    g = torch.randn(2, 3, 6)
    (ref(ids) * g).sum().backward()
    torch._dynamo.reset()
    fn = torch.compile(dev, backend="saturn", dynamic=False)
    (fn(ids.to(DEV)) * g.to(DEV)).sum().backward()
    torch.testing.assert_close(dev.weight.grad.cpu(), ref.weight.grad, rtol=1e-5, atol=1e-6)
    # the table's entry is saturn's, and as PyTorch's own op on the CPU
    from saturn import decompositions

    op = torch.ops.aten.embedding_dense_backward.default
    assert decompositions.table()[op] is decompositions.embedding_dense_backward
    pad = -1 if padding_idx is None else padding_idx
    torch.testing.assert_close(
        decompositions.embedding_dense_backward(g, ids, 10, pad, False), op(g, ids, 10, pad, False)
    )
    if padding_idx is not None:
        assert not dev.weight.grad[padding_idx].cpu().any()
    prog = list(backend.CACHE.items.values())[-1].compiled.program
    adds = [s for s in prog.steps if s.kind == "kernel" and s.kernel.kind == "scatter"]
    assert len(adds) == 1 and indices_in_range(prog, adds[0]), prog.to_text()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_row_adds_run_on_the_gpu_and_replay(dtype):
    fn, ishape, vshape = ADDS["rows of a 2-D table"]
    t, i, v = add_inputs(ishape, vshape, dtype=dtype)
    td, idd, vd = t.to(GPU), i.to(GPU), v.to(GPU)
    cf, recipe = compile_gpu(fn, td, idd, vd)
    prog = recipe.program
    assert host_ops(prog) == [] and [k.kind for k in prog.kernels][:1] == ["scatter"]
    want = fn(t, i, v)
    fb = saturn.fallback_counts()
    for _ in range(3):  # step by step, captured, replayed
        got = cf(td, idd, vd).cpu()
        if dtype.is_floating_point:  # a repeated row's sum in the atomics' order
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            assert torch.equal(got, want)
    assert recipe.last.crossings == 0 and saturn.fallback_counts() == fb
    assert recipe.runner.replays >= 1
    good = idd.clone()
    for bad in (10, -11, 2**40):
        idd.view(-1)[4] = bad
        raises_as_eager(cf, recipe, fn, (td, idd, vd))
    idd.copy_(good)
    got = cf(td, idd, vd).cpu()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


AS_STRIDED = {  # (function, input, a View)
    # torchvision Swin's pooled features: [N, C, 1, 1] given channels-last strides
    "size-one strides": (
        lambda x: torch.as_strided(x.permute(0, 3, 1, 2) * 2, (2, 6, 1, 1), (6, 1, 6, 6)),
        torch.randn(2, 1, 1, 6),
        True,
    ),
    "packed reshape": (lambda x: torch.as_strided(x * 2, (3, 8), (8, 1)), torch.randn(4, 6), True),
    "its own layout": (
        lambda x: torch.as_strided(x.t(), (6, 4), (1, 6)) + 1,
        torch.randn(4, 6),
        True,
    ),
    "overlapping windows": (lambda x: torch.as_strided(x, (3, 4), (2, 1)), torch.randn(12), False),
    "offset": (lambda x: torch.as_strided(x, (2, 3), (3, 1), 2), torch.randn(12), False),
    "transposed": (lambda x: torch.as_strided(x, (6, 4), (1, 6)), torch.randn(4, 6), False),
}


@pytest.mark.parametrize("name", AS_STRIDED)
def test_as_strided_that_only_redescribes_is_a_view(name):
    """as_strided is a View where it addresses the input's elements in their order, and
    stays PyTorch's op otherwise (still equal to eager)."""
    fn, x, view = AS_STRIDED[name]
    compile_and_compare(fn, x, rtol=0, atol=0)
    ops = host_ops(last_compiled().compiled.program)
    assert ops == ([] if view else ["aten.as_strided.default"]), ops
