"""The float32 attention kernel on tensor cores (compute capability 8.0 and up): the same
online softmax as ``flash_attention.py``'s kernel, with both products as warp-level
``mma.sync`` m16n8k8 TF32 instructions, each float32 product split into three TF32 ones.

Why three: a TF32 operand keeps 10 of float32's 23 mantissa bits. Writing each operand as
``big + small`` (``big`` its TF32 rounding, ``small`` the TF32 rounding of the rest) gives
``a b = big_a big_b + big_a small_b + small_a big_b + small_a small_b``; the last term is
below 2^-22 of the product and is dropped, so each product keeps about float32's accuracy
(CUTLASS's "3xTF32", what PyTorch's float32 memory-efficient attention runs on these
cards). Accumulation is float32 throughout. TF32 alone (PyTorch's ``allow_tf32``) is never
used: the result stays within float32's rounding of the math, as the tests check.

Layout: a block of ``warps`` warps owns ``mtiles`` 16-row tiles of queries per warp, of one
(batch, head), and walks the keys ``keys`` at a time; exponentials are ``ex2.approx`` of
scores scaled by log2(e). The query, key and value tiles sit in shared memory
(rows padded so that the fragments' reads fall in distinct banks: +4 floats where a
fragment reads a row per lane group, +8 where it reads a column), the key and value tiles
copied with ``cp.async`` while the block computes. A warp's probabilities go through its
own shared rows to change from the accumulator's fragment layout to the operand's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention import AttentionError


@dataclass(frozen=True)
class MmaTile:
    """``warps`` warps a block, each owning ``mtiles`` tiles of 16 query rows; ``keys``
    keys a step; ``blocks``: the blocks a SM that the kernel's registers must allow."""

    warps: int = 4
    keys: int = 64
    blocks: int = 2  # blocks a SM the registers are bounded for
    mtiles: int = 1  # 16-row tiles a warp owns (each key and value fragment serves all)

    @property
    def rows(self) -> int:
        """Query rows a block owns."""
        return 16 * self.warps * self.mtiles


def shared_bytes(d: int, tile: MmaTile) -> int:
    """The query tile [rows][d + 4], the key tile [keys][d + 4], the value tile
    [keys][d + 8], and each warp's probabilities [16 x mtiles][keys + 4], in float32."""
    bq = tile.rows
    return 4 * (bq * (d + 4) + tile.keys * (d + 4) + tile.keys * (d + 8) + bq * (tile.keys + 4))


def check(d: int, tile: MmaTile) -> None:
    if d % 8 or tile.keys % 8 or tile.warps < 1:
        raise AttentionError(f"head dimension {d}, tile {tile}: multiples of 8")


# Both kernels' parameters, in the order ``FlashPlan.run`` passes them: the operands' and
# output's pointers, sizes, the scale, then the strides of batch, head and row (q, k, v, out)
# and of the bias's four axes (0 where it broadcasts)
PARAMS = """const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    float* __restrict__ out, const float* __restrict__ bias, float* __restrict__ lse,
    int H, int G, int Sq, int Skv, float scale,
    long long qsb, long long qsh, long long qss, long long ksb, long long ksh, long long kss,
    long long vsb, long long vsh, long long vss, long long osb, long long osh, long long oss,
    long long bsb, long long bsh, long long bsq, long long bsk"""

# Fragments (PTX ISA, mma.m16n8k8 .tf32): lane = 4 g + t. A (16 x 8, row major): a0 (g, t),
# a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4). B (8 x 8, column major): b0 (t, g),
# b1 (t + 4, g). C (16 x 8): c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
_DEFINES = r"""
#define NT (NW * 32)
#define WR (16 * MT)
#define BQ (NW * WR)
#define DQ (D + 4)
#define DV (D + 8)
#define PP (BK + 4)
#define INF __int_as_float(0x7f800000)

"""

# The tensor-core helpers (TF32 splits, mma, exp2, asynchronous tile copies), shared with
# the gradient kernel (``flash_grad.py``); ``load_tile`` reads the macros ``D`` and ``NT``.
HELPERS = r"""
__device__ __forceinline__ unsigned tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// x as big + small, both TF32
__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
  big = tf32(x);
  small = tf32(x - __uint_as_float(big));
}

// 2^x in one instruction (MUFU: relative error below 2^-22; 2^-inf = 0)
__device__ __forceinline__ float ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a b as three TF32 products, the small terms first
__device__ __forceinline__ void mma3(float* c, const unsigned* ab, const unsigned* as,
                                     unsigned bb0, unsigned bb1, unsigned bs0, unsigned bs1) {
  mma(c, as, bb0, bb1);
  mma(c, ab, bs0, bs1);
  mma(c, ab, bb0, bb1);
}

// rows [r0, r0 + n) of a [rows][D] operand (row stride rs) into a tile of row stride ds,
// zeros past ``limit``, copied asynchronously (one commit group)
__device__ __forceinline__ void load_tile(float* dst, int ds, const float* src, long long rs,
                                          int r0, int n, int limit) {
  for (int e = threadIdx.x; e < n * D; e += NT) {
    const int r = e / D, d = e - r * D;
    const bool ok = r0 + r < limit;
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst + r * ds + d);
    const float* g = ok ? src + (r0 + r) * rs + d : src;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a), "l"(g),
                 "r"(ok ? 4 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

"""

_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(NT, MINB) flash_f32_mma(
    PARAMS) {
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;          // [BQ][DQ]
  float* Ks = Qs + BQ * DQ;  // [BK][DQ]
  float* Vs = Ks + BK * DQ;  // [BK][DV]
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  float* Pw = Vs + BK * DV + w * WR * PP;  // this warp's [WR][PP]
  // the last query blocks first: under a causal mask they walk the most keys
  const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BQ, bh = blockIdx.y;
  const int b = bh / H, h = bh - b * H, hk = h / G;
  const float* qb = q + b * qsb + h * qsh;
  const float* kb = k + b * ksb + hk * ksh;
  const float* vb = v + b * vsb + hk * vsh;
  const float LOG2E = 1.4426950408889634f;
  scale *= LOG2E;  // scores in base 2: exp2(x log2 e) = exp(x)
  const int r0 = w * WR;  // the warp's first row; its row (i, e) is r0 + 16 i + 8 e + g
  load_tile(Qs, DQ, qb, qss, q0, BQ, Sq);
  const int kend = CAUSAL ? min(Skv, q0 + BQ) : Skv;
  load_tile(Ks, DQ, kb, kss, 0, BK, Skv);
  float o[MT][D / 8][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int i = 0; i < MT; i++) {
    m[i][0] = m[i][1] = -INF;
    l[i][0] = l[i][1] = 0.f;
#pragma unroll
    for (int j = 0; j < D / 8; j++) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
  }
  for (int k0 = 0; k0 < kend; k0 += BK) {
    load_tile(Vs, DV, vb, vss, k0, BK, Skv);
    asm volatile("cp.async.wait_group 1;\n" ::);  // Q and this step's K have landed
    __syncthreads();
    // no key of this step is masked for any of the warp's rows: no test per score
    const bool full = k0 + BK <= Skv && (!CAUSAL || k0 + BK - 1 <= q0 + r0);
    float s[MT][BK / 8][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
      for (int n = 0; n < BK / 8; n++) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.f;
#pragma unroll 2
    for (int kd = 0; kd < D; kd += 8) {
      unsigned ab[MT][4], as[MT][4];
#pragma unroll
      for (int i = 0; i < MT; i++) {
        const float* qr = Qs + (r0 + 16 * i + g) * DQ + kd + t;
        split(qr[0], ab[i][0], as[i][0]);
        split(qr[8 * DQ], ab[i][1], as[i][1]);
        split(qr[4], ab[i][2], as[i][2]);
        split(qr[8 * DQ + 4], ab[i][3], as[i][3]);
      }
#pragma unroll
      for (int n = 0; n < BK / 8; n++) {
        const float* kr = Ks + (n * 8 + g) * DQ + kd + t;
        unsigned bb0, bs0, bb1, bs1;
        split(kr[0], bb0, bs0);
        split(kr[4], bb1, bs1);
#pragma unroll
        for (int i = 0; i < MT; i++) mma3(s[i][n], ab[i], as[i], bb0, bb1, bs0, bs1);
      }
    }
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int row = q0 + r0 + 16 * i + 8 * e + g;
      float mx = -INF;
#pragma unroll
      for (int n = 0; n < BK / 8; n++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
          const int col = k0 + n * 8 + 2 * t + u;
          float x = s[i][n][2 * e + u] * scale;
#if HAS_BIAS
          if (row < Sq && (full || col < Skv))
            x = fmaf(bias[b * bsb + h * bsh + row * bsq + col * bsk], LOG2E, x);
#endif
          if (!full && (col >= Skv || (CAUSAL && col > row))) x = -INF;
          s[i][n][2 * e + u] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[i][e], mx);
      const float base = mn == -INF ? 0.f : mn;  // a row masked so far stays 0
      const float alpha = ex2(m[i][e] - base);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < BK / 8; n++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
          const float p = ex2(s[i][n][2 * e + u] - base);
          s[i][n][2 * e + u] = p;
          sum += p;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[i][e] = l[i][e] * alpha + sum;
      m[i][e] = mn;
#pragma unroll
      for (int j = 0; j < D / 8; j++) {
        o[i][j][2 * e] *= alpha;
        o[i][j][2 * e + 1] *= alpha;
      }
#pragma unroll
      for (int n = 0; n < BK / 8; n++)
        *(float2*)&Pw[(16 * i + 8 * e + g) * PP + n * 8 + 2 * t] =
            make_float2(s[i][n][2 * e], s[i][n][2 * e + 1]);
    }
    __syncthreads();  // every warp has read K; P is written
    if (k0 + BK < kend) {
      load_tile(Ks, DQ, kb, kss, k0 + BK, BK, Skv);  // the next step's K, during this PV
    } else {
      asm volatile("cp.async.commit_group;\n" ::);  // an empty group keeps the count
    }
    asm volatile("cp.async.wait_group 1;\n" ::);  // this step's V has landed
    __syncthreads();
#pragma unroll 2
    for (int kk = 0; kk < BK; kk += 8) {
      unsigned ab[MT][4], as[MT][4];
#pragma unroll
      for (int i = 0; i < MT; i++) {
        const float* pr = Pw + (16 * i + g) * PP + kk + t;
        split(pr[0], ab[i][0], as[i][0]);
        split(pr[8 * PP], ab[i][1], as[i][1]);
        split(pr[4], ab[i][2], as[i][2]);
        split(pr[8 * PP + 4], ab[i][3], as[i][3]);
      }
#pragma unroll
      for (int j = 0; j < D / 8; j++) {
        const float* vr = Vs + (kk + t) * DV + j * 8 + g;
        unsigned bb0, bs0, bb1, bs1;
        split(vr[0], bb0, bs0);
        split(vr[4 * DV], bb1, bs1);
#pragma unroll
        for (int i = 0; i < MT; i++) mma3(o[i][j], ab[i], as[i], bb0, bb1, bs0, bs1);
      }
    }
    __syncthreads();  // V and P are read before the next step refills them
  }
  asm volatile("cp.async.wait_all;\n" ::);  // nothing left in flight at exit
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
  for (int e = 0; e < 2; e++) {
    const int row = q0 + r0 + 16 * i + 8 * e + g;
    if (row >= Sq) continue;
    const float inv = l[i][e] > 0.f ? 1.f / l[i][e] : 0.f;
    float* ob = out + b * osb + h * osh + row * oss + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      ob[j * 8] = o[i][j][2 * e] * inv;
      ob[j * 8 + 1] = o[i][j][2 * e + 1] * inv;
    }
#if HAS_LSE
    const float lrow = m[i][e] * 0.6931471805599453f + logf(l[i][e]);  // back to natural logs
    if (t == 0) lse[(long long)bh * Sq + row] = l[i][e] > 0.f ? lrow : -INF;
#endif
  }
}
"""

KERNEL = "flash_f32_mma"


def source(d: int, causal: bool, bias: bool, lse: bool, tile: MmaTile) -> str:
    """The kernel's CUDA C for head dimension ``d``."""
    check(d, tile)
    defs = {"D": d, "NW": tile.warps, "MT": tile.mtiles, "BK": tile.keys, "MINB": tile.blocks}
    defs |= {"CAUSAL": int(causal), "HAS_BIAS": int(bias), "HAS_LSE": int(lse)}
    return "".join(f"#define {n} {x}\n" for n, x in defs.items()) + (
        _DEFINES + HELPERS + _KERNEL
    ).replace("PARAMS", PARAMS)
