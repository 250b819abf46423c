"""Float32 scaled dot-product attention as one kernel of saturn's own (flash attention):
``out = softmax(scale * q @ k^T + bias) @ v`` over [B, H, S, D] operands, optionally
causal (PyTorch's top-left alignment), for what cuDNN's fused kernels do not take (they
take half types only, ``attention.py``). From compute capability 8.0 both products run on
tensor cores in three TF32 products each (``flash_mma.py``, which ``config`` picks and
``FlashPlan`` launches); this module's own kernel, on the CUDA cores, is for older cards.

A block of 128 threads owns up to 128 query rows of one (batch, head) and walks the keys 64
at a time, never writing the [Sq, Skv] scores: it keeps each row's running maximum and sum
(the online softmax) and rescales its accumulated output when the maximum grows. The query
tile, each key tile and then each value tile sit in shared memory (``config``,
``shared_bytes``); a thread owns 8 x 8 scores (4 x 8 for head dimensions over 64) and the
matching rows of the output, and the 8 threads sharing a row are lanes of one warp, so a
row's maximum and sum are three shuffles each. Everything is float32 with fused
multiply-adds (TF32 is never used: the products are the CUDA cores' own), in another
summation order than a product and a softmax. A row whose every score is -inf (all keys
masked) is 0, as aten's math (``_safe_softmax``) makes it.

Operands: any strides with the head dimension contiguous; grouped-query heads are read in
place (query head h reads key/value head h // G); the bias is float32 [1 or B, 1 or H, Sq,
Skv] with any strides (0 where it broadcasts). ``FlashPlan.run`` takes the pointers of each
call (q, k, v, out, then the bias and the row log-sum-exp where planned, as
``AttentionPlan``) and launches on saturn's stream, so CUDA-graph capture records it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import flash_mma
from .attention import AttentionError
from .flash_mma import MmaTile
from .gemm import Layout, raw_kernel

HEAD_DIM_MAX = 128
LANES = 8  # threads sharing a row (one warp's lanes: shuffles reduce a row)
TY = 16  # rows of threads: 128 threads a block


@dataclass(frozen=True)
class Tile:
    """What a thread owns: ``rows`` x ``cols`` of the scores (rows 16 apart, key columns 8
    apart) and the matching rows of the output; ``pipelined``: the next key tile and the
    current value tile are copied into shared memory (``cp.async``) while the block
    computes, in buffers of their own; ``exp2``: exponentials as ``exp2f`` of scores
    scaled by log2(e) (one instruction and a multiply folded into the scale)."""

    rows: int
    cols: int
    pipelined: bool = True
    exp2: bool = True


def config(d: int, cc: int = 0, rows: int = 0, heads: int = 0, sms: int = 0) -> Tile | MmaTile:
    """The tile for head dimension ``d`` on a card of compute capability ``cc`` (80 for
    8.0; 0: unknown) with ``sms`` multiprocessors, for ``rows`` query rows in each of
    ``heads`` (batch x head) slices (``bench/flash_tiles.py`` measured each choice):

    - from 8.0, the tensor-core kernel (``flash_mma.py``), 32 keys a step. Up to head size
      64, a warp owns two 16-row tiles (each key and value fragment serves both) and two
      blocks share a SM, unless that makes fewer than two blocks a SM: then one tile a warp
      and three blocks a SM, as also where a slice's rows fit one such block of 64.
      Above 64, two tiles a warp and one block a SM (the registers);
    - below 8.0, or unknown, the CUDA-core kernel without the pipelined copies: 8 x 8
      scores at head size 64 (a block owns 128 query rows and steps 64 keys at a time);
      4 x 4 otherwise, where the registers (no spills on sm_75) and the shared memory (two
      blocks a SM) allow no more. Not timed: no such card was at hand."""
    if d % LANES or d > HEAD_DIM_MAX:
        raise AttentionError(f"head dimension {d}: a multiple of {LANES} up to {HEAD_DIM_MAX}")
    if cc >= 80:
        if d > 64:
            return MmaTile(4, 32, blocks=1, mtiles=2)
        wide, narrow = MmaTile(4, 32, blocks=2, mtiles=2), MmaTile(4, 32, blocks=3, mtiles=1)
        if -(-rows // wide.rows) * heads < 2 * sms:
            return narrow
        # rows that fit one narrow block (Swin's 49-row windows): the wide block computes
        # twice the rows, more than its shared fragments save (2048 x 49 x 3 x 32: 211
        # against 146 us on an H100). Where both pad alike (197 rows) the wide tile was
        # 1.5x faster, so no longer row count pads enough more to lose
        return narrow if 0 < rows <= narrow.rows else wide
    # cp.async (the pipelined copies) needs 8.0 too; 8 x 8 spills registers on sm_75 at
    # head sizes 16 to 48 (tests/codegen/test_flash_attention.py compiles each)
    return Tile(8, 8, pipelined=False) if d == 64 else Tile(4, 4, pipelined=False)


def shared_bytes(d: int, tile: Tile) -> int:
    """Query, key, value (one buffer shared by both unless pipelined) and probability
    tiles, rows padded by 4 floats (16 bytes: rows stay aligned for 16-byte reads, and
    rows 16 apart fall in other banks)."""
    bq, bk = TY * tile.rows, LANES * tile.cols
    return 4 * (bq * (d + 4) + (2 if tile.pipelined else 1) * bk * (d + 4) + bq * (bk + 4))


# A thread owns rows ty + 16 i of the block's query tile and key columns tx + 8 j of each
# key step, and output columns tx * DN .. tx * DN + DN - 1; tiles are [row][d] in shared
# memory, read 16 bytes at a time along d.
_SOURCE = r"""
#define NT (TY * LANES)
#define BQ (TY * RM)
#define BK (LANES * CN)
#define DN (D / LANES)
#define DP (D + 4)
#define PP (BK + 4)
#define INF __int_as_float(0x7f800000)
#if EXP2
#define EXP(x) exp2f(x)
#else
#define EXP(x) expf(x)
#endif

// rows [r0, r0 + n) of a [rows][D] operand (row stride rs) into a [n][DP] tile, zeros past
// ``limit``: copies the device runs asynchronously where pipelined
__device__ __forceinline__ void load_tile(float* dst, const float* src, long long rs, int r0,
                                          int n, int limit) {
  for (int e = threadIdx.x; e < n * D; e += NT) {
    const int r = e / D, d = e - r * D;
    const bool ok = r0 + r < limit;
#if PIPELINED
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst + r * DP + d);
    const float* g = ok ? src + (r0 + r) * rs + d : src;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a), "l"(g),
                 "r"(ok ? 4 : 0));
#else
    dst[r * DP + d] = ok ? src[(r0 + r) * rs + d] : 0.f;
#endif
  }
#if PIPELINED
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

#if PIPELINED
#define WAIT_ALL_BUT_LAST() asm volatile("cp.async.wait_group 1;\n" ::)
#else
#define WAIT_ALL_BUT_LAST()
#endif

extern "C" __global__ void __launch_bounds__(NT, 2) flash_f32(
    PARAMS) {
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;            // [BQ][DP]
  float* Ks = Qs + BQ * DP;    // [BK][DP]
#if PIPELINED
  float* Vs = Ks + BK * DP;    // [BK][DP]
#else
  float* Vs = Ks;              // V takes K's place once K is read
#endif
  float* Ps = Vs + BK * DP;    // [BQ][PP]
  const int t = threadIdx.x, tx = t % LANES, ty = t / LANES;
  const int q0 = blockIdx.x * BQ, bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / G;
  const float* qb = q + b * qsb + h * qsh;
  const float* kb = k + b * ksb + hk * ksh;
  const float* vb = v + b * vsb + hk * vsh;
#if EXP2
  const float LOG2E = 1.4426950408889634f;
  scale *= LOG2E;  // scores in base 2: exp2(x log2 e) = exp(x)
#endif
  load_tile(Qs, qb, qss, q0, BQ, Sq);
  const int kend = CAUSAL ? min(Skv, q0 + BQ) : Skv;
#if PIPELINED
  load_tile(Ks, kb, kss, 0, BK, Skv);
#endif
  float o[RM][DN], m[RM], l[RM];
#pragma unroll
  for (int i = 0; i < RM; i++) {
    m[i] = -INF;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < DN; j++) o[i][j] = 0.f;
  }
  for (int k0 = 0; k0 < kend; k0 += BK) {
#if PIPELINED
    load_tile(Vs, vb, vss, k0, BK, Skv);
    WAIT_ALL_BUT_LAST();  // Q and this step's K have landed
#else
    __syncthreads();  // the previous step's V and P are read
    load_tile(Ks, kb, kss, k0, BK, Skv);
#endif
    __syncthreads();
    float s[RM][CN];
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
      for (int j = 0; j < CN; j++) s[i][j] = 0.f;
#pragma unroll 2
    for (int d = 0; d < D; d += 4) {
      float4 kk[CN];
#pragma unroll
      for (int j = 0; j < CN; j++) kk[j] = *(const float4*)&Ks[(tx + LANES * j) * DP + d];
#pragma unroll
      for (int i = 0; i < RM; i++) {
        const float4 qa = *(const float4*)&Qs[(ty + TY * i) * DP + d];
#pragma unroll
        for (int j = 0; j < CN; j++) {
          s[i][j] = fmaf(qa.x, kk[j].x, s[i][j]);
          s[i][j] = fmaf(qa.y, kk[j].y, s[i][j]);
          s[i][j] = fmaf(qa.z, kk[j].z, s[i][j]);
          s[i][j] = fmaf(qa.w, kk[j].w, s[i][j]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < RM; i++) {
      const int row = q0 + ty + TY * i;
      float mx = -INF;
#pragma unroll
      for (int j = 0; j < CN; j++) {
        const int col = k0 + tx + LANES * j;
        float x = s[i][j] * scale;
#if HAS_BIAS
        if (row < Sq && col < Skv) {
          const float bv = bias[b * bsb + h * bsh + row * bsq + col * bsk];
#if EXP2
          x = fmaf(bv, LOG2E, x);
#else
          x += bv;
#endif
        }
#endif
        if (col >= Skv || (CAUSAL && col > row)) x = -INF;
        s[i][j] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float mn = fmaxf(m[i], mx);
      const float base = mn == -INF ? 0.f : mn;  // a row masked so far stays 0
      const float alpha = EXP(m[i] - base);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < CN; j++) {
        s[i][j] = EXP(s[i][j] - base);
        sum += s[i][j];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
#pragma unroll
      for (int j = 0; j < DN; j++) o[i][j] *= alpha;
#pragma unroll
      for (int j = 0; j < CN; j++) Ps[(ty + TY * i) * PP + tx + LANES * j] = s[i][j];
    }
    __syncthreads();  // K is read, P is written
#if PIPELINED
    if (k0 + BK < kend) {
      load_tile(Ks, kb, kss, k0 + BK, BK, Skv);  // the next step's K, during this one's PV
    } else {
      asm volatile("cp.async.commit_group;\n" ::);  // an empty group keeps the count
    }
    WAIT_ALL_BUT_LAST();  // this step's V has landed
    __syncthreads();
#else
    load_tile(Vs, vb, vss, k0, BK, Skv);
    __syncthreads();
#endif
#pragma unroll 2
    for (int c = 0; c < BK; c += 4) {
      float4 pa[RM];
#pragma unroll
      for (int i = 0; i < RM; i++) pa[i] = *(const float4*)&Ps[(ty + TY * i) * PP + c];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        float vv[DN];
#if DN % 4 == 0
#pragma unroll
        for (int j = 0; j < DN; j += 4) {
          const float4 w = *(const float4*)&Vs[(c + u) * DP + tx * DN + j];
          vv[j] = w.x;
          vv[j + 1] = w.y;
          vv[j + 2] = w.z;
          vv[j + 3] = w.w;
        }
#else
#pragma unroll
        for (int j = 0; j < DN; j++) vv[j] = Vs[(c + u) * DP + tx * DN + j];
#endif
#pragma unroll
        for (int i = 0; i < RM; i++) {
          const float p = u == 0 ? pa[i].x : u == 1 ? pa[i].y : u == 2 ? pa[i].z : pa[i].w;
#pragma unroll
          for (int j = 0; j < DN; j++) o[i][j] = fmaf(p, vv[j], o[i][j]);
        }
      }
    }
#if PIPELINED
    __syncthreads();  // V and P are read before the next step refills them
#endif
  }
#if PIPELINED
  asm volatile("cp.async.wait_all;\n" ::);  // nothing left in flight at exit
#endif
#pragma unroll
  for (int i = 0; i < RM; i++) {
    const int row = q0 + ty + TY * i;
    if (row >= Sq) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    float* ob = out + b * osb + h * osh + row * oss + tx * DN;
#pragma unroll
    for (int j = 0; j < DN; j++) ob[j] = o[i][j] * inv;
#if HAS_LSE
#if EXP2
    const float lrow = m[i] * 0.6931471805599453f + logf(l[i]);  // back to natural logs
#else
    const float lrow = m[i] + logf(l[i]);
#endif
    if (tx == 0) lse[(long long)bh * Sq + row] = l[i] > 0.f ? lrow : -INF;
#endif
  }
}
"""


def source(d: int, causal: bool, bias: bool, lse: bool, tile: Tile | None = None) -> str:
    """The kernel's CUDA C for head dimension ``d`` (a thread's tile from ``config``)."""
    tile = tile or config(d)
    defs = {"D": d, "RM": tile.rows, "CN": tile.cols, "TY": TY, "LANES": LANES}
    defs |= {"PIPELINED": int(tile.pipelined), "EXP2": int(tile.exp2)}
    defs |= {"CAUSAL": int(causal), "HAS_BIAS": int(bias), "HAS_LSE": int(lse)}
    return "".join(f"#define {n} {x}\n" for n, x in defs.items()) + _SOURCE.replace(
        "PARAMS", flash_mma.PARAMS
    )


def check_operands(q: Layout, k: Layout, v: Layout, out: Layout) -> None:
    """Raise ``AttentionError`` naming what the float32 kernel does not take."""
    if {q.dtype, k.dtype, v.dtype, out.dtype} != {"f32"}:
        raise AttentionError("the float32 attention kernel takes float32 q, k, v and output")
    if any(len(t.shape) != 4 for t in (q, k, v, out)):
        raise AttentionError("fused attention takes [batch, heads, sequence, head] operands")
    b, h, sq, d = q.shape
    hk = k.shape[1]
    if k.shape[0] != b or v.shape[:2] != k.shape[:2] or hk == 0 or h % hk:
        raise AttentionError(
            f"q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} differ in batch or heads"
        )
    if k.shape[3] != d or v.shape[3] != d or v.shape[2] != k.shape[2]:
        raise AttentionError(
            f"k {list(k.shape)} and v {list(v.shape)} do not pair with q {list(q.shape)}"
        )
    if out.shape != q.shape:
        raise AttentionError(f"output {list(out.shape)} for q {list(q.shape)}")
    config(d)
    for name, t in (("q", q), ("k", k), ("v", v), ("output", out)):
        if t.strides[3] != 1:
            raise AttentionError(f"{name}'s head dimension is not contiguous")
    if b * h * sq * k.shape[2] == 0:  # nothing to launch over (a grid of no blocks)
        raise AttentionError(f"q {list(q.shape)}, k {list(k.shape)}: empty operands")
    if sq >= 2**31 or k.shape[2] >= 2**31 or b * h > 65535:
        raise AttentionError(f"q {list(q.shape)}, k {list(k.shape)}: too large for the grid")


def check_bias(q: Layout, k: Layout, bias: Layout) -> None:
    """A float32 bias [1 or B, 1 or H, Sq, Skv] (any strides)."""
    b, h, sq, _ = q.shape
    if bias.dtype != "f32" or len(bias.shape) != 4:
        raise AttentionError("the bias must be float32 [batch or 1, heads or 1, Sq, Skv]")
    bb, bh, bq, bk = bias.shape
    if bb not in (1, b) or bh not in (1, h) or (bq, bk) != (sq, k.shape[2]):
        raise AttentionError(f"bias {list(bias.shape)} for q {list(q.shape)}, k {list(k.shape)}")


def _device() -> tuple[int, int]:
    """The current CUDA device's compute capability (90 for 9.0) and multiprocessors."""
    import cupy

    dev = cupy.cuda.Device()
    return int(dev.compute_capability), int(dev.attributes["MultiProcessorCount"])


class FlashPlan:
    """``out = softmax(scale * q @ k^T + bias) @ v`` (causal if asked) for fixed layouts,
    on saturn's stream; ``stats`` asks for each row's log-sum-exp ([B, H, Sq] float32,
    packed). The same interface as ``AttentionPlan``: ``run(ptrs, workspace)``."""

    workspace_size = 0
    runs = 0  # launches (tests prove which kernel ran)

    def __init__(
        self,
        q: Layout,
        k: Layout,
        v: Layout,
        out: Layout,
        scale: float,
        stream: int,
        bias: Layout | None = None,
        causal: bool = False,
        stats: bool = False,
        tile: Tile | MmaTile | None = None,
    ):
        check_operands(q, k, v, out)
        if bias is not None:
            check_bias(q, k, bias)
        b, h, sq, d = q.shape
        self.stream = stream
        self.has_bias, self.has_lse = bias is not None, stats
        try:  # CuPy compiles (NVRTC) at the first attribute it needs from the module
            if tile is None:
                cc, sms = _device()
                tile = config(d, cc, sq, b * h, sms)
            has_bias = bias is not None
            if isinstance(tile, MmaTile):
                bq, threads = tile.rows, 32 * tile.warps
                self.shared = flash_mma.shared_bytes(d, tile)
                src, name = flash_mma.source(d, causal, has_bias, stats, tile), flash_mma.KERNEL
            else:
                bq, threads = TY * tile.rows, TY * LANES
                self.shared = shared_bytes(d, tile)
                src, name = source(d, causal, has_bias, stats, tile), "flash_f32"
            self.kernel = raw_kernel(src, name)
            self.kernel.max_dynamic_shared_size_bytes = self.shared
        except Exception as e:  # a plan that cannot be built leaves the call to the math
            raise AttentionError(f"the float32 attention kernel could not be built: {e}") from e
        self.grid = ((sq + bq - 1) // bq, b * h)
        self.block = (threads,)
        bstr = []
        if bias is not None:  # a broadcast axis of size 1 is read at index 0 whatever its stride
            bstr = [0 if n == 1 else s for n, s in zip(bias.shape, bias.strides, strict=True)]
        ints = [h, h // k.shape[1], sq, k.shape[2]]
        strides = [*q.strides[:3], *k.strides[:3], *v.strides[:3], *out.strides[:3]]
        self.tail = (
            *(np.int32(x) for x in ints),
            np.float32(scale),
            *(np.int64(x) for x in strides + (bstr or [0, 0, 0, 0])),
        )

    def run(self, ptrs: tuple[int, ...], workspace: int = 0) -> None:
        """``ptrs``: q, k, v, out, then the bias and the statistics where planned."""
        import cupy

        q, k, v, out, *rest = ptrs
        bias = rest.pop(0) if self.has_bias else 0
        lse = rest.pop(0) if self.has_lse else 0
        args = tuple(np.uint64(p) for p in (q, k, v, out, bias, lse)) + self.tail
        with cupy.cuda.ExternalStream(self.stream):
            self.kernel(self.grid, self.block, args, shared_mem=self.shared)
        self.runs += 1
