"""Run the CUDA emitter's kernels under Numba's CUDA simulator (no GPU) and compare them
with the numpy reference. Run as a script with NUMBA_ENABLE_CUDASIM=1 (the test does)."""

from __future__ import annotations

import itertools
import math
import os
import sys

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"

from numba import cuda  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cudasim_blocks  # noqa: E402

cudasim_blocks.install()

from saturn.codegen import cuda as cg  # noqa: E402
from saturn.codegen import cuda_reads, cuda_rows  # noqa: E402
from saturn.eqsat import evaluate as ev  # noqa: E402
from saturn.eqsat import optable as ot  # noqa: E402
from saturn.eqsat.graph import parse_graph  # noqa: E402
from saturn.eqsat.pipeline import compile_graph  # noqa: E402

SWIN_MASK = (
    "(input s f32 [4 3 7 7])\n(input b f32 [7 7 3])\n(input m f32 [4 7 7])\n"
    "(let bp (View (Permute b [2 0 1]) [1 3 7 7]))\n(let a (Add s bp))\n"
    "(let a5 (View a [1 4 3 7 7]))\n(let m5 (View m [1 4 1 7 7]))\n(let am (Add a5 m5))\n"
    "(let r (Softmax (View am [4 3 7 7]) 3))\n(output r)"
)

# the same over two images (the mask added per image and window, (2, 4, 3, 7, 7), read by a
# softmax over (8, 3, 7, 7)), scaled per head by a channel of five axes
SWIN_MASK_BATCHED = (
    "(input s f32 [8 3 7 7])\n(input b f32 [7 7 3])\n(input m f32 [4 7 7])\n"
    "(input c f32 [3 1 1])\n"
    "(let bp (View (Permute b [2 0 1]) [1 3 7 7]))\n(let a (Add s bp))\n"
    "(let a5 (View a [2 4 3 7 7]))\n(let m5 (View m [1 4 1 7 7]))\n"
    "(let am (Mul (Add a5 m5) (View c [1 1 3 1 1])))\n"
    "(let r (Softmax (View am [8 3 7 7]) 3))\n(output r)"
)

GRAPHS = {
    # reductions over axes that are not adjacent: permuted views, a broadcast operand
    # expanded first, keepdim on and off
    "reduce_apart": "(input x f32 [3 4 5])\n(input w f32 [5])\n"
    "(let s (Sum (Mul x w) [0 2] 0))\n(let m (Amax x [0 2] 1))\n"
    "(let r (Add m (View s [1 4 1])))\n(output r s)",
    # rotary embeddings (inline_through_reshapes): rotate_half's cat, a where on a
    # [.., 2, d/2] grid, computed inside the loop over [.., d] that reads it through a
    # reshape (the query a permuted view, cos and sin broadcast); the table's cat read by
    # two loops (in place of cos and sin: the simulator's math.cos raises at infinity),
    # inlined into both
    "rotary": "(input q f32 [2 16 4 16])\n(input f f32 [1 16 8])\n"
    "(let t (Permute q [0 2 1 3]))\n(let i (Arange 0 1 2 i64))\n"
    "(let iv (View i [1 1 1 2 1]))\n(let sel (Eq iv (Scalar 0.0 i64)))\n"
    "(let fa (View f [1 16 1 8]))\n(let fw (Expand fa [1 16 2 8]))\n"
    "(let it (View i [1 1 2 1]))\n(let st (Eq it (Scalar 0.0 i64)))\n"
    "(let fc (Where st fw fw))\n(let emb (View fc [1 16 16]))\n"
    "(let c (View (Mul emb (Scalar 0.5 f32)) [1 1 16 16]))\n(let s (View (Neg emb) [1 1 16 16]))\n"
    "(let x1 (Slice t 3 0 8 1))\n(let x2 (Slice t 3 8 16 1))\n(let n (Neg x2))\n"
    "(let a (Expand (View n [2 4 16 1 8]) [2 4 16 2 8]))\n"
    "(let b (Expand (View x1 [2 4 16 1 8]) [2 4 16 2 8]))\n"
    "(let w (Where sel a b))\n(let rot (View w [2 4 16 16]))\n"
    "(let r (Add (Mul t c) (Mul rot s)))\n(output r)",
    # Swin's shifted windows (inline_row_producers through reshapes): the scores plus a
    # permuted bias, viewed to five axes for the mask and back, computed inside the softmax
    "window_mask_softmax": SWIN_MASK,
    "window_mask_softmax_batched": SWIN_MASK_BATCHED,  # the softmax over the mask's grid
    "fma_sigmoid": "(input a f32 [37])\n(input b f32 [37])\n(input c f32 [37])\n"
    "(let r (Sigmoid (Relu (Add (Mul a b) c))))\n(output r)",
    "bias_trailing": "(input x f32 [5 7])\n(param b f32 [7])\n"
    "(let r (Mul (Add x b) (Scalar -0.5 f32)))\n(output r)",
    "leading_strided": "(input x f64 [3 4 5])\n(input c f64 [3 1 1])\n(input d f64 [1 4 1])\n"
    "(let r (Sub (Mul x c) d))\n(output r)",
    # channel operands ((i // r) % m): runs of 5 and 12 elements against 4-wide vectors,
    # four operands of one shape sharing their index parameters, a bool channel
    "channel_batch_norm": "(input x f32 [2 3 5])\n(input m f32 [3 1])\n(input v f32 [3 1])\n"
    "(input w f32 [3 1])\n(input b f32 [3 1])\n"
    "(let r (Relu (Add (Mul (Mul (Sub x m) (Rsqrt (Add (Abs v) (Scalar 1e-05 f32)))) w) b)))\n"
    "(output r)",
    "channel_runs_of_12": "(input x f32 [2 5 3 4])\n(input c f32 [5 1 1])\n"
    "(let r (Mul x c))\n(output r)",
    # runs shorter than a vector (3 < 4 lanes: each lane reads its own) and a leading
    # operand whose runs of 10 a step straddles (read at the run and the next)
    "channel_runs_of_3": "(input x f32 [2 5 3])\n(input c f32 [5 1])\n"
    "(input l f32 [2 1 1])\n(let r (Add (Mul x c) l))\n(output r)",
    "leading_runs_of_10": "(input x f32 [3 2 5])\n(input l f32 [3 1 1])\n"
    "(let r (Sub x l))\n(output r)",
    "channel_bool": "(input c bool [4 3 1])\n(input x f32 [2 4 3 6])\n(input y f32 [2 4 3 6])\n"
    "(let r (Where c x y))\n(output r)",
    "vector_with_tail": "(input a f32 [2003])\n(input b f32 [2003])\n"
    "(let r (Tanh (Mul a (Add b (Scalar 0.25 f32)))))\n(output r)",
    "bool_loop": "(input a bool [1500])\n(input b bool [1500])\n(input c bool [1500])\n"
    "(let r (Where a b c))\n(output r)",
    "permuted": "(input x f32 [6 5])\n(let r (Exp (Permute x [1 0])))\n(output r)",
    # rows of 8 stay contiguous: the strided operand is read 4 elements at a time
    "heads_permute": "(input x f32 [2 8 3 8])\n(input b f32 [8])\n"
    "(let r (Add (Mul (Permute x [0 2 1 3]) (Scalar 0.125 f32)) b))\n(output r)",
    "ints": "(input x i32 [33])\n(input y i32 [33])\n"
    "(let r (Maximum (Add x y) (Neg y)))\n(output r)",
    "int64_where": "(input c bool [17])\n(input x i64 [17])\n(input y i64 [17])\n"
    "(let r (Where c x (Abs y)))\n(output r)",
    "ne_and_truth": "(input x f32 [37])\n(input y f32 [37])\n"
    "(let r (Where (Ne x y) (Ne x (Scalar 0 f32)) (Expand (Scalar 0 bool) [37])))\n(output r)",
    "fma_rounds_once": "(input a f32 [37])\n(input b f32 [37])\n(input c f32 [37])\n"
    "(let r (Fma a b c))\n(output r)",
    "arange_one_hot": "(input g f32 [3 5])\n(let i (Arange 0 1 5 i64))\n"
    "(let r (Where (Eq i (Scalar 2 i64)) g (Expand (Scalar 0 f32) [3 5])))\n(output r)",
    "max_pool_windows": "(input x f32 [2 3 9 13])\n(let a (Slice x 2 0 8 1))\n"
    "(let c (Slice a 3 0 12 1))\n(let v (View c [2 3 4 2 6 2]))\n"
    "(let p (Permute v [0 1 2 4 3 5]))\n(let r (Amax p [4 5] 0))\n(output r)",
    # rows of at most ROW_THREAD_LIMIT elements: a thread per row (NaN from the inputs)
    "row_thread_min": "(input x f32 [300 5])\n(let r (Amin x [1] 0))\n(output r)",
    "row_thread_epilogue": "(input x f32 [7 3 16])\n"
    "(let r (Sqrt (Mean (Mul x x) [2] 1)))\n(output r)",
    "row_sum_sq": "(input x f32 [9 40])\n(let r (Sum (Mul x x) [1] 1))\n(output r)",
    "row_max_long": "(input x f32 [2 1100])\n(let r (Amax x [1] 0))\n(output r)",
    "full_sum_long": "(input x f32 [5000])\n(let r (Sum (Mul x x) [0] 0))\n(output r)",
    "full_mean_2d": "(input x f64 [40 70])\n(let r (Mean x [0 1] 0))\n(output r)",
    "col_mean": "(input x f32 [30 9])\n(let r (Mean x [0] 0))\n(output r)",
    # a layer norm's weight gradient as its backward sums it: an expanded scalar (read as
    # a scalar), per-row statistics (leading), a per-column weight (trailing); columns and
    # a full sum, and a permuted operand read through strides
    "col_sum_broadcasts": "(input g f32 [])\n(input x f32 [3 4 6])\n(input m f32 [3 4 1])\n"
    "(input w f32 [6])\n"
    "(let r (Sum (Mul (Mul (Expand g [3 4 6]) (Sub x m)) w) [0 1] 0))\n(output r)",
    "full_sum_broadcasts": "(input x f32 [5 40])\n(input m f32 [5 1])\n(input w f32 [40])\n"
    "(let r (Sum (Mul (Sub x m) w) [0 1] 0))\n(output r)",
    "row_sum_strided": "(input x f32 [40 5])\n(input b f32 [5 1])\n"
    "(let r (Sum (Mul (Permute x [1 0]) b) [1] 0))\n(output r)",
    "mid_prod": "(input x f64 [3 4 5])\n(let r (Prod x [1] 0))\n(output r)",
    "int_sum_widens": "(input x i32 [6 50])\n(let r (Sum x [0 1] 0))\n(output r)",
    "bool_sum": "(input x bool [40])\n(let r (Sum x [0] 0))\n(output r)",
    "softmax": "(input x f32 [4 33])\n(let r (Softmax x 1))\n(output r)",
    # strided operands of rows kernels, read from each row's base: a mask broadcast over
    # heads, a transposed one
    "softmax_broadcast_mask": "(input x f32 [2 3 5 40])\n(input m f32 [2 1 5 40])\n"
    "(let r (Softmax (Add x (Expand m [2 3 5 40])) 3))\n(output r)",
    "softmax_transposed_mask": "(input x f32 [3 6 7])\n(input m f32 [3 7 6])\n"
    "(let r (Softmax (Add x (Permute m [0 2 1])) 2))\n(output r)",
    "epilogue_row_warp": "(input x f32 [5 40])\n(let r (Sqrt (Sum (Mul x x) [1] 1)))\n(output r)",
    "epilogue_row_block": "(input x f64 [2 1100])\n"
    "(let r (Rsqrt (Add (Mean (Mul x x) [1] 0) (Scalar 1e-06 f64))))\n(output r)",
    "epilogue_column_cast": "(input x i32 [30 9])\n(let r (Cast (Sum x [0] 0) f32))\n(output r)",
    "min_nan": "(input x f32 [3 20])\n(let r (Amin x [1] 0))\n(output r)",
    # rows kernels (fuse_rows): softmax and layer norm as one pass per row; a permuted
    # (strided) input; float64; a log-softmax whose sum has a log epilogue
    "rows_softmax_strided": "(input x f32 [37 3])\n(let r (Softmax (Permute x [1 0]) 1))\n"
    "(output r)",
    "rows_layer_norm": "(input x f32 [6 70])\n(param w f32 [70])\n(param b f32 [70])\n"
    "(let r (LayerNorm x w b [1] 1e-05))\n(output r)",
    # a training layer norm (as the importer writes one): its mean and reciprocal deviation
    # written by the rows kernel as statistics, one of them computed from a stage
    "rows_layer_norm_stats": "(input x f32 [6 70])\n(param w f32 [70])\n"
    "(param b f32 [70])\n(let r (LayerNorm x w b [1] 1e-05))\n(let m (Mean x [1] 1))\n"
    "(let v (Var x [1] 0 1))\n(let rs (Rsqrt (Add v (Scalar 1e-05 f32))))\n(output r m rs)",
    # sibling reductions in one kernel (horizontal.py), each with its accumulator: a
    # batch norm's backward over a permuted domain (a block per channel, over finite
    # values: 1152 of the inputs' special values would sum to NaN in every channel), a
    # norm's weight and bias gradients (columns), three maxima by warps (NaN through each),
    # means cast to float16 by an epilogue, rows of a thread each
    "siblings_batch_norm": "(input i f32 [4 3 16 18])\n(input j f32 [4 3 16 18])\n"
    "(input m f32 [1 3 1 1])\n(let z (Expand (Scalar 0.0 f32) [4 3 16 18]))\n"
    "(let x (Where (Eq i i) (Tanh i) z))\n(let g (Where (Eq j j) (Tanh j) z))\n"
    "(let db (Sum g [0 2 3] 0))\n(let dw (Sum (Mul g (Sub x m)) [0 2 3] 0))\n(output db dw)",
    "siblings_columns": "(input g f32 [6 70])\n(input xh f32 [6 70])\n"
    "(let dw (Sum (Mul g xh) [0] 0))\n(let db (Sum g [0] 0))\n(output dw db)",
    "siblings_max_three": "(input x f32 [5 40])\n(input y f32 [5 40])\n"
    "(let a (Amax x [1] 0))\n(let b (Amax (Mul x y) [1] 0))\n(let c (Amax (Neg x) [1] 0))\n"
    "(output a b c)",
    "siblings_mean_cast": "(input x f32 [9 40])\n(input y f32 [9 40])\n"
    "(let a (Cast (Mean x [0] 0) f16))\n(let b (Cast (Mean (Mul x y) [0] 0) f16))\n(output a b)",
    "siblings_row_thread": "(input x f32 [7 8])\n(input y f32 [7 8])\n"
    "(let a (Sum x [1] 1))\n(let b (Sum (Mul x y) [1] 1))\n(output a b)",
    # small loops run by one launch (horizontal.py's group_loops), each over its own
    # domain: updates in three dtypes, a comparison stored as bytes, a cast to float16
    "group_loops": "(input p f32 [3 5])\n(input g f32 [3 5])\n(input q f32 [7])\n"
    "(input h f32 [7])\n(input r f64 [2 3 4])\n(input e f64 [2 3 4])\n"
    "(let a (Sub p (Mul g (Scalar 0.1 f32))))\n(let b (Sub q (Mul h (Scalar 0.1 f32))))\n"
    "(let c (Sub r (Mul e (Scalar 0.1 f64))))\n(let d (Gt q h))\n"
    "(let f (Cast (Mul p g) f16))\n(output a b c d f)",
    # statistics of other types, from a stage by the loops that read it (a row max's NaN
    # test, as bool and as int32); a loop that also reads another value stays one
    "rows_stats_bool_int": "(input x f32 [6 40])\n(input e f32 [6 1])\n"
    "(let m (Amax x [1] 1))\n(let r (Exp (Sub x m)))\n(let z (Ne m m))\n(let q (Mul m e))\n"
    "(let c (Cast (Eq m (Scalar inf f32)) i32))\n(output r z q c)",
    # by blocks, over finite values (a row of 1100 of the inputs' special values would
    # hold a NaN, and so would every statistic)
    "rows_block_layer_norm_stats": "(input i f32 [2 1100])\n(param w f32 [1100])\n"
    "(param b f32 [1100])\n"
    "(let x (Where (Eq i i) (Tanh i) (Expand (Scalar 0.0 f32) [2 1100])))\n"
    "(let r (LayerNorm x w b [1] 1e-05))\n(let m (Mean x [1] 1))\n"
    "(let v (Var x [1] 0 1))\n(let rs (Rsqrt (Add v (Scalar 1e-05 f32))))\n(output r m rs)",
    "rows_softmax_f64": "(input x f64 [2 3 45])\n(let r (Softmax x 2))\n(output r)",
    "rows_log_softmax": "(input x f32 [5 64])\n(let r (LogSoftmax x 1))\n(output r)",
    # vector rows (4 lanes): a bias read per lane next to packed rows, rows of 3 steps
    # a block per row (rows of 1024 and more): partial results through shared memory
    "rows_block_softmax": "(input x f32 [3 1100])\n(let r (Softmax x 1))\n(output r)",
    "rows_block_layer_norm_f64": "(input x f64 [2 1030])\n(param w f64 [1030])\n"
    "(param b f64 [1030])\n(let r (LayerNorm x w b [1] 1e-05))\n(output r)",
    "rows_layer_norm_vector": "(input x f32 [3 2 136])\n(param w f32 [136])\n"
    "(param b f32 [136])\n(let r (LayerNorm x w b [2] 1e-05))\n(output r)",
    # two row operands (an embedding block's sum), one of them strided, both kept
    "rows_add_layer_norm": "(input x f32 [4 90])\n(input y f32 [90 4])\n(param w f32 [90])\n"
    "(param b f32 [90])\n(let r (LayerNorm (Add x (Permute y [1 0])) w b [1] 1e-05))\n"
    "(output r)",
    # an attention mask's per-query column [S, 1] and a per-row bias [B, H, S, 1]: values
    # constant along each row, read once per row (``_row_constant``)
    "rows_row_constant_softmax": "(input x f32 [2 3 5 40])\n(input m f32 [5 1])\n"
    "(input l f32 [2 3 5 1])\n(let r (Softmax (Add (Add x m) l) 3))\n(output r)",
    # an embedding block's sum: position rows repeated over the batch (trailing rows)
    "rows_add_position_layer_norm": "(input x f32 [3 4 72])\n(input p f32 [4 72])\n"
    "(param w f32 [72])\n(param b f32 [72])\n"
    "(let r (LayerNorm (Add x p) w b [2] 1e-05))\n(output r)",
    # log1p of |x| (Python's math.log1p, which the simulator runs, raises below -1),
    # expm1 and atan2 with NaN, infinities and both zeros
    # sin and cos (of tanh: Python's math.sin, which the simulator runs, raises for inf)
    "sin_cos": "(input a f32 [37])\n(let t (Tanh a))\n"
    "(let r (Sin t))\n(let s (Cos t))\n(output r)\n(output s)",
    "log1p_expm1_atan2": "(input a f32 [37])\n(input b f32 [37])\n"
    "(let r (Add (Log1p (Abs a)) (Atan2 (Expm1 b) a)))\n(output r)",
    "rounding": "(input x f32 [41])\n(input y f64 [41])\n(let r (Add (Add (Floor x) "
    "(Ceil x)) (Add (Trunc x) (Round x))))\n(let s (Round (Mul y (Scalar 2.5 f64))))\n"
    "(output r)\n(output s)",
    "division": "(input a f32 [43])\n(input b f32 [43])\n(let r (Add (Fmod a b) "
    "(Mul (Remainder a b) (FloorDiv a b))))\n(output r)",
    # integers by constant divisors (floored: negative dividends give a remainder in [0, b))
    "integer_division": "(input a i64 [43])\n(input c i32 [43])\n"
    "(let r (Add (Remainder a (Scalar 4 i64)) (FloorDiv a (Scalar 3 i64))))\n"
    "(let s (Add (FloorDiv c (Scalar 2 i32)) (Remainder c (Scalar 7 i32))))\n"
    "(output r)\n(output s)",
    # nearest upsampling by 2 and 3 as the importer writes it: split, expand, merge
    "repeat_upsample": "(input x f32 [2 3 4])\n(let v (View x [2 3 1 4 1]))\n"
    "(let e (Expand v [2 3 2 4 3]))\n(let u (View e [2 6 12]))\n"
    "(let r (Mul u (Scalar 2.0 f32)))\n(output r)",
    # cat([a, b], 1) as the importer writes it: pieces widened by a broadcast, selected
    "cat_pieces": "(input a f32 [4 6])\n(input b f32 [4 6])\n"
    "(let pa (Expand (View a [4 1 6]) [4 2 6]))\n(let pb (Expand (View b [4 1 6]) [4 2 6]))\n"
    "(let i (View (Arange 0 1 2 i64) [1 2 1]))\n"
    "(let w (Where (Eq i (Scalar 0 i64)) pa pb))\n(let r (Mul (View w [4 12]) (Scalar 2.0 f32)))\n"
    "(output r)",
    # a layer norm without affine (weight 1, bias -0.0 scalars) and a group norm's grouping
    "rows_layer_norm_no_affine": "(input x f32 [6 70])\n"
    "(let r (LayerNorm x (Scalar 1.0 f32) (Scalar -0.0 f32) [1] 1e-05))\n(output r)",
    "group_norm": "(input x f32 [2 6 20])\n(param w f32 [6 1])\n(param b f32 [6 1])\n"
    "(let g (View x [2 3 40]))\n"
    "(let n (LayerNorm g (Scalar 1.0 f32) (Scalar -0.0 f32) [2] 1e-05))\n"
    "(let r (Add (Mul (View n [2 6 20]) w) b))\n(output r)",
    # argmax as the importer writes it: the first index of the max, or of the first NaN
    "argmax_rows": "(input x f32 [5 9])\n(let m (Amax x [1] 1))\n"
    "(let h (Where (Eq x m) (Expand (Scalar 1 bool) [5 9]) (Ne x x)))\n"
    "(let i (View (Arange 0 1 9 i64) [1 9]))\n(let j (Where h i (Scalar 9 i64)))\n"
    "(let r (Amin j [1] 0))\n(output r)",
    # a reduction over axes 0 and 2: the importer's permuted view, reduced over its tail
    "reduce_permuted_tail": "(input x f32 [4 6 5])\n"
    "(let r (Sum (Permute x [1 0 2]) [1 2] 0))\n(output r)",
}


def rand(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("i32", "i64"):
        return rng.integers(-9, 9, size=shape).astype(ev.np_dtype(dtype))
    x = rng.standard_normal(shape) + 0.1
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])
    x = np.where(rng.random(shape) < 0.08, rng.choice(special, size=shape), x)
    return x.astype(ev.np_dtype(dtype))


def run_kernel(step, arrays, narrow: bool = False, err: np.ndarray | None = None):
    k = step.kernel
    shapes = [a.shape for a in arrays]
    strides = [tuple(s // a.itemsize for s in a.strides) for a in arrays]
    lanes = cg.generate(k).lanes  # as the launcher chooses: vectors where the strides allow
    strided = any(o.indexing == "strided" for o in k.inputs)
    if k.kind == "loop" and strided and not cg.strided_vectors_fit(k, lanes, shapes, strides):
        lanes = 1
    g = cg.generate(k, lanes=lanes, narrow=narrow)
    fn = cuda.jit(cg.python_function(g))
    sizes = cg.size_args(g, k, shapes, strides)
    # few blocks for loops (sm_count 1/8): threads stride through vectors and the tail
    blocks, threads = cg.grid_for(g, sizes, sm_count=0.125)
    out = _poisoned(step)
    flats = []
    for a in arrays:
        # the kernel sees the operand's memory from its first element, with its strides
        # (a copy of the span: the simulator writes operands back, and a broadcast
        # constant's view is read-only)
        flats.append(np.ascontiguousarray(a).reshape(-1) if not _strided(a) else base_of(a).copy())
    if "err" in g.params.pointers:  # a fused take's error word
        flats.append(err if err is not None else np.zeros(1, dtype=np.int32))

    def size(j: int) -> int:  # values written beside the output (kinds/row_stat.py)
        if k.kind == "rows":  # a statistic per row
            return sizes["outer"]
        if "segments" in k.attrs:  # a loop group's other loops, each over its segment
            return math.prod(k.attrs["segments"][j])
        return math.prod(step.shape)  # a reduction's siblings

    stats = [  # poisoned
        np.full(size(j), np.nan if t in ("f32", "f64") else 7, dtype=ev.np_dtype(t))
        for j, (_, t) in enumerate(k.attrs.get("stats", ()))
    ]
    fn[blocks, threads](out, *flats, *stats, *[sizes[n] for n in g.params.ints])
    WRITTEN[step.output] = stats
    return out.reshape(step.shape)


WRITTEN: dict[str, list] = {}  # rows step -> the statistics its last run wrote


def run_split(step, arrays, chunks: int = 3, narrow: bool = False):
    """A reduction through the split kernels (partials per chunk, then the fold), with
    ``chunks`` chunks of the reduced axis whatever its length (the launcher splits only
    long axes of narrow reductions)."""
    k = step.kernel
    outer, red, inner = cg.reduce_layout(k)
    chunk = max(1, math.ceil(red / chunks))
    chunks = max(1, math.ceil(red / chunk))
    part, fold = cg.generate_split(k, narrow)
    shapes = [a.shape for a in arrays]
    strides = [tuple(s // a.itemsize for s in a.strides) for a in arrays]
    sizes = cg.size_args(part, k, shapes, strides)
    sizes["chunk"] = chunk
    outputs = outer * inner
    acc = np.dtype(part.pointer_types[0])
    siblings = len(k.attrs.get("stats", ()))  # their partials after the output's
    ws = np.full(max((1 + siblings) * chunks * outputs, 1), 7, dtype=acc)  # poisoned
    flats = [
        np.ascontiguousarray(a).reshape(-1) if not _strided(a) else base_of(a).copy()
        for a in arrays
    ]
    tiles = outer if inner == 1 else math.ceil(outputs / 32)
    cuda.jit(cg.python_function(part))[(max(tiles, 1), chunks), cg.THREADS](
        ws, *flats, *[sizes[n] for n in part.params.ints]
    )
    out = _poisoned(step)
    stats = [
        np.full(outputs, np.nan if t in ("f32", "f64") else 7, dtype=ev.np_dtype(t))
        for _, t in k.attrs.get("stats", ())
    ]
    cuda.jit(cg.python_function(fold))[max(1, math.ceil(outputs / 32)), cg.THREADS](
        out, ws, *stats, outputs, chunks, red
    )
    WRITTEN[step.output] = stats
    return out.reshape(step.shape)


def _poisoned(step) -> np.ndarray:
    """The output's memory, filled with a value no kernel writes by accident (NaN for
    floats; bfloat16 is held as its 16-bit patterns, which numpy has no type for)."""
    n = max(math.prod(step.shape), 1)
    if step.dtype == "bf16":
        return np.full(n, 0x7FC1, dtype=np.uint16)  # a NaN no rounding produces
    nan = step.dtype in ("f16", "f32", "f64")
    return np.full(n, np.nan if nan else 7, dtype=ev.np_dtype(step.dtype))


def _strided(a) -> bool:
    return not a.flags.c_contiguous


def base_of(a: np.ndarray) -> np.ndarray:
    span = sum((s - 1) * st for s, st in zip(a.shape, a.strides, strict=True)) // a.itemsize + 1
    return np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,))


def run_copies() -> int:
    """The strided copy kernels (flat and tiled transpose) on permuted arrays."""
    rng = np.random.default_rng(1)
    failures = 0
    cases = [
        ((40, 37), (1, 0), np.float32),
        ((3, 33, 35), (2, 0, 1), np.complex128),
        ((5, 34, 6), (0, 2, 1), np.uint8),
        ((4, 6, 5), (1, 0, 2), np.int64),
        ((2, 5, 3, 8), (0, 2, 1, 3), np.float32),  # a head permute: contiguous rows
        ((3, 4, 6), (1, 0, 2), np.int64),  # rows of 2-element vectors
        ((2, 5, 3, 8), (0, 2, 1, 3), np.float16),  # a half head permute: 4-element vectors
        # expanded (a stride-0 axis inserted at ``axis``, ``reps`` long), with the kind the
        # copy must take: grouped-query attention's keys, [B, H, 1, L, D] -> [B, H, R, L, D],
        # are rows (a broadcast axis is never the fastest), a transposed source still tiles
        ((2, 5, 3, 8), (0, 2, 1, 3), np.float16, (2, 4), "rows"),
        ((2, 5, 3, 8), (0, 2, 1, 3), np.float32, (2, 3), "rows"),
        ((3, 33, 35), (0, 2, 1), np.float32, (1, 3), "tiled"),
        ((4, 6, 5), (0, 1, 2), np.int64, (2, 3), "flat"),  # rows of 5: no whole vectors
        ((4, 6, 4), (0, 1, 2), np.int64, (2, 3), "rows"),
    ]
    for case, narrow in itertools.product(cases, (False, True)):
        shape, perm, dtype = case[:3]
        base = (rng.standard_normal(shape) * 50).astype(dtype)
        view = np.transpose(base, perm)
        want_kind = None
        if len(case) > 3:
            (axis, reps), want_kind = case[3], case[4]
            view = np.expand_dims(view, axis)
            view = np.broadcast_to(view, (*view.shape[:axis], reps, *view.shape[axis + 1 :]))
        width = view.itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[width]
        src = base.reshape(-1).view(word)
        out = np.zeros(view.size * (2 if width == 16 else 1), dtype=word)
        strides = [st // width for st in view.strides]
        a = cg.fastest_axis(view.shape, strides)
        if cg.row_copy_fits(width, view.shape, strides, (0, 0)):
            g = cg.generate_row_copy(width, view.ndim, narrow)
            fn = cuda.jit(cg.python_function(g))
            nv = view.size // g.lanes
            fn[2, cg.THREADS // 4](out, src, nv, *view.shape, *strides)
            kind = "rows"
        elif a != view.ndim - 1:
            if narrow:  # the tiled copy divides once per block: it has no narrow form
                continue
            g = cg.generate_tiled_copy(width, view.ndim, a)
            fn = cuda.jit(cg.python_function(g))
            fn[cg.tiled_grid(view.shape, a), cg.THREADS](out, src, *view.shape, *strides)
            kind = "tiled"
        else:
            g = cg.generate_copy(width, view.ndim, narrow)
            fn = cuda.jit(cg.python_function(g))
            fn[1, cg.THREADS](out, src, view.size, *view.shape, *strides)
            kind = "flat"
        got = out.view(dtype).reshape(view.shape)
        ok = np.array_equal(got, np.ascontiguousarray(view))
        ok = ok and want_kind in (None, kind)
        how = " narrow" if narrow else ""
        grown = f" expanded {case[3]}" if len(case) > 3 else ""
        print(
            f"{'ok' if ok else 'FAIL'} copy {kind}{how} {shape} {perm}{grown} "
            f"{np.dtype(dtype).name}"
        )
        failures += not ok
    # expanded scalars: a fill, vectors then a tail, or element by element (no vectors:
    # an unaligned output, bytes, 16-byte elements)
    for dtype, n, vectors in itertools.product(
        (np.float32, np.float16, np.int64, np.uint8, np.complex128), (37, 64), (True, False)
    ):
        width = np.dtype(dtype).itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[width]
        value = np.array([-3.5 + 2j if dtype == np.complex128 else 7], dtype=dtype)
        g = cg.generate_fill(width)
        out = np.zeros(n * (2 if width == 16 else 1), dtype=word)
        nv = cg.fill_vectors(width, n, 0 if vectors else 8)
        cuda.jit(cg.python_function(g))[2, cg.THREADS // 4](out, value.view(word), nv, n)
        ok = np.array_equal(out.view(dtype), np.full(n, value[0], dtype=dtype))
        ok = ok and cg.broadcast_of_one((n, 3), (0, 0)) and not cg.broadcast_of_one((2,), (1,))
        print(f"{'ok' if ok else 'FAIL'} fill {np.dtype(dtype).name} {n} nv={nv}")
        failures += not ok
    return failures


def _half_inputs(dtype: str, n: int, rng) -> np.ndarray:
    """float32 values for a half-precision case: ordinary ones, exact ties of bfloat16's
    rounding (1 + 2^-8: down to even; 1 + 3 * 2^-8: up to even), values past each type's
    largest finite one, subnormals, both zeros, infinities and NaN."""
    specials = [
        1 + 2**-8,
        1 + 3 * 2**-8,
        -(1 + 2**-8),
        3.4e38,
        -3.4e38,
        70000.0,
        1e-40,
        2**-25,
        -0.0,
        0.0,
        np.inf,
        -np.inf,
        np.nan,
    ]
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[: len(specials)] = np.array(specials, dtype=np.float32)
    return x


def run_halves() -> int:
    """Loops that keep float16 and bfloat16 in memory (``Kernel``s as the eager path builds
    them): conversions both ways, arithmetic in float32 with one rounding at the store, a
    strided half source. PyTorch's own conversions are the reference, compared bit for bit
    (NaN as NaN)."""
    import warnings

    import torch

    from saturn.eqsat.program import Kernel, Operand, Step

    # float16 rounding to infinity warns in numpy (each simulated thread: errstate is local)
    warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)

    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    rng = np.random.default_rng(1)
    failures = 0

    def to_memory(x: torch.Tensor, dtype: str) -> np.ndarray:
        t = x.to(torch_dtype[dtype]).contiguous()
        if dtype == "bf16":
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()

    def from_memory(a: np.ndarray, dtype: str) -> torch.Tensor:
        if dtype == "bf16":
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())

    def launch(k: Kernel, arrays: list[np.ndarray], shapes, strides, lanes=None) -> np.ndarray:
        g = cg.generate(k, lanes=lanes)
        fn = cuda.jit(cg.python_function(g))
        sizes = cg.size_args(g, k, shapes, strides)
        blocks, threads = cg.grid_for(g, sizes, sm_count=0.125)
        n = math.prod(k.domain)
        out = np.zeros(n, dtype=np.uint16 if k.dtype == "bf16" else ev.np_dtype(k.dtype))
        flat = [a.reshape(-1) for a in arrays]  # the kernel indexes memory from the first element
        fn[blocks, threads](out, *flat, *[sizes[p] for p in g.params.ints])
        return out

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        nonlocal failures
        same = torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(
            got[~torch.isnan(got)], want[~torch.isnan(want)]
        )
        if got.dtype.is_floating_point:  # zeros' signs too
            keep = ~torch.isnan(want)
            same = same and torch.equal(torch.signbit(got[keep]), torch.signbit(want[keep]))
        print(f"{'ok' if same else 'FAIL'} half {name}")
        failures += not same

    n = 302  # 75 vector steps of 4 and a tail of 2
    x32 = torch.from_numpy(_half_inputs("bf16", n, rng))
    for src, dst in (
        ("f32", "bf16"),
        ("f32", "f16"),
        ("bf16", "f32"),
        ("f16", "f32"),
        ("bf16", "f16"),
        ("f16", "bf16"),
    ):
        x = x32.to(torch_dtype[src])
        k = Kernel(
            "loop",
            "out",
            dst,
            (n,),
            [Operand("in0", src, (n,), "same")],
            body=("in", 0),
            domain=(n,),
        )
        for lanes in (None, 1):  # vector accesses (as launched when aligned), and scalar
            got = from_memory(launch(k, [to_memory(x, src)], [(n,)], [(1,)], lanes), dst)
            how = " scalar" if lanes else ""
            check(f"{src} -> {dst}{how}", got, x.to(torch_dtype[dst]))
    for dtype in ("bf16", "f16"):
        # a + s * b with a float32 number: computed in float32, rounded once (PyTorch's
        # GPU kernels' opmath)
        a, b = x32.to(torch_dtype[dtype]), x32.flip(0).to(torch_dtype[dtype])
        s = np.float32(-0.3)
        k = Kernel(
            "loop",
            "out",
            dtype,
            (n,),
            [
                Operand("in0", dtype, (n,), "same"),
                Operand("in1", dtype, (n,), "same"),
                Operand("in2", "f32", (), "scalar"),
            ],
            body=("add", ("in", 0), ("mul", ("in", 2), ("in", 1))),
            domain=(n,),
        )
        arrays = [to_memory(a, dtype), to_memory(b, dtype), np.array([s], np.float32)]
        got = from_memory(launch(k, arrays, [(n,), (n,), ()], [(1,), (1,), ()]), dtype)
        want = (a.float() + torch.tensor(s) * b.float()).to(torch_dtype[dtype])
        check(f"{dtype} a + s * b", got, want)
        # per-channel and per-image operands under 8-lane steps that straddle runs of 12
        # (read at the run and the next) and of 4 (each lane its own), rounded once
        for plane in (12, 4):
            x = torch.from_numpy(_half_inputs(dtype, 2 * 5 * plane, rng)).to(torch_dtype[dtype])
            x = x.reshape(2, 5, plane)
            c = torch.linspace(-2, 2, 5).to(torch_dtype[dtype]).reshape(5, 1)
            lead = torch.tensor([0.5, -3.0]).reshape(2, 1, 1)
            k = Kernel(
                "loop",
                "out",
                dtype,
                (2, 5, plane),
                [
                    Operand("in0", dtype, (2, 5, plane), "same"),
                    Operand("in1", dtype, (5, 1), "middle"),
                    Operand("in2", "f32", (2, 1, 1), "leading"),
                ],
                body=("add", ("mul", ("in", 0), ("in", 1)), ("in", 2)),
                domain=(2, 5, plane),
            )
            arrays = [to_memory(x, dtype), to_memory(c, dtype), lead.numpy()]
            shapes = [(2, 5, plane), (5, 1), (2, 1, 1)]
            strides = [(5 * plane, plane, 1), (1, 1), (1, 1, 1)]
            got = from_memory(launch(k, arrays, shapes, strides), dtype).reshape(2, 5, plane)
            want = (x.float() * c.float() + lead).to(torch_dtype[dtype])
            check(f"{dtype} channel runs of {plane} (8 lanes)", got, want)
        # a transposed half source into a packed float32 result, through a cast to bool
        m = torch.from_numpy(_half_inputs(dtype, 48, rng)).to(torch_dtype[dtype])
        base = m.reshape(6, 8)
        view = base.t()  # (8, 6), strides (1, 8)
        k = Kernel(
            "loop",
            "out",
            "f32",
            (8, 6),
            [Operand("in0", dtype, (8, 6), "strided")],
            body=("in", 0),
            domain=(8, 6),
        )
        got = from_memory(launch(k, [to_memory(base, dtype)], [(8, 6)], [(1, 8)], 1), "f32")
        check(f"{dtype} transposed -> f32", got.reshape(8, 6), view.float())
        k = Kernel(
            "loop",
            "out",
            "bool",
            (48,),
            [Operand("in0", dtype, (48,), "same")],
            body=("cast", ("in", 0), "bool"),
            domain=(48,),
        )
        got = torch.from_numpy(launch(k, [to_memory(m, dtype)], [(48,)], [(1,)]).astype(bool))
        check(f"{dtype} -> bool", got, m.to(torch.bool))
        # a cast to the half type inside a float32 body rounds there (then exp of it)
        k = Kernel(
            "loop",
            "out",
            "f32",
            (n,),
            [Operand("in0", "f32", (n,), "same")],
            body=("mul", ("cast", ("in", 0), dtype), ("const", 4611686018427387904, "f32")),
            domain=(n,),
        )
        got = from_memory(launch(k, [x32.numpy()], [(n,)], [(1,)]), "f32")
        check(f"cast to {dtype} in a body", got, x32.to(torch_dtype[dtype]).float() * 2.0)
        # a half operand summed into float32 (rows and columns, whole and split): each
        # element read exactly into float32, so the sums equal float64's rounded (small
        # integers times 2 add exactly in float32)
        ints = torch.from_numpy(rng.integers(-8, 9, (6, 50)).astype(np.float32))
        h = ints.to(torch_dtype[dtype])
        for axis in (1, 0):
            k = Kernel(
                "reduce",
                "out",
                "f32",
                (6,) if axis == 1 else (50,),
                [Operand("in0", dtype, (6, 50), "same")],
                body=("mul", ("cast", ("in", 0), "f32"), ("const", 4611686018427387904, "f32")),
                domain=(6, 50),
                attrs={"reduce": "sum", "dims": (axis,), "keepdim": 0},
            )
            step = Step("kernel", "out", dtype="f32", shape=k.shape, kernel=k)
            want = (ints * 2).sum(axis)
            got = run_kernel(step, [to_memory(h, dtype).reshape(6, 50)])
            check(f"{dtype} sum over axis {axis} -> f32", torch.from_numpy(got), want)
            got = run_split(step, [to_memory(h, dtype).reshape(6, 50)])
            check(f"{dtype} split sum over axis {axis} -> f32", torch.from_numpy(got), want)
        # half reductions as compiled (sum-half etc.): float32 accumulation, the result
        # rounded once to the half type by the epilogue at the store; values chosen so the
        # float32 sums are exact (order-free), NaN through max
        from saturn.eqsat.graph import parse_graph
        from saturn.eqsat.pipeline import compile_graph

        vals = ints.clone()
        vals[2, 7] = float("nan")
        vals[4, 11] = 3.0e38 if dtype == "bf16" else 6.0e4  # near the type's largest
        hv = vals.to(torch_dtype[dtype])
        refs = {
            "Sum": lambda t, a: t.float().sum(a),
            "Mean": lambda t, a: t.float().mean(a),
            "Amax": lambda t, a: t.float().amax(a),
        }
        for (op, ref), axis in itertools.product(refs.items(), (1, 0)):
            text = f"(input x {dtype} [6 50])\n(let r ({op} x [{axis}] 0))\n(output r)\n"
            prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
            (k,) = prog.kernels
            step = Step("kernel", "out", dtype=dtype, shape=k.shape, kernel=k)
            want = ref(hv, axis).to(torch_dtype[dtype])
            # split: the column case (a row split runs 256 simulated threads per chunk;
            # the float32-result cases above cover it)
            for split in (False, True) if axis == 0 else (False,):
                arrays = [to_memory(hv, dtype).reshape(6, 50)]
                out = (run_split if split else run_kernel)(step, arrays)
                how = " split" if split else ""
                check(f"{dtype} {op}{how} over axis {axis}", from_memory(out, dtype), want)
        # half softmax, log_softmax and layer norm as compiled: rows kernels reading the
        # half input into float32 stages, the result rounded once (vector steps over rows
        # of 40; scalar steps over rows of 37 and a block per row of 300, on two rows: the
        # simulator runs a Python thread per GPU thread); within one unit of the half
        # type's rounding of PyTorch's float32 computation (exp and rsqrt differ in
        # float32's last bits)
        tol = {"bf16": 2.0**-7, "f16": 2.0**-10}[dtype]
        refs = {
            "(Softmax x 1)": lambda t, w, b: torch.softmax(t.float(), -1),
            "(LogSoftmax x 1)": lambda t, w, b: torch.log_softmax(t.float(), -1),
            "(LayerNorm x w b [1] 1e-05)": lambda t, w, b: torch.nn.functional.layer_norm(
                t.float(), (t.shape[-1],), w.float(), b.float(), 1e-5
            ),
        }
        cases = [(op, 6, 40) for op in refs] + [
            ("(LayerNorm x w b [1] 1e-05)", 2, 37),
            ("(Softmax x 1)", 2, 300),
        ]
        for op, rows, cols in cases:
            ref = refs[op]
            text = (
                f"(input x {dtype} [{rows} {cols}])\n(input w {dtype} [{cols}])\n"
                f"(input b {dtype} [{cols}])\n(let r {op})\n(output r)\n"
            )
            prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
            (k,) = prog.kernels
            assert k.kind == "rows", k
            xv = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32) * 3)
            wv = torch.from_numpy(rng.standard_normal(cols).astype(np.float32))
            bv = torch.from_numpy(rng.standard_normal(cols).astype(np.float32))
            hx, hw, hb = (t.to(torch_dtype[dtype]) for t in (xv, wv, bv))
            by_name = {"x": hx, "w": hw, "b": hb}
            order = {s.output: s.op for s in prog.steps if s.kind == "input"}
            arrays = [to_memory(by_name[order[o.value]], dtype) for o in k.inputs]
            step = Step("kernel", "out", dtype=dtype, shape=k.shape, kernel=k)
            got = from_memory(run_kernel(step, arrays), dtype).float()
            want = ref(hx, hw, hb)
            ok = torch.allclose(got, want, rtol=tol, atol=tol)
            print(f"{'ok' if ok else 'FAIL'} half {dtype} rows {op} x {cols}")
            failures += not ok
        # a half table's rows taken inside the layer norm (fuse_row_takes): vector reads
        # (rows of 40) and scalar ones (37), an id out of range on the last row
        for cols in (40, 37):
            text = (
                f"(input t {dtype} [9 {cols}])\n(input ids i64 [5])\n(input w {dtype} [{cols}])\n"
                f"(input b {dtype} [{cols}])\n(let r (LayerNorm (Take t ids) w b [1] 1e-05))\n"
                "(output r)\n"
            )
            prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
            (k,) = prog.kernels
            assert k.kind == "rows" and "take" in k.attrs, k
            tv = torch.from_numpy(rng.standard_normal((9, cols)).astype(np.float32) * 3)
            wv = torch.from_numpy(rng.standard_normal(cols).astype(np.float32))
            bv = torch.from_numpy(rng.standard_normal(cols).astype(np.float32))
            ht, hw, hb = (t.to(torch_dtype[dtype]) for t in (tv, wv, bv))
            ids = np.array([3, 0, 8, 3, 9], dtype=np.int64)  # 9: past the table
            by_name = {"t": to_memory(ht, dtype), "ids": ids}
            by_name |= {"w": to_memory(hw, dtype), "b": to_memory(hb, dtype)}
            order = {s.output: s.op for s in prog.steps if s.kind == "input"}
            arrays = [by_name[order[o.value]] for o in k.inputs]
            step = Step("kernel", "out", dtype=dtype, shape=k.shape, kernel=k)
            err = np.zeros(1, dtype=np.int32)
            got = from_memory(run_kernel(step, arrays, err=err), dtype).float()
            want = torch.nn.functional.layer_norm(
                ht[torch.from_numpy(ids[:4])].float(), (cols,), hw.float(), hb.float(), 1e-5
            )
            ok = err[0] == 1 and torch.allclose(got[:4], want, rtol=tol, atol=tol)
            print(f"{'ok' if ok else 'FAIL'} half {dtype} rows of a take x {cols}")
            failures += not ok
    return failures


def run_takes() -> int:
    """Row takes: tables of each element width, strided (transposed) tables and indices,
    int32 and int64 indices of ranks 0 to 2, scalar and 16-byte vector variants, against
    numpy's take; then indices out of range on both sides, which must set the error word
    and write zero rows (the simulator itself raises on a read past the table's end)."""
    rng = np.random.default_rng(2)
    failures = 0
    cases = [  # dtype, table shape, transposed, index dtype, index shape, lanes
        (np.float32, (7, 5), False, np.int64, (3, 4), 1),
        (np.float32, (7, 8), False, np.int32, (3,), 4),
        (np.float64, (6, 3), True, np.int32, (5,), 1),
        (np.float16, (5, 16), False, np.int64, (2, 2), 8),
        (np.uint8, (9, 4), False, np.int64, (), 1),
        (np.int16, (4, 6), True, np.int64, (2, 3), 1),
        (np.float32, (60, 1), False, np.int64, (6,), 1),  # elements (a gather, 0047)
    ]
    for dtype, tshape, transposed, itype, ishape, lanes in cases:
        base = (rng.standard_normal(tshape[::-1] if transposed else tshape) * 50).astype(dtype)
        table = base.T if transposed else base
        # a strided index: every other element of a wider array
        index = rng.integers(0, tshape[0], size=(*ishape, 2)).astype(itype)[..., 0]
        width = table.itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        ts = [st // width for st in table.strides]
        ist = [st // index.itemsize for st in index.strides]
        assert cg.take_lanes(width, (tshape, tuple(ts)), (0, 0)) == lanes
        g = cg.generate_take(width, {np.int32: "i32", np.int64: "i64"}[itype], index.ndim, lanes)
        fn = cuda.jit(cg.python_function(g))
        out = np.zeros(index.size * tshape[1], dtype=word)
        err = np.zeros(1, dtype=np.int32)
        flat_index = base_of(index).copy() if index.ndim else index.reshape(1).copy()
        blocks, threads = cg.take_geometry(index.size, tshape[1], lanes, sm_count=1)
        fn[min(blocks, 3), threads](
            out, base.reshape(-1).view(word), flat_index, err,
            index.size, tshape[1], tshape[0], *ts, *index.shape, *ist,
        )  # fmt: skip
        got = out.view(dtype).reshape(*index.shape, tshape[1])
        ok = np.array_equal(got, table[index]) and err[0] == 0
        print(f"{'ok' if ok else 'FAIL'} take {np.dtype(dtype).name} {tshape} t={transposed} "
              f"{np.dtype(itype).name}{list(ishape)} lanes={lanes}")  # fmt: skip
        failures += not ok
    # out of range: -1 and rows, next to valid ones (a table of 2 rows of 4 columns)
    for lanes in (1, 4):
        g = cg.generate_take(4, "i64", 1, lanes)
        fn = cuda.jit(cg.python_function(g))
        table = np.arange(8, dtype=np.float32)
        index = np.array([1, -1, 2, 0], dtype=np.int64)
        out = np.full(16, 5.0, dtype=np.float32)
        err = np.zeros(1, dtype=np.int32)
        fn[2, 32](out.view(np.uint32), table.view(np.uint32), index, err, 4, 4, 2, 4, 1, 4, 1)
        want = np.array([4, 5, 6, 7] + [0] * 8 + [0, 1, 2, 3], dtype=np.float32)
        ok = err[0] == 1 and np.array_equal(out, want)
        print(f"{'ok' if ok else 'FAIL'} take out of range (lanes={lanes}): word set, zeros")
        failures += not ok
    return failures


FUSED_TAKES = {  # a rows kernel reading a take's rows itself (fuse_row_takes)
    # an embedding block: token rows plus position rows, then layer norm (4 lanes)
    "embed_layer_norm": "(input t f32 [11 72])\n(input ids i64 [3 4])\n(input p f32 [4 72])\n"
    "(param w f32 [72])\n(param b f32 [72])\n"
    "(let r (LayerNorm (Add (Take t ids) p) w b [2] 1e-05))\n(output r)",
    # a softmax of taken rows of 70 (scalar reads), int32 ids; float64, a block per row
    "take_softmax": "(input t f32 [9 70])\n(input ids i32 [6])\n"
    "(let r (Softmax (Take t ids) 1))\n(output r)",
    "take_softmax_f64": "(input t f64 [5 1030])\n(input ids i64 [2])\n"
    "(let r (Softmax (Take t ids) 1))\n(output r)",
}


def run_fused_takes() -> int:
    """Rows kernels with a fused take, in every rows form (as compiled, kept, by warps,
    re-read): each program is one rows kernel, equal to numpy's take then the rows
    function; then ids out of range (-1 and rows): the error word is set and the other
    rows are still right."""
    rng = np.random.default_rng(5)
    failures = 0
    forms = {"": (4096, 64, 8192), " (kept)": (4096, 64, 0), " (warps)": (0, 64, 0)}
    forms[" (re-read)"] = (0, 0, 0)
    for name, text in FUSED_TAKES.items():
        graph = parse_graph(text + "\n", name)
        prog = compile_graph(graph, machine="gpu", io_on_device=True).program
        steps = [s for s in prog.steps if s.kind == "kernel"]
        if len(steps) != 1 or "take" not in steps[0].kernel.attrs:
            print(f"FAIL fused take {name}: kernels {[s.kernel.kind for s in steps]}")
            failures += 1
            continue
        (step,) = steps
        rows = next(n.shape[0] for n in graph.inputs() if n.name == "t")
        inputs = {n.name: rand(rng, n.shape, n.dtype) for n in graph.inputs()}
        ids = inputs["ids"]
        ids[...] = rng.integers(0, rows, size=ids.shape)
        want = ev.eval_graph(graph, inputs)[0]
        by_input = {v: k for k, v in prog.inputs.items()}
        for tag, (warp_min, registers, cache_bytes) in forms.items():
            cuda_rows.ROWS_WARP_MIN, cuda_rows.ROW_REGISTERS, cuda_rows.ROW_CACHE_BYTES = (
                warp_min,
                registers,
                cache_bytes,
            )
            env = {s.output: inputs[by_input[s.output]] for s in prog.steps if s.kind == "input"}
            for s in prog.steps:
                if s.kind == "view":
                    env[s.output] = ev.apply_op(s.op, [env[s.args[0]]], s.attrs, s.dtype)
            err = np.zeros(1, dtype=np.int32)
            got = run_kernel(step, [env[o.value] for o in step.kernel.inputs], err=err)
            ok = err[0] == 0 and np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
            print(f"{'ok' if ok else 'FAIL'} fused take {name}{tag}")
            failures += not ok
        cuda_rows.ROWS_WARP_MIN, cuda_rows.ROW_REGISTERS, cuda_rows.ROW_CACHE_BYTES = 4096, 64, 8192
        # ids out of range: the word is set, rows of valid ids unchanged
        bad = ids.copy().reshape(-1)
        bad[0], bad[-1] = -1, rows
        env = {s.output: inputs[by_input[s.output]] for s in prog.steps if s.kind == "input"}
        env[prog.inputs["ids"]] = bad.reshape(ids.shape)
        for s in prog.steps:
            if s.kind == "view":
                env[s.output] = ev.apply_op(s.op, [env[s.args[0]]], s.attrs, s.dtype)
        err = np.zeros(1, dtype=np.int32)
        got = run_kernel(step, [env[o.value] for o in step.kernel.inputs], err=err)
        width = got.shape[-1]
        inner = got.reshape(-1, width)[1:-1]
        ok = err[0] == 1 and np.allclose(
            inner, want.reshape(-1, width)[1:-1], rtol=1e-5, atol=1e-6, equal_nan=True
        )
        print(f"{'ok' if ok else 'FAIL'} fused take {name} out of range: word set")
        failures += not ok
    return failures


def run_concats() -> int:
    """Two-operand concatenations along each axis: packed, transposed and broadcast
    (stride-0) operands of each element width, against numpy's concatenate."""
    rng = np.random.default_rng(3)
    failures = 0
    cases = [  # dtype, a shape, b shape, dim, a transposed, b broadcast along axis 0
        (np.float32, (2, 1, 4), (2, 5, 4), 1, False, False),
        (np.float64, (3, 4), (2, 4), 0, True, False),
        (np.uint8, (3, 2), (3, 5), 1, False, True),
        (np.int16, (4, 3, 2), (4, 3, 3), 2, False, False),
    ]
    for dtype, ashape, bshape, dim, transposed, broadcast in cases:
        abase = (rng.standard_normal(ashape[::-1] if transposed else ashape) * 50).astype(dtype)
        a = abase.T if transposed else abase
        bbase = (rng.standard_normal((1, *bshape[1:]) if broadcast else bshape) * 50).astype(dtype)
        b = np.broadcast_to(bbase, bshape) if broadcast else bbase
        width = a.itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        want = np.concatenate([a, b], axis=dim)
        out = np.zeros(want.size, dtype=word)
        g = cg.generate_concat(width, a.ndim, dim)
        fn = cuda.jit(cg.python_function(g))
        sa = [st // width for st in a.strides]
        sb = [st // width for st in b.strides]
        fn[2, 32](
            out, base_of(a).copy().view(word), base_of(b).copy().view(word),
            want.size, a.shape[dim], *want.shape, *sa, *sb,
        )  # fmt: skip
        ok = np.array_equal(out.view(dtype).reshape(want.shape), want)
        print(f"{'ok' if ok else 'FAIL'} concat {np.dtype(dtype).name} {ashape}+{bshape} "
              f"dim={dim} t={transposed} b={broadcast}")  # fmt: skip
        failures += not ok
    return failures


def run_many_piece_concats() -> int:
    """Concatenations of 3 to 9 pieces of unequal lengths along each axis (one transposed,
    one broadcast), as a merged tree of two-operand ones runs, against numpy: the
    variant of each piece count exactly, and the launcher's (4, 8 or 16 pieces, the
    unused ones empty and first)."""
    rng = np.random.default_rng(5)
    failures = 0
    cases = [  # dtype, shape, dim, lengths along dim
        (np.float32, (2, 3, 4), 1, (1, 3, 2)),
        (np.uint16, (3, 5), 0, (2, 1, 4, 1, 3)),
        (np.float64, (2, 2, 3), 2, (1, 1, 1, 2, 1, 1, 3, 1, 2)),
    ]
    for dtype, shape, dim, lengths in cases:
        pieces = []
        for j, n in enumerate(lengths):
            sh = tuple(n if d == dim else x for d, x in enumerate(shape))
            if j == 1:  # transposed
                p = (rng.standard_normal(sh[::-1]) * 50).astype(dtype).T
            elif j == 2:  # broadcast along its first non-joined axis
                axis = 0 if dim != 0 else 1
                one = tuple(1 if d == axis else x for d, x in enumerate(sh))
                p = np.broadcast_to((rng.standard_normal(one) * 50).astype(dtype), sh)
            else:
                p = (rng.standard_normal(sh) * 50).astype(dtype)
            pieces.append(p)
        width = pieces[0].itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        want = np.concatenate(pieces, axis=dim)
        out = np.zeros(want.size, dtype=word)
        g = cg.generate_concat(width, len(shape), dim, len(pieces))
        fn = cuda.jit(cg.python_function(g))
        starts = list(np.cumsum(lengths)[:-1])
        strides = [st // width for p in pieces for st in p.strides]
        bases = [base_of(p).copy().view(word) for p in pieces]
        fn[2, 32](out, *bases, want.size, *starts, *want.shape, *strides)
        ok = np.array_equal(out.view(dtype).reshape(want.shape), want)
        # the variant the launcher picks, with its arguments
        variant = cg.concat_pieces(len(pieces))
        fn = cuda.jit(cg.python_function(cg.generate_concat(width, len(shape), dim, variant)))
        layouts = tuple((p.shape, tuple(st // width for st in p.strides)) for p in pieces)
        n, ints = cg.concat_arguments(len(shape), dim, layouts)
        out2 = np.zeros(want.size, dtype=word)
        fn[2, 32](out2, *[bases[0]] * (variant - len(pieces)), *bases, *ints)
        ok = ok and n == want.size and np.array_equal(out2.view(dtype).reshape(want.shape), want)
        print(f"{'ok' if ok else 'FAIL'} concat of {len(pieces)} (variant {variant}) "
              f"{np.dtype(dtype).name} dim={dim}")  # fmt: skip
        failures += not ok
    return failures


def run_row_concats() -> int:
    """Concatenations whose pieces have packed rows (feature maps along channels, heads
    along the last axis, a piece sliced from a wider tensor, a broadcast leading axis,
    an empty piece), copied in the widest word ``row_concat_arguments`` allows, against
    numpy; and the layouts it refuses (a transposed piece, a misaligned address)."""
    rng = np.random.default_rng(6)
    failures = 0
    cases = [  # dtype, shape, dim, lengths along dim, the kind of piece 1
        (np.float32, (2, 3, 3, 4), 1, (2, 1, 3), "packed"),
        (np.uint16, (3, 4, 6), 2, (4, 4), "sliced"),
        (np.uint16, (2, 5, 3), 1, (1, 0, 2, 3), "empty"),
        (np.float64, (4, 2, 3), 1, (1, 2, 1, 1, 2), "broadcast"),
        (np.uint8, (3, 5), 1, (3, 1, 4), "packed"),
    ]
    for dtype, shape, dim, lengths, kind in cases:
        pieces = []
        for j, n in enumerate(lengths):
            sh = tuple(n if d == dim else x for d, x in enumerate(shape))
            p = (rng.standard_normal(sh) * 50).astype(dtype)
            if j == 1 and kind == "sliced":  # a narrower view of a wider tensor's rows
                wide = tuple(x + 2 if d == dim else x for d, x in enumerate(sh))
                p = (rng.standard_normal(wide) * 50).astype(dtype)[(slice(None),) * dim + (
                    slice(1, 1 + n),)]  # fmt: skip
            elif j == 1 and kind == "broadcast":
                p = np.broadcast_to((rng.standard_normal((1, *sh[1:])) * 50).astype(dtype), sh)
            pieces.append(p)
        width = pieces[0].itemsize
        want = np.concatenate(pieces, axis=dim)
        layouts = tuple((p.shape, tuple(st // width for st in p.strides)) for p in pieces)
        starts = [base_of(p) for p in pieces]
        ptrs = (0, *[8 * (j + 1) for j in range(len(pieces))])
        args = cg.row_concat_arguments(width, dim, layouts, ptrs)
        ok = args is not None
        if ok:
            word, _, _, ints = args
            wt = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[word]

            def words(a, wt=wt, word=word):
                raw = np.zeros(-(-a.nbytes // word) * word + word, dtype=np.uint8)
                raw[: a.nbytes] = np.ascontiguousarray(a).view(np.uint8)
                return raw.view(wt)

            variant = cg.concat_pieces(len(pieces))
            fn = cuda.jit(cg.python_function(cg.generate_row_concat(word, variant)))
            out = words(np.zeros(want.size, dtype=dtype))
            bases = [words(b) for b in starts]
            fn[(2, variant), 32](out, *[bases[0]] * (variant - len(pieces)), *bases, *ints)
            got = out.view(np.uint8)[: want.nbytes].view(dtype).reshape(want.shape)
            ok = np.array_equal(got, want) and word >= width
        print(f"{'ok' if ok else 'FAIL'} row concat of {len(pieces)} {np.dtype(dtype).name} "
              f"dim={dim} ({kind}, {args[0] if args else None}-byte words)")  # fmt: skip
        failures += not ok
    t = np.zeros((3, 4), dtype=np.float32).T  # a transposed piece: not packed rows
    refused = [
        cg.row_concat_arguments(4, 1, (((4, 3), (3, 1)), (t.shape, (1, 4))), (0, 8, 16)),
        cg.row_concat_arguments(4, 0, (((2, 3), (3, 1)), ((3, 3), (1, 3))), (0, 8, 16)),
    ]
    narrow = cg.row_concat_arguments(4, 1, (((2, 3), (3, 1)), ((2, 2), (2, 1))), (0, 8, 20))
    ok = refused == [None, None] and narrow is not None and narrow[0] == 4
    print(f"{'ok' if ok else 'FAIL'} row concat refusals and a 4-byte-aligned address")
    return failures + (not ok)


def run_pads() -> int:
    """Constant pads: packed and transposed inputs of each element width, fills of each
    width (-inf, a negative integer, a half's bits, true), in 64-bit and 32-bit index
    arithmetic, against numpy's pad."""
    rng = np.random.default_rng(4)
    failures = 0
    cases = [  # dtype, shape, transposed, pads, fill value
        (np.float32, (2, 3, 4), False, (0, 0, 1, 2, 0, 1), -np.inf),
        (np.float64, (3, 5), True, (2, 0, 1, 1), -2.5),
        (np.int16, (4, 3), False, (1, 1, 0, 2), -7),
        (np.float16, (2, 6), True, (0, 1, 3, 0), 1.5),
        (np.uint8, (3, 3), False, (1, 0, 0, 1), 1),
    ]
    for dtype, shape, transposed, pads, value in cases:
        base = (rng.standard_normal(shape[::-1] if transposed else shape) * 50).astype(dtype)
        x = base.T if transposed else base
        width = x.itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        fill = int(np.asarray(value, dtype=dtype).view(word))
        if width == 8 and fill >= 2**63:  # the kernel takes the word as int64
            fill -= 2**64
        want = np.pad(x, [(pads[2 * d], pads[2 * d + 1]) for d in range(x.ndim)],
                      constant_values=np.asarray(value, dtype=dtype))  # fmt: skip
        for narrow in (False, True):
            out = np.zeros(want.size, dtype=word)
            g = cg.generate_pad(width, x.ndim, narrow)
            fn = cuda.jit(cg.python_function(g))
            before = [pads[2 * d] for d in range(x.ndim)]
            fn[2, 32](
                out, base_of(x).copy().view(word), want.size, np.int64(fill),
                *want.shape, *x.shape, *before, *[st // width for st in x.strides],
            )  # fmt: skip
            ok = np.array_equal(out.view(dtype).reshape(want.shape), want, equal_nan=True)
            print(f"{'ok' if ok else 'FAIL'} pad {np.dtype(dtype).name} {shape} t={transposed} "
                  f"{pads} fill={value} narrow={narrow}")  # fmt: skip
            failures += not ok
    return failures


def run_rolls() -> int:
    """Rolls: packed and transposed inputs of each element width, one axis and several,
    shifts of 0 and size - 1, in 64-bit and 32-bit index arithmetic and, where the last
    axis is not rolled and its rows are whole vectors, by 16-byte vectors; against numpy's
    roll."""
    from saturn.codegen.movement import ROW_LANES
    from saturn.codegen.roll import generate_roll, roll_variant

    rng = np.random.default_rng(6)
    failures = 0
    cases = [  # dtype, shape, transposed, shift per axis
        (np.float32, (2, 5, 4), False, (0, 2, 3)),
        (np.float64, (3, 7), True, (2, 6)),
        (np.int16, (4, 3, 2), True, (1, 0, 1)),
        (np.float16, (9,), False, (4,)),
        (np.uint8, (3, 4), False, (2, 0)),
        (np.float16, (2, 5, 3, 16), False, (1, 4, 2, 0)),  # Swin's: vectors of 8
        (np.float32, (3, 6, 8), False, (0, 5, 0)),  # vectors of 4
        (np.float32, (4, 8), True, (3, 0)),  # transposed: no vectors
    ]
    for dtype, shape, transposed, shifts in cases:
        base = (rng.standard_normal(shape[::-1] if transposed else shape) * 50).astype(dtype)
        x = base.T if transposed else base
        if dtype is np.float32:
            x.flat[:3] = [np.nan, -np.inf, -0.0]
        width = x.itemsize
        word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        want = np.roll(x, shifts, axis=tuple(range(x.ndim)))
        out = np.zeros(want.size, dtype=word)
        src = base_of(x).copy().view(word)
        strides = [st // width for st in x.strides]
        fits = roll_variant(width, x.shape, strides, shifts, (0, 0))[1]
        for narrow, vectors in [
            (False, False),
            (True, False),
            *[(False, True), (True, True)] * fits,
        ]:
            out = np.zeros(want.size, dtype=word)
            count = want.size // ROW_LANES[width] if vectors else want.size
            fn = cuda.jit(cg.python_function(generate_roll(width, x.ndim, narrow, vectors)))
            fn[2, 32](out, src, count, *x.shape, *shifts, *strides)
            got = out.view(dtype).reshape(want.shape)
            ok = np.array_equal(got.view(word), np.ascontiguousarray(want).view(word))
            name = np.dtype(dtype).name
            print(
                f"{'ok' if ok else 'FAIL'} roll {name} {shape} t={transposed} {shifts} "
                f"narrow={narrow} vectors={vectors}"
            )
            failures += not ok
    return failures


def run_scatter_adds() -> int:
    """Rows added into a table: float and integer dtypes, a repeated row, a negative index
    (from the end), strided values, against numpy's add.at; an index out of range adds
    nothing and sets the word."""
    rng = np.random.default_rng(5)
    failures = 0
    for dtype, itype, transposed, d in [
        (np.float32, np.int64, False, 3),
        (np.float64, np.int32, True, 3),
        (np.int64, np.int64, False, 3),
        (np.int32, np.int32, True, 3),
        (np.int32, np.int64, False, 1),  # counts at flat positions (a scatter, 0047)
    ]:
        rows, n = 6, 5
        table = (rng.standard_normal((rows, d)) * 20).astype(dtype)
        vbase = (rng.standard_normal((d, n) if transposed else (n, d)) * 20).astype(dtype)
        values = vbase.T if transposed else vbase
        index = np.array([1, 5, 1, -1, 0], dtype=itype)
        want = table.copy()
        np.add.at(want, np.where(index < 0, index + rows, index), values)
        name = np.dtype(dtype).name
        short = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32"}
        g = cg.generate_scatter_add(short[name], short[np.dtype(itype).name])
        fn = cuda.jit(cg.python_function(g))
        vs = [st // values.itemsize for st in values.strides]
        for flat in (0, 1):  # a block per row; a thread per element (short rows)
            out = table.copy().reshape(-1)
            err = np.zeros(1, dtype=np.int32)
            src = base_of(values).copy().reshape(-1)
            fn[2, 32](out, src, index, err, n, d, rows, *vs, 1, flat)
            ok = np.allclose(out.reshape(rows, d), want, rtol=1e-6) and err[0] == 0
            print(
                f"{'ok' if ok else 'FAIL'} scatter add {name} {np.dtype(itype).name} "
                f"t={transposed} d={d} flat={flat}"
            )
            failures += not ok
    g = cg.generate_scatter_add("f32", "i64")
    fn = cuda.jit(cg.python_function(g))
    index = np.array([1, 2, -3, 0], dtype=np.int64)  # 2 and -3 lie outside a table of 2 rows
    for flat in (0, 1):
        out = np.zeros(8, dtype=np.float32)
        err = np.zeros(1, dtype=np.int32)
        fn[2, 32](out, np.ones(16, dtype=np.float32), index, err, 4, 4, 2, 4, 1, 1, flat)
        ok = err[0] == 1 and np.array_equal(out, np.ones(8, dtype=np.float32))
        print(
            f"{'ok' if ok else 'FAIL'} scatter add out of range (flat={flat}): word set, "
            "nothing added there"
        )
        failures += not ok
    return failures


def run_half_row_producers() -> int:
    """bfloat16 loops whose body ends in their own rounding, computed inside the softmax
    that reads them (``inline_row_producers``): the fused program's bits against the
    program with the loops written and read back, special values included."""
    from saturn.eqsat import kernel_fusion

    text = SWIN_MASK.replace("f32", "bf16")
    graph = parse_graph(text + "\n", "window_mask_softmax_bf16")
    fused = compile_graph(graph, machine="gpu", io_on_device=True).program
    keep = kernel_fusion.stores_its_value
    kernel_fusion.stores_its_value = lambda k: k.dtype in ("f32", "f64")
    try:
        apart = compile_graph(graph, machine="gpu", io_on_device=True).program
    finally:
        kernel_fusion.stores_its_value = keep
    assert [k.kind for k in fused.kernels] == ["rows"] and len(apart.kernels) == 2, apart
    rng = np.random.default_rng(3)
    bits = {}
    for n in graph.inputs():
        x = _half_inputs("bf16", math.prod(n.shape), rng)
        bits[n.name] = (x.view(np.uint32) >> 16).astype(np.uint16).reshape(n.shape)  # truncated
    outs = []
    for prog in (fused, apart):
        env = {}
        by_input = {v: k for k, v in prog.inputs.items()}
        for st in prog.steps:
            if st.kind == "input":
                env[st.output] = bits[by_input[st.output]]
            elif st.kind == "view":
                env[st.output] = ev.apply_op(st.op, [env[st.args[0]]], st.attrs, st.dtype)
            elif st.kind == "kernel":
                env[st.output] = run_kernel(st, [env[o.value] for o in st.kernel.inputs])
            else:
                raise SystemExit(f"window_mask_softmax_bf16: unexpected step {st.kind}")
        outs.append(np.asarray(env[prog.outputs[0]]).reshape(-1))
    same = np.array_equal(outs[0], outs[1])
    print(f"{'ok' if same else 'FAIL'} half rows kernel computing its bfloat16 loops")
    return 0 if same else 1


def run_copy_groups() -> int:
    """A GPU call's input writes a few to a launch (``cuda_group.copy_group``): values of
    every element width and length copied bit for bit (NaN payloads, bytes that are not
    0 or 1), into poisoned memory."""
    from saturn.codegen.cuda_group import WIDTH, copy_group

    rng = np.random.default_rng(3)
    failures = 0
    for sizes in ([(4, 37), (8, 5), (2, 300), (1, 9)], [(2, 1), (2, 640)], [(8, 33)] * 3):
        k = copy_group(sizes)
        g = cg.generate(k)
        fn = cuda.jit(cg.python_function(g))
        srcs = [rng.integers(0, 256, size=w * n, dtype=np.uint8) for w, n in sizes]
        if sizes[0][0] == 4:
            srcs[0][:4] = (1, 0, 0xC1, 0x7F)  # as float32: a NaN with a payload
        outs = [np.full(w * n, 0xAB, dtype=np.uint8) for w, n in sizes]
        views = [a.view(ev.np_dtype(WIDTH[w])) for a, (w, _) in zip(srcs, sizes, strict=True)]
        dsts = [a.view(ev.np_dtype(WIDTH[w])) for a, (w, _) in zip(outs, sizes, strict=True)]
        sizes_args = cg.size_args(g, k, [(n,) for _, n in sizes], [(1,)] * len(sizes))
        blocks, threads = cg.grid_for(g, sizes_args, sm_count=0.125)
        fn[blocks, threads](dsts[0], *views, *dsts[1:], *[sizes_args[p] for p in g.params.ints])
        same = all(np.array_equal(a, b) for a, b in zip(srcs, outs, strict=True))
        print(f"{'ok' if same else 'FAIL'} copy group {sizes}")
        failures += not same
    return failures


def run_movement() -> int:
    """Half-precision loops and reductions, and the movement kernels."""
    failures = run_halves()
    failures += run_scatter_adds()
    failures += run_takes()
    failures += run_fused_takes()
    failures += run_half_row_producers()
    failures += run_concats()
    failures += run_many_piece_concats()
    failures += run_row_concats()
    failures += run_pads()
    failures += run_copies()
    failures += run_copy_groups()
    return failures


def run_graphs() -> int:
    """Every graph, then again through 32-bit index arithmetic and split reductions."""
    failures = run_all(GRAPHS)
    # strided and broadcast operands through 32-bit index arithmetic (what fitting launches
    # get): runs that vector steps cross (5) and do not (12), bool runs, a wrapping bias
    narrow = ("leading_strided", "permuted", "heads_permute", "channel_batch_norm")
    more = (
        "channel_runs_of_12",
        "channel_runs_of_3",
        "leading_runs_of_10",
        "channel_bool",
        "bias_trailing",
        *BROADCAST_SUMS,
    )
    failures += run_all({k: GRAPHS[k] for k in (*narrow, *more)}, True)
    # reductions again through the split kernels (partials per chunk, then a fold): rows
    # and columns, NaN through max, mean's division and an epilogue, integers widening
    # (few rows: the simulator runs a Python thread per GPU thread)
    failures += run_all({k: GRAPHS[k] for k in SPLIT}, split=True)
    failures += run_all({k: GRAPHS[k] for k in BROADCAST_SUMS}, True, True, " (split, narrow)")
    return failures


def run_variants() -> int:
    """Rolls, rows kernels in their other forms, and the scalar loop variant."""
    failures = run_rolls()
    failures += run_scheduler()
    failures += run_channels_last_join()
    # rows kernels again with the row kept in registers however short it is, by blocks
    # and by a warp per row (several steps per pass, a last step past the row's end), then
    # by warps with the row re-read every pass
    rows = {k: v for k, v in GRAPHS.items() if k.startswith("rows_")}
    segment_steps = cuda_rows.ROW_SEGMENT_STEPS
    cuda_rows.ROW_CACHE_BYTES = 0
    failures += run_all(rows, tag=" (kept)")
    cuda_rows.ROWS_WARP_MIN = 0
    cuda_rows.ROW_SEGMENT_STEPS = 0
    failures += run_all(rows, tag=" (warps)")
    cuda_rows.ROW_REGISTERS = 0
    failures += run_all(rows, tag=" (re-read)")
    # short rows by part of a warp each (4 steps a lane: rows of 20 to 64 by 8 or 16 lanes,
    # a row of 3 by 4), re-read and kept; the rows past the end of the last warps computed
    # again and not stored
    cuda_rows.ROW_SEGMENT_STEPS = 4
    short = {k: v for k, v in rows.items() if "block" not in k}
    failures += run_all(short, tag=" (segments, re-read)")
    cuda_rows.ROW_REGISTERS = 64
    failures += run_all(short, tag=" (segments, kept)")
    cuda_rows.ROWS_WARP_MIN, cuda_rows.ROW_REGISTERS, cuda_rows.ROW_CACHE_BYTES = 4096, 64, 8192
    cuda_rows.ROW_SEGMENT_STEPS = segment_steps
    cuda_reads.VECTOR = False  # the scalar loop variant (what misaligned operands get)
    failures += run_all(
        {
            k: v
            for k, v in GRAPHS.items()
            if "Sum" not in v
            and "Softmax" not in v
            and "Amax" not in v
            and "Amin" not in v
            and "Mean" not in v
            and "Prod" not in v
        }
    )
    return failures


def run_channels_last_join() -> int:
    """SqueezeNet's Fire module in float16 (``tests/eqsat/test_channels_last.fire``): its
    convolutions write NHWC memory and the channel join runs over [N, H, W, P, C]. The
    loops run under the simulator and the convolutions by the numpy evaluator, and the
    result is checked against the graph's."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eqsat"))
    from test_channels_last import fire

    graph = parse_graph(fire("f16"))
    prog = compile_graph(graph, machine="gpu", io_on_device=True).program
    rng = np.random.default_rng(0)
    inputs = {n.name: rand(rng, n.shape, n.dtype) for n in graph.inputs()}
    joins = 0

    def run(s, operands):
        nonlocal joins
        if s.kernel.kind != "loop":  # a convolution: cuDNN's on a GPU
            return ev.run_kernel(s, operands)
        joins += tuple(s.kernel.shape) == (2, 6, 6, 2, 8)  # [N, H, W, P, C]
        return run_kernel(s, operands)

    env = run_steps(prog, inputs, run, "fire")
    (want,) = ev.eval_graph(graph, inputs)
    got = env[prog.outputs[0]]
    ok = joins == 1 and np.array_equal(got, want, equal_nan=True)
    print(f"{'ok' if ok else 'FAIL'} channels-last join, Fire module ({joins} NHWC join)")
    return not ok


def run_scheduler() -> int:
    """The block scheduler (cudasim_blocks): a shared-memory sum over two barriers sees
    every thread's write, threads that return early do not hold the others at the
    barrier, and a thread's exception is raised from the launch."""
    from numba import float32

    @cuda.jit
    def block_sum(out, x, live):
        buf = cuda.shared.array(64, dtype=float32)
        t = cuda.threadIdx.x
        if t >= live:
            return
        buf[t] = x[t]
        cuda.syncthreads()
        if t == 0:
            acc = float32(0)
            for i in range(live):
                acc += buf[i]
            buf[0] = acc
        cuda.syncthreads()
        out[t] = buf[0]

    failures = 0
    for live in (64, 40):
        x = np.arange(64, dtype=np.float32)
        out = np.full(64, np.nan, dtype=np.float32)
        block_sum[1, 64](out, x, live)
        ok = bool((out[:live] == x[:live].sum()).all() and np.isnan(out[live:]).all())
        print(f"{'ok' if ok else 'FAIL'} scheduler block sum, {live} live threads")
        failures += not ok
    try:
        block_sum[1, 64](np.zeros(8, dtype=np.float32), np.zeros(64, dtype=np.float32), 64)
        raised = False
    except IndexError:
        raised = True
    print(f"{'ok' if raised else 'FAIL'} scheduler raises a thread's error")
    return failures + (not raised)


SECTIONS = {"movement": run_movement, "graphs": run_graphs, "variants": run_variants}


def main(names: list[str]) -> int:
    """Run the named sections (all of them without names): each test runs one, in a
    process of its own, so that none comes near its time limit."""
    failures = sum(SECTIONS[n]() for n in names or SECTIONS)
    return 1 if failures else 0


BROADCAST_SUMS = ("col_sum_broadcasts", "full_sum_broadcasts", "row_sum_strided")
SPLIT = (
    "reduce_apart",
    "siblings_batch_norm",
    "siblings_columns",
    "siblings_mean_cast",
    "full_sum_long",
    "full_mean_2d",
    "row_max_long",
    "epilogue_row_block",
    "col_mean",
    "mid_prod",
    "epilogue_column_cast",
    "int_sum_widens",
)


def run_steps(prog, inputs: dict, run, name: str) -> dict:
    """Every value of GPU program ``prog`` on ``inputs`` (by graph input name): kernel steps
    by ``run(step, operands)``, views and constants as the runner makes them."""
    env: dict = {}
    by_input = {v: k for k, v in prog.inputs.items()}
    for s in prog.steps:
        if s.kind == "input":
            env[s.output] = inputs[by_input[s.output]]
        elif s.kind == "kernel" and s.kernel.kind == "row_stat":  # its rows kernel wrote it
            env[s.output] = WRITTEN[s.kernel.inputs[0].value][s.kernel.attrs["stat"]]
            env[s.output] = env[s.output].reshape(s.shape)
        elif s.kind == "kernel":
            env[s.output] = run(s, [env[o.value] for o in s.kernel.inputs])
        elif s.kind == "view":
            env[s.output] = ev.apply_op(s.op, [env[s.args[0]]], s.attrs, s.dtype)
        elif s.kind == "const":  # made once on the device: the recipe's values
            env[s.output] = np.asarray(
                ot.arange_values(*s.attrs) if s.op == "Arange" else ev.scalar(*s.attrs)
            )
        else:
            raise SystemExit(f"{name}: unexpected step {s.kind}")
    return env


def run_all(
    graphs: dict[str, str], narrow: bool = False, split: bool = False, tag: str = ""
) -> int:
    rng = np.random.default_rng(0)
    failures = 0
    for name, text in graphs.items():
        graph = parse_graph(text + "\n", name)
        prog = compile_graph(graph, machine="gpu", io_on_device=True).program
        inputs = {n.name: rand(rng, n.shape, n.dtype) for n in graph.inputs()}
        ran = 0

        def run(s, operands):
            nonlocal ran
            ran += 1
            if split and s.kernel.kind == "reduce":
                return run_split(s, operands, narrow=narrow)
            return run_kernel(s, operands, narrow)

        env = run_steps(prog, inputs, run, name)
        want = ev.eval_graph(graph, inputs)
        got = [env[o] for o in prog.outputs]
        for w, g in zip(want, got, strict=True):
            try:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
            except AssertionError as e:
                failures += 1
                print(f"FAIL {name}: {e}")
        how = tag or (" (split)" if split else "")
        print(f"ok {name}{how}: {ran} kernel(s)" if ran else f"FAIL {name}: no kernel ran")
        failures += ran == 0
    return failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
