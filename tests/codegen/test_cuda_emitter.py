"""The CUDA emitter without a GPU: its kernels run under Numba's CUDA simulator (in a
separate process, small shapes), and a float32 kernel compiles to PTX with no f64."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from saturn.codegen import cuda as cg
from saturn.codegen import cuda_load, cuda_reads, cuda_rows
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

# (section, at least this many "ok" lines, split reductions, half-precision cases)
SIMULATED = [
    # half loops, sums and rows kernels (4 of them reading a take) rounded once from
    # float32; movement kernels
    ("movement", 156, 0, 65),
    ("graphs", 90, 12, 0),  # every graph, then narrow and split (12 split reductions)
    # rolls; the block scheduler; rows kernels kept, by warps, re-read, by parts of warps; loops
    ("variants", 106, 0, 0),
]


@pytest.fixture(scope="module")
def simulated():
    """Every section's simulator process, all started at once (each is one single-threaded
    process; together they use the machine's cores): section -> Popen."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    runner = Path(__file__).with_name("cudasim_runner.py")
    procs = {
        section: subprocess.Popen(
            [sys.executable, str(runner), section],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for section, *_ in SIMULATED
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize(("section", "oks", "splits", "halves"), SIMULATED)
def test_kernels_under_the_cuda_simulator(
    simulated, section: str, oks: int, splits: int, halves: int
):
    proc = simulated[section]
    stdout, stderr = proc.communicate(timeout=900)
    # every case prints "ok <kernel> <case>" or "FAIL <kernel> <case>": name the failures
    failed = [ln for ln in stdout.splitlines() if ln.startswith("FAIL")]
    assert not failed, f"{section}: kernels that differ under the simulator:\n" + "\n".join(failed)
    assert proc.returncode == 0, stdout + stderr
    assert stdout.count("ok ") >= oks, stdout
    assert stdout.count(" (split): ") == splits, stdout
    assert stdout.count("ok half ") == halves, stdout


def kernels_of(text: str):
    prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
    return prog.kernels


@pytest.mark.parametrize(
    "text",
    [
        "(input a f32 [64])\n(input b f32 [64])\n(input c f32 [64])\n"
        "(let r (Sigmoid (Relu (Add (Mul a b) c))))\n(output r)\n",
        "(input x f32 [8 64])\n(let r (GeluTanh (Mul x (Scalar 0.125 f32))))\n(output r)\n",
        "(input x f32 [8 64])\n(let r (Softmax x 1))\n(output r)\n",
        "(input x f32 [64 8])\n(let r (Mean (Mul x x) [0] 0))\n(output r)\n",
        "(input x f32 [64])\n(input y f32 [64])\n(let r (Add (Add (Floor x) (Ceil y)) "
        "(Add (Add (Trunc x) (Round y)) (Add (Log1p (Abs x)) (Atan2 (Expm1 x) y)))))\n"
        "(output r)\n",
        "(input x f32 [64])\n(input y f32 [64])\n(let r (Add (Fmod x y) (Add (Remainder x y) "
        "(FloorDiv x y))))\n(output r)\n",
    ],
)
def test_float32_kernels_have_no_double_precision(text):
    for k in kernels_of(text):
        ptx = cg.ptx(cg.generate(k), (9, 0))
        f64 = [ln for ln in ptx.splitlines() if re.search(r"\.f64\b", ln)]
        assert not f64, f"{k.kind} kernel has double-precision instructions:\n" + "\n".join(f64)


def test_rounding_is_spelled_for_the_device():
    """floor/ceil/trunc are PTX's cvt.rmi/rpi/rzi and round is cvt.rni (half to even): no
    integer conversion that would lose NaN, infinities or -0.0, for both float types."""
    for t, suffix in (("f32", "f32.f32"), ("f64", "f64.f64")):
        (k,) = kernels_of(
            f"(input x {t} [64])\n(let r (Add (Add (Floor x) (Ceil x)) "
            "(Add (Trunc x) (Round x))))\n(output r)\n"
        )
        ptx = cg.ptx(cg.generate(k), (9, 0))
        for mode in ("rmi", "rpi", "rzi", "rni"):
            assert f"cvt.{mode}.{suffix}" in ptx, mode


def test_float64_kernel_does_use_f64():
    (k,) = kernels_of("(input x f64 [16])\n(let r (Exp x))\n(output r)\n")
    assert ".f64" in cg.ptx(cg.generate(k), (9, 0))  # the check above can fail


def test_variables_are_named_after_values_and_constants_typed():
    (k,) = kernels_of(
        "(input x f32 [16])\n(let r (Sigmoid (Mul x (Scalar 0.5 f32))))\n(output r)\n"
    )
    src = cg.generate(k).source
    assert "mul_1 = in0_v * np.float32(0.5)" in src and "sigmoid_2 =" in src


def test_operand_size_mismatch_raises_before_launch():
    (k,) = kernels_of("(input x f32 [4 8])\n(param b f32 [8])\n(let r (Add x b))\n(output r)\n")
    g = cg.generate(k)
    with pytest.raises(cg.KernelError, match="kernel built for"):
        cg.size_args(g, k, [(4, 8), (9,)], [(8, 1), (1,)])


def test_nonadjacent_reduction_is_refused():
    """The lowering hands the emitter adjacent axes (a permuted view); a kernel that
    reduces axes apart anyway is refused, not miscompiled."""
    (k,) = kernels_of("(input x f32 [3 4 5])\n(let r (Sum x [0 2] 0))\n(output r)\n")
    assert k.attrs["dims"] == (1, 2) and k.domain == (4, 3, 5)
    apart = dataclasses.replace(k, domain=(3, 4, 5), attrs={**k.attrs, "dims": (0, 2)})
    with pytest.raises(cg.KernelError, match="non-adjacent"):
        cg.generate(apart)


def test_narrow_variant_divides_in_32_bits():
    """Strided reads' index arithmetic: 64-bit signed divisions per element in the wide
    variant, 32-bit unsigned ones in the narrow variant (launched when indices fit)."""
    # a tensor operand, not a scalar: x * 0.5 would be computed before the permute
    # (mul-scalar-above-permute) and read x in order
    (k,) = kernels_of(
        "(input x f32 [6 5 4 3])\n(input y f32 [6 4 5 3])\n"
        "(let r (Mul (Permute x [0 2 1 3]) y))\n(output r)\n"
    )
    assert [o.indexing for o in k.inputs] == ["strided", "same"]
    wide, narrow = (cg.ptx(cg.generate(k, narrow=n), (9, 0)) for n in (False, True))
    assert re.search(r"\b(div|rem)\.s64\b", wide)  # the check below can fail
    assert not re.search(r"\b(div|rem)\.s64\b", narrow) and re.search(r"\brem\.u32\b", narrow)
    assert not cg.fits_narrow(2**31, (2**31,), (1,))
    assert not cg.fits_narrow(8, (2, 4), (2**31, 1)) and cg.fits_narrow(8, (2, 4), (4, 1))


def test_broadcast_runs_share_their_values_and_divide_in_32_bits():
    """A batch norm's per-channel operands (middle indexing): a vector step inside one run
    reads them once, so ``rsqrt(var + eps)`` is computed once for the four lanes (one
    square root there; four where the step crosses into the next run, its lanes choosing
    between the two runs' values; four where runs are shorter than a step and each lane
    reads its own; beside the scalar tail's, which the compiler unrolls); the narrow
    variant has no 64-bit division."""
    (k,) = kernels_of(
        "(input x f32 [2 3 8])\n(input m f32 [3 1])\n(input v f32 [3 1])\n"
        "(let r (Mul (Sub x m) (Rsqrt (Add v (Scalar 1e-05 f32)))))\n(output r)\n"
    )
    assert [o.indexing for o in k.inputs] == ["same", "middle", "middle"]
    wide, narrow = (cg.ptx(cg.generate(k, narrow=n), (9, 0)) for n in (False, True))
    scalar = cg.ptx(cg.generate(k, lanes=1), (9, 0))
    roots = [len(re.findall(r"\bsqrt\.rn\.f32\b", p)) for p in (wide, scalar)]
    assert roots[0] - roots[1] == 1 + 4 + 4, roots
    assert re.search(r"\b(div|rem)\.s64\b", wide)
    assert not re.search(r"\b(div|rem)\.s64\b", narrow) and re.search(r"\bdiv\.u32\b", narrow)


def test_helpers_are_inlined_by_nvvm_and_build_without_a_gpu():
    """A bfloat16 loop calling many helpers (eight lanes of max_nan, bf16_load, bf16_round,
    bf16_store) declares them ``forceinline`` (NVVM inlines them: no call is left in the
    PTX) and builds here, on a machine with no GPU (numba-cuda asks the current device for
    its compute capability while compiling a called device function: ``ptx`` answers with
    the target's, decision 0058)."""
    (k,) = kernels_of(
        "(input a bf16 [4 64])\n(input b bf16 [4 64])\n(input c bf16 [4 64])\n"
        "(let r (Maximum (Maximum a b) c))\n(output r)\n"
    )
    g = cg.generate(k)
    assert g.lanes == 8 and "forceinline=True" in g.source and 'inline="always"' not in g.source
    ptx = cg.ptx(g, (9, 0))
    assert not re.search(r"\bcall(\.uni)?\b", ptx)


def test_bfloat16_stores_are_the_hardware_conversion_from_compute_capability_8():
    """Each bfloat16 lane is stored through one ``cvt.rn.bf16.f32`` (decision 0114), not
    64-bit integer rounding; a 7.5 target, which has no such
    instruction, builds the same source with 32-bit integer rounding instead (its own
    module: Numba keeps one compile of a device function per signature, whatever the
    target). Bits: the simulator's half cases and the GPU's bit-for-bit test."""
    (k,) = kernels_of("(input x bf16 [64 256])\n(let r (Tanh (Add x x)))\n(output r)\n")
    g = cg.generate(k)
    new, old = cg.ptx(g, (9, 0)), cg.ptx(g, (7, 5))
    # two roundings an element (the sum, as eager rounds it, and the stored tanh) in the
    # eight vector lanes and the scalar tail
    assert g.lanes == 8 and len(re.findall(r"\bcvt\.rn\.bf16\.f32\b", new)) == 2 * (8 + 1)
    assert not re.search(r"\bsetp\.nan\.f32\b", new)  # the instruction's NaN is kept
    assert "cvt.rn.bf16" not in old and not re.search(r"\bcall(\.uni)?\b", old)
    # 64-bit integer rounding was about 30 instructions a lane: what is left is indexing
    assert len(re.findall(r"\.[su]64\b", new)) < len(re.findall(r"\.[su]64\b", old))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_loops_and_row_copies_move_16_bytes_per_access(dtype):
    """Eight half elements per vector step, as four 32-bit words (LLVM would split an
    eight-lane 16-bit vector in two 8-byte accesses); a mixed loop reading float32 stays at
    four lanes. The values are checked under the simulator (cudasim_runner) and on the GPU."""
    (k,) = kernels_of(f"(input x {dtype} [64 256])\n(let r (Tanh (Add x x)))\n(output r)\n")
    g = cg.generate(k)
    assert g.lanes == 8 and all(a == 16 for _, a in g.aligned)
    ptx = cg.ptx(g, (9, 0))
    assert "ld.global.v4.u32" in ptx and "st.global.v4.u32" in ptx
    assert not re.search(r"\.v4\.u16\b", ptx)
    copy = cg.ptx(cg.generate_row_copy(2, 4, True), (9, 0))
    assert "ld.global.v4.u32" in copy and "st.global.v4.u32" in copy
    (k,) = kernels_of(
        f"(input x {dtype} [64 256])\n(input y f32 [64 256])\n"
        "(let r (Add (Cast x f32) y))\n(output r)\n"
    )
    assert cg.generate(k).lanes == 4


def test_a_body_rounded_to_the_stored_half_type_rounds_once():
    """``(cast e bf16)`` stored as bfloat16 stores ``e``: the store rounds it to the same bits
    (bit for bit under the simulator's half cases, special values included). A cast to
    another type, or a body that is not a cast, is stored as it is."""
    e = ("tanh", ("in", 0))
    assert cg.stored_body(("cast", e, "bf16"), "bf16") == e
    assert cg.stored_body(("cast", e, "f16"), "f16") == e
    assert cg.stored_body(("cast", e, "f32"), "f32") == ("cast", e, "f32")
    assert cg.stored_body(e, "bf16") == e
    (k,) = kernels_of("(input x bf16 [64 256])\n(let r (Tanh x))\n(output r)\n")
    assert k.body[0] == "cast" and "= bf16_round(" not in cg.generate(k).source


def test_fma_and_ne_compile_to_ptx():
    """The float32 Fma computes in float64 (its one rounding), and Ne of floats is a
    not-equal comparison that is true for NaN (an unordered compare)."""
    (k,) = kernels_of(
        "(input a f32 [16])\n(input b f32 [16])\n(input c f32 [16])\n"
        "(let r (Fma a b c))\n(output r)\n"
    )
    ptx = cg.ptx(cg.generate(k), (9, 0))
    assert re.search(r"\b(fma|mul)\.rn\.f64\b", ptx) and "cvt.rn.f32.f64" in ptx
    (k,) = kernels_of("(input a f32 [16])\n(input b f32 [16])\n(let r (Ne a b))\n(output r)\n")
    assert re.search(r"setp\.neu\.f32", cg.ptx(cg.generate(k), (9, 0)))


@pytest.mark.parametrize(
    "shape,dims,split",
    [
        ((16384 * 1024,), "[0]", True),  # a loss summed to one value
        ((16384, 1024), "[0]", True),  # a bias gradient: 32 blocks of columns unsplit
        ((8, 2048, 300), "[1]", True),  # a middle axis with few outputs
        ((8192, 8192), "[1]", False),  # 8192 rows: a block each already fills the device
        ((4, 900), "[1]", False),  # short rows: a warp each
        ((64, 64), "[0]", False),  # columns too short to split
    ],
)
def test_narrow_reductions_split_their_axis(shape, dims, split):
    text = f"(input x f32 [{' '.join(map(str, shape))}])\n(let r (Sum x {dims} 0))\n(output r)\n"
    (k,) = kernels_of(text)
    chunks, chunk = cg.split_plan(k)
    _, red, _ = cg.reduce_layout(k)
    assert (chunks > 1) == split
    assert chunks * chunk >= red > (chunks - 1) * chunk  # every element in one chunk
    if split:  # both kernels compile for the device, float32 only
        for g in cg.generate_split(k):
            ptx = cg.ptx(g, (9, 0))
            assert not [ln for ln in ptx.splitlines() if re.search(r"\.f64\b", ln)]


def test_a_rows_kernel_keeps_its_row_in_registers():
    """An add + layer norm over 16,384 rows of 1,024 (a warp per row, four lanes, eight
    steps a pass): the add is computed inside the rows kernel (``inline_row_producers``),
    whose first pass loads both row operands into registers that the variance and body
    passes read. Its PTX loads each row 8 times (one 16-byte load a step), not 8 times a
    pass (24) as when the row does not fit ``ROW_REGISTERS``, and keeps it in registers.
    Values: cudasim_runner's
    ``(warps)`` and ``(re-read)`` runs, and the GPU encoder tests."""
    text = (
        "(input x f32 [16384 1024])\n(input y f32 [16384 1024])\n(param w f32 [1024])\n"
        "(param b f32 [1024])\n(let r (LayerNorm (Add x y) w b [1] 1e-05))\n(output r)\n"
    )
    (k,) = kernels_of(text)  # one kernel: the add is not written
    assert k.kind == "rows" and cuda_rows.row_cache(k, 32, 4) == (8, [0, 1])

    def row_loads(g) -> int:
        # the two row operands are parameters 1 and 2; count their 16-byte vector loads
        return len(re.findall(r"ld\.global\.v4\.f32", cg.ptx(g, (9, 0))))

    g = cg.generate(k)
    old = cuda_rows.ROW_REGISTERS
    try:
        cuda_rows.ROW_REGISTERS = 0
        assert cuda_rows.row_cache(k, 32, 4) is None
        reread = cg.generate(k)
    finally:
        cuda_rows.ROW_REGISTERS = old
    # kept: a loop of 8 steps per pass that the compiler unrolls, the row in arrays it
    # promotes to registers (no local memory); 2 operands x 8 steps, each loaded once,
    # and the weight and bias (whole-row trailing operands) 2 x 8 in the body pass
    assert "while r < red" not in g.source and g.source.count("for t in range(8)") == 3
    assert row_loads(g) == 2 * 8 + 2 * 8 and ".local" not in cg.ptx(g, (9, 0))
    # re-read: a loop over the row per pass (mean, variance, body), each loading both
    assert reread.source.count("while r < red") == 3


def test_many_short_rows_share_a_warp():
    """A softmax over 301,056 rows of 49 (Swin's windows): 8 lanes a row, 4 rows a warp, the
    row kept in registers (a loop of 7 steps the compiler unrolls), each row's result
    broadcast from its first lane, and the rows past the end of the last warp computed
    again and not stored; the grid launches a block per 32 rows. Few rows, rows of more
    than ``ROW_SEGMENT_MAX`` (64) steps, and ``ROW_SEGMENT_STEPS = 0`` keep a warp (or a
    block) per row. Values: cudasim_runner's ``(segments, re-read)`` and ``(segments,
    kept)`` runs, and ``bench/rows_short.py`` on the GPU."""

    def softmax(rows: int, n: int):
        (k,) = kernels_of(f"(input x f32 [{rows} {n}])\n(let r (Softmax x 1))\n(output r)\n")
        return k

    k = softmax(301056, 49)
    g = cg.generate(k)
    assert (g.style, g.row_threads) == ("rows", 8)
    assert "lane = cuda.threadIdx.x % 8" in g.source and "while r < red" not in g.source
    assert "shfl_sync(0xFFFFFFFF, acc0, base)" in g.source and "if live:" in g.source
    assert "for t in range(7)" in g.source and ".local" not in cg.ptx(g, (9, 0))
    assert cuda_load.grid_for(g, {"outer": 301056}) == (301056 // 32, cg.THREADS)
    assert cg.generate(softmax(100, 20)).row_threads == 32  # few rows: a warp each,
    assert cg.generate(softmax(100, 49)).style == "rows-block"  # or a block past 32
    assert cg.generate(softmax(16384, 1024)).row_threads == 32
    assert cg.generate(softmax(16384, 65)).row_threads == 32  # past ROW_SEGMENT_MAX steps
    assert cg.generate(softmax(16384, 63)).row_threads == 8
    assert cg.generate(softmax(8192, 12)).row_threads == 4  # the fewest lanes a row
    old = cuda_rows.ROW_SEGMENT_STEPS
    try:
        cuda_rows.ROW_SEGMENT_STEPS = 0
        whole = cg.generate(k)
    finally:
        cuda_rows.ROW_SEGMENT_STEPS = old
    assert whole.row_threads == 32 and "if row < outer:" in whole.source
    assert "live" not in whole.source


def test_a_rows_kernel_reads_whole_row_trailing_operands_from_a_row_base():
    """An embedding block's sum and layer norm: token rows plus position rows repeated
    over the batch (a trailing operand of 512 rows), then the weight and bias (one row).
    Each is read from a base worked out once per row (``pb``): no division per element,
    and 16-byte loads. Only the token rows would be kept in registers, and one operand
    (4 KB a row) is below ROW_CACHE_BYTES, so every pass re-reads (measured faster than
    keeping the position rows too). Values: cudasim_runner's
    ``rows_add_position_layer_norm`` in every rows form, and the GPU block tests."""
    text = (
        "(input x f32 [32 512 1024])\n(input p f32 [512 1024])\n(param w f32 [1024])\n"
        "(param b f32 [1024])\n(let r (LayerNorm (Add x p) w b [2] 1e-05))\n(output r)\n"
    )
    (k,) = kernels_of(text)
    assert k.kind == "rows" and cuda_rows.row_cache(k, 32, 4) is None
    trailing = [i for i, o in enumerate(k.inputs) if o.indexing == "trailing"]
    assert len(trailing) == 3 and all(cg._row_trailing(k, i) for i in trailing)
    g = cg.generate(k)
    assert all(f"pb{i} = (row % (m{i} // red)) * red" in g.source for i in trailing)
    assert " % m" not in g.source.replace("// red", "")  # no per-element remainder
    assert all((1 + i, 16) in g.aligned for i in trailing)  # checked before vector reads
    # declines: a loop's trailing operand keeps its remainder (no rows there)
    (loop,) = kernels_of("(input x f32 [4 6])\n(input b f32 [6])\n(let r (Add x b))\n(output r)\n")
    assert loop.kind == "loop" and not cg._row_trailing(loop, 1)


def test_a_rows_kernel_reads_row_constant_operands_once_per_row():
    """An attention softmax's mask column [S, 1] (under [B, H, S, S]) and a per-row value
    [B, H, S, 1] are constant along each row: each is read once per row at the row's start
    (``rc{i}``), not divided out at every element of the three passes (64-bit divisions:
    OPT's causal softmax on the H200 spent 1.1 ms a layer in them). Values:
    cudasim_runner's ``rows_row_constant_softmax`` in every rows form."""
    text = (
        "(input x f32 [2 3 5 40])\n(input m f32 [5 1])\n(input l f32 [2 3 5 1])\n"
        "(let r (Softmax (Add (Add x m) l) 3))\n(output r)\n"
    )
    (k,) = kernels_of(text)
    assert k.kind == "rows"
    constant = [i for i, o in enumerate(k.inputs) if cuda_reads._row_constant(k, i)]
    assert sorted(k.inputs[i].indexing for i in constant) == ["leading", "middle"]
    for lanes in (1, 4):
        src = cg.generate(k, lanes=lanes).source
        assert all(src.count(f"rc{i} = in{i}[") == 1 for i in constant), src
        assert "// r" not in src.replace("(row * red) // r", "")  # no per-element division
    # declines: a mask varying along the row ([S, S]: trailing), and a loop's broadcast
    (k2,) = kernels_of(
        "(input x f32 [2 5 40])\n(input m f32 [5 40])\n(let r (Softmax (Add x m) 2))\n(output r)\n"
    )
    assert k2.kind == "rows" and not any(
        cuda_reads._row_constant(k2, i) for i in range(len(k2.inputs))
    )
    (loop,) = kernels_of(
        "(input x f32 [4 6])\n(input b f32 [4 1])\n(let r (Add x b))\n(output r)\n"
    )
    assert loop.kind == "loop" and not cuda_reads._row_constant(loop, 1)


def test_narrow_reductions_divide_in_32_bits():
    """A reduction reading broadcast operands (a layer norm's weight gradient: an expanded
    scalar, per-row statistics, a per-column weight) divides its index per element: 64-bit
    divisions in the wide variant, 32-bit ones in the narrow variant, whole and split. The
    expand is read as the scalar it broadcasts, not through strides."""
    (k,) = kernels_of(
        "(input g f32 [])\n(input x f32 [64 32 16])\n(input m f32 [64 32 1])\n"
        "(input w f32 [16])\n"
        "(let r (Sum (Mul (Mul (Expand g [64 32 16]) (Sub x m)) w) [0 1 2] 0))\n(output r)\n"
    )
    assert sorted(o.indexing for o in k.inputs) == ["leading", "same", "scalar", "trailing"]
    wide, narrow = (cg.ptx(cg.generate(k, narrow=n), (9, 0)) for n in (False, True))
    split_wide, split_narrow = (
        cg.ptx(cg.generate_split(k, narrow=n)[0], (9, 0)) for n in (False, True)
    )
    for w, n in ((wide, narrow), (split_wide, split_narrow)):
        assert re.search(r"\b(div|rem)\.s64\b", w)  # the check below can fail
        assert not re.search(r"\b(div|rem)\.s64\b", n) and re.search(r"\bdiv\.u32\b", n)


@pytest.mark.parametrize(
    ("text", "prefix"),
    [
        (
            "(input a f32 [64])\n(input b f32 [64])\n(input c f32 [64])\n"
            "(let r (Sigmoid (Relu (Add (Mul a b) c))))\n(output r)",
            "loop_sigmoid_relu_add_mul_",
        ),
        ("(input x f32 [8 40])\n(let r (Softmax x 1))\n(output r)", "rows_max_sum_"),
        ("(input x f32 [8 40])\n(let r (Sum (Mul x x) [1] 0))\n(output r)", "reduce_sum_mul_"),
        (
            "(input x f32 [64])\n(let r (Exp (Neg (Abs (Sqrt (Relu (Tanh x)))))))\n(output r)",
            "loop_exp_neg_abs_sqrt_etc_",
        ),
    ],
)
def test_kernel_names_say_what_they_compute(text, prefix):
    """A generated kernel's name (what profilers show) lists its operations, then a digest
    that tells kernels of the same operations apart."""
    (k,) = compile_graph(parse_graph(text + "\n"), machine="gpu", io_on_device=True).program.kernels
    name = cg.generate(k).name
    assert name.startswith(prefix) and re.fullmatch(r"[a-z_]+[0-9a-f]{12}", name), name


def test_a_broadcast_axis_is_never_the_fastest():
    """An expanded grouped-query key ([B, H, R, L, D], R of stride 0) copies by rows along
    D, not as a transpose of R against D (a tiled copy 8x wasteful: R is 4 of 32 lanes)."""
    assert cg.fastest_axis((2, 3, 4, 5, 8), (120, 8, 0, 24, 1)) == 4
    assert cg.fastest_axis((2, 3, 4), (0, 1, 3)) == 1  # a real transpose still is one
    assert cg.fastest_axis((2, 3), (0, 0)) == 1  # all broadcast: the fill's case


def test_a_repeated_layers_kernels_are_generated_once():
    """Two blocks of one transformer hold the same kernels under other value names: each is
    generated once and shared (``generate`` keys on ``structure``). A change the emitter
    reads (an operand's shape, a rows tunable) is another kernel; the shared result is the
    one generating afresh gives."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "eqsat_transformer", Path(__file__).resolve().parents[2] / "bench" / "eqsat_transformer.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    c = compile_graph(parse_graph(bench.transformer_text(2)), machine="gpu", io_on_device=True)
    kernels = [k for k in c.program.kernels if k.kind in ("loop", "reduce", "rows")]
    by_structure: dict[str, list] = {}
    for k in kernels:
        by_structure.setdefault(cg.structure(k), []).append(k)
    pairs = [ks for ks in by_structure.values() if len(ks) > 1]
    assert pairs, "the two blocks share no kernel"
    for ks in pairs:
        assert len({k.output for k in ks}) == len(ks)  # other names, one structure
        assert all(cg.generate(k) is cg.generate(ks[0]) for k in ks)
        assert cg.generate(ks[0]).source == cg._generate(ks[-1], None, False).source
    k = pairs[0][0]
    wider = dataclasses.replace(
        k, inputs=[dataclasses.replace(o, shape=(*o.shape[:-1], 3)) for o in k.inputs]
    )
    assert cg.structure(wider) != cg.structure(k)
    rows = next(k for k in kernels if k.kind == "rows")
    base, old = cg.generate(rows), cuda_rows.ROW_REGISTERS
    try:
        cuda_rows.ROW_REGISTERS = 0
        assert cg.generate(rows) is not base
        assert cg.generate(rows).source == cg._generate(rows, None, False).source
    finally:
        cuda_rows.ROW_REGISTERS = old


def test_a_vector_body_is_written_once_and_inlined():
    """A kernel of vector lanes writes its body once, as a device function each lane calls
    (``LaneBodies``): a bfloat16 loop's tanh appears once in the source, called by its 8
    lanes and the scalar tail, its operand read by one converting vector load a step; a
    float32 layer norm's three passes are three functions called by its 4 lanes. NVVM
    inlines them: no call is left in the PTX."""
    (k,) = kernels_of("(input x bf16 [64 256])\n(let r (Tanh (Add x x)))\n(output r)\n")
    g = cg.generate(k)
    assert g.lanes == 8 and g.source.count("math.tanh(") == 1
    # its bfloat16 operand read and converted by one call a step, not a call a lane
    assert "= bf16_vload8(in0, j)" in g.source and "= bf16_load(in0_v" not in g.source
    assert len(re.findall(rf"\b{g.name}_b0\(", g.source)) == 1 + 8 + 1  # def, lanes, tail
    assert not re.search(r"\bcall(\.uni)?\b", cg.ptx(g, (9, 0)))
    (k,) = kernels_of(
        "(input x f32 [16384 1024])\n(param w f32 [1024])\n(param b f32 [1024])\n"
        "(let r (LayerNorm x w b [1] 1e-05))\n(output r)\n"
    )
    g = cg.generate(k)
    assert g.lanes == 4 and g.style == "rows"
    assert [len(re.findall(rf"\b{g.name}_b{n}\(", g.source)) for n in range(4)] == [5, 5, 5, 0]
    assert not re.search(r"\bcall(\.uni)?\b", cg.ptx(g, (9, 0)))


def test_loop_groups_of_other_sizes_share_one_source():
    """A loop group reads flat and takes its loops' lengths at launch: parameter updates
    of other shapes and ranks (an optimizer's groups) are one kernel to build, and its
    grid covers the largest loop."""

    def updates(shapes: list[str]) -> str:
        ins = "".join(f"(input p{i} f32 {s})\n(input g{i} f32 {s})\n" for i, s in enumerate(shapes))
        lets = "".join(f"(let u{i} (Sub p{i} g{i}))\n" for i in range(len(shapes)))
        return ins + lets + f"(output {' '.join(f'u{i}' for i in range(len(shapes)))})\n"

    (a, *_), (b, *_) = (
        kernels_of(updates(["[3 5]", "[7]"])),
        kernels_of(updates(["[9]", "[2 2 2]"])),
    )
    assert "segments" in a.attrs and "segments" in b.attrs
    ga, gb = cg.generate(a), cg.generate(b)
    assert ga.source == gb.source and ga.style == "loop-group"
    sizes = cg.size_args(gb, b, [o.shape for o in b.inputs], [(1,)] * len(b.inputs))
    assert (sizes["n"], sizes["n1"]) == (9, 8)
    assert cuda_load.grid_for(gb, sizes) == (1, cg.THREADS)
    # a group of a different length is another kernel
    (c, *_) = kernels_of(updates(["[9]", "[2 2 2]", "[4]"]))
    assert cg.generate(c).source != ga.source
