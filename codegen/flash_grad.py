"""The gradient of float32 attention on tensor cores (compute capability 8.0 and up): dq, dk
and dv of ``out = softmax(scale * q @ k^T + bias) @ v`` from the output's gradient, never
writing the [Sq, Skv] scores, in the same three-TF32 products as the forward kernel
(``flash_mma.py``, whose helpers it shares).

With ``P`` the probabilities, ``dO`` the output's gradient and ``delta`` each query row's
``sum(dO * out)`` (which equals ``sum(P * dP)``):

    dP = dO v^T,  dS = P * (dP - delta),  dv = P^T dO,  dk = scale dS^T q,  dq = scale dS k

Three launches on saturn's stream:

1. where the row log-sum-exp is not given (a compiled graph, whose forward does not keep
   it), the forward kernel once more into the plan's workspace, for it;
2. ``flash_f32_pre``: ``delta`` per query row, and dq zeroed (one warp a row);
3. ``flash_f32_grad``: a block owns ``16 * warps`` keys of one (batch, head), a warp 16 of
   them, and walks the queries ``rows`` at a time. A warp recomputes its keys' scores
   transposed (``S^T = k q^T``: its rows are its keys, so dk and dv accumulate in its
   registers over every query tile) and ``dP^T = v dO^T``, turns them into ``P^T`` and
   ``dS^T`` with the rows' log-sum-exp and ``delta``, and adds ``P^T dO`` to dv and
   ``dS^T q`` to dk (both through the warp's own rows of shared memory, from the
   accumulator's fragment layout to the operand's). The block's ``dS^T`` then gives the
   query tile's share of dq, ``dS k`` over the block's keys, a 16-row tile a warp, added
   to dq in global memory atomically (each dq element receives one addition per key block,
   in no fixed order: dq is not bit-reproducible, as PyTorch's fused attention backward
   kernels are not).

Legality is the forward's: the same products in another summation order, ``ex2.approx``
for the exponentials (2^-22 relative), three TF32 products for each float32 one. A query
row whose every key is masked (log-sum-exp -inf) has probabilities 0 and so gradients 0,
as aten's math (``_safe_softmax``) gives. Under a causal mask (PyTorch's top-left band) a
block skips the query tiles that see none of its keys.

Operands: [B, H, S, D] with the head dimension contiguous, any other strides, key and value
heads equal to the query's (grouped-query heads are expanded by the caller, who sums their
gradients); the bias as the forward reads it. Its gradient is not computed (a bias that
needs one keeps aten's math).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saturn.eqsat.program import packed_strides

from . import flash_mma
from .attention import AttentionError, check_grads
from .flash_attention import FlashPlan, check_bias, check_operands
from .gemm import Layout, raw_kernel


@dataclass(frozen=True)
class GradTile:
    """``warps`` warps a block, 16 keys each; ``rows`` queries a step (a multiple of 16:
    the block's dq tile is split into 16-row tiles among its warps); ``blocks``: the
    blocks a SM the kernel's registers are bounded for."""

    warps: int = 4
    rows: int = 64
    blocks: int = 2

    @property
    def keys(self) -> int:
        return 16 * self.warps


def config(d: int) -> GradTile:
    """Up to head size 64, 64 queries a step and two blocks a SM; above, 32 (a warp's dk
    and dv accumulators take D registers, its scores and their gradients ``rows``)."""
    return GradTile() if d <= 64 else GradTile(rows=32, blocks=1)


def shared_bytes(d: int, tile: GradTile) -> int:
    """K and V tiles [keys][d + 4], Q and dO tiles [rows][d + 4], P^T / dS^T
    [keys][rows + 8], and the rows' log-sum-exp and delta, in float32."""
    dp, pp = d + 4, tile.rows + 8
    return 4 * (2 * tile.keys * dp + 2 * tile.rows * dp + tile.keys * pp + 2 * tile.rows)


def check(d: int, tile: GradTile) -> None:
    if d % 8 or d > 128 or tile.rows % 16 or tile.warps < 1:
        raise AttentionError(f"head dimension {d}, tile {tile}: a multiple of 8 up to 128")


PRE_PARAMS = """const float* __restrict__ out, const float* __restrict__ dout,
    float* __restrict__ dq, float* __restrict__ delta, int H, int Sq,
    long long osb, long long osh, long long oss, long long gsb, long long gsh, long long gss,
    long long dqsb, long long dqsh, long long dqss"""

# The operands', gradients' and statistics' pointers, sizes, the scale, then the strides of
# batch, head and row (q, k, v, dO, dq, dk, dv) and of the bias's four axes (0: broadcast)
GRAD_PARAMS = """const float* __restrict__ q, const float* __restrict__ k,
    const float* __restrict__ v, const float* __restrict__ dout, float* __restrict__ dq,
    float* __restrict__ dk, float* __restrict__ dv, const float* __restrict__ bias,
    const float* __restrict__ lse, const float* __restrict__ delta,
    int H, int Sq, int Skv, float scale,
    long long qsb, long long qsh, long long qss, long long ksb, long long ksh, long long kss,
    long long vsb, long long vsh, long long vss, long long gsb, long long gsh, long long gss,
    long long dqsb, long long dqsh, long long dqss, long long dksb, long long dksh,
    long long dkss, long long dvsb, long long dvsh, long long dvss,
    long long bsb, long long bsh, long long bsq, long long bsk"""

_DEFINES = r"""
#define NT (NW * 32)
#define BKV (16 * NW)
#define DP (D + 4)
#define PP (BQ + 8)
#define INF __int_as_float(0x7f800000)
"""

_KERNELS = r"""
// delta = sum(dO * out) per query row, and the row of dq zeroed: one warp a row
extern "C" __global__ void flash_f32_pre(PRE_PARAMS) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= Sq) return;
  const int bh = blockIdx.y, b = bh / H, h = bh - b * H;
  const float* o = out + b * osb + h * osh + row * oss;
  const float* g = dout + b * gsb + h * gsh + row * gss;
  float* r = dq + b * dqsb + h * dqsh + row * dqss;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) {
    s = fmaf(o[d], g[d], s);
    r[d] = 0.f;
  }
#pragma unroll
  for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (lane == 0) delta[(long long)bh * Sq + row] = s;
}

// c += a b over the 8-wide steps of a [16][kn] operand ``a`` (row stride as) read at rows
// ar.. of shared memory and a [kn][D] one ``b`` (row stride bs): a warp's 16 x D product
__device__ __forceinline__ void rows_times(float (*c)[4], const float* a, int as, const float* b,
                                           int bs, int kn) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int kk = 0; kk < kn; kk += 8) {
    unsigned ab[4], al[4];
    const float* ar = a + g * as + kk + t;
    split(ar[0], ab[0], al[0]);
    split(ar[8 * as], ab[1], al[1]);
    split(ar[4], ab[2], al[2]);
    split(ar[8 * as + 4], ab[3], al[3]);
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      const float* br = b + (kk + t) * bs + j * 8 + g;
      unsigned b0, s0, b1, s1;
      split(br[0], b0, s0);
      split(br[4 * bs], b1, s1);
      mma3(c[j], ab, al, b0, b1, s0, s1);
    }
  }
}

extern "C" __global__ void __launch_bounds__(NT, MINB) flash_f32_grad(GRAD_PARAMS) {
  extern __shared__ __align__(16) float smem[];
  float* Ks = smem;           // [BKV][DP]
  float* Vs = Ks + BKV * DP;  // [BKV][DP]
  float* Qs = Vs + BKV * DP;  // [BQ][DP]
  float* Gs = Qs + BQ * DP;   // dO [BQ][DP]
  float* Ps = Gs + BQ * DP;   // P^T, then dS^T [BKV][PP]
  float* Ls = Ps + BKV * PP;  // [BQ] the rows' log-sum-exp, base 2
  float* Es = Ls + BQ;        // [BQ] the rows' delta
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int k0 = blockIdx.x * BKV, bh = blockIdx.y, b = bh / H, h = bh - b * H;
  const int r0 = 16 * w;  // the warp's first key row in the block
  const float* qb = q + b * qsb + h * qsh;
  const float* kb = k + b * ksb + h * ksh;
  const float* vb = v + b * vsb + h * vsh;
  const float* gb = dout + b * gsb + h * gsh;
  float* dqb = dq + b * dqsb + h * dqsh;
  const float LOG2E = 1.4426950408889634f;
  const float sl = scale * LOG2E;  // scores in base 2: exp2(x log2 e) = exp(x)
  load_tile(Ks, DP, kb, kss, k0, BKV, Skv);
  load_tile(Vs, DP, vb, vss, k0, BKV, Skv);
  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; j++)
#pragma unroll
    for (int c = 0; c < 4; c++) dka[j][c] = dva[j][c] = 0.f;
  // under a causal mask the query rows before k0 see none of this block's keys
  const int qfirst = CAUSAL ? (k0 / BQ) * BQ : 0;
  for (int q0 = qfirst; q0 < Sq; q0 += BQ) {
    __syncthreads();  // the last step's Q, dO and dS^T are read
    load_tile(Qs, DP, qb, qss, q0, BQ, Sq);
    load_tile(Gs, DP, gb, gss, q0, BQ, Sq);
    for (int i = threadIdx.x; i < BQ; i += NT) {
      const int r = q0 + i;
      Ls[i] = r < Sq ? lse[(long long)bh * Sq + r] * LOG2E : -INF;
      Es[i] = r < Sq ? delta[(long long)bh * Sq + r] : 0.f;
    }
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();
    // S^T = k q^T and dP^T = v dO^T for the warp's 16 keys and the step's queries
    float st[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
    for (int n = 0; n < BQ / 8; n++)
#pragma unroll
      for (int c = 0; c < 4; c++) st[n][c] = dp[n][c] = 0.f;
#pragma unroll 2
    for (int kd = 0; kd < D; kd += 8) {
      unsigned kbig[4], ksml[4], vbig[4], vsml[4];
      const float* kr = Ks + (r0 + g) * DP + kd + t;
      const float* vr = Vs + (r0 + g) * DP + kd + t;
      split(kr[0], kbig[0], ksml[0]);
      split(kr[8 * DP], kbig[1], ksml[1]);
      split(kr[4], kbig[2], ksml[2]);
      split(kr[8 * DP + 4], kbig[3], ksml[3]);
      split(vr[0], vbig[0], vsml[0]);
      split(vr[8 * DP], vbig[1], vsml[1]);
      split(vr[4], vbig[2], vsml[2]);
      split(vr[8 * DP + 4], vbig[3], vsml[3]);
#pragma unroll
      for (int n = 0; n < BQ / 8; n++) {
        const float* qr = Qs + (n * 8 + g) * DP + kd + t;
        const float* gr = Gs + (n * 8 + g) * DP + kd + t;
        unsigned b0, s0, b1, s1;
        split(qr[0], b0, s0);
        split(qr[4], b1, s1);
        mma3(st[n], kbig, ksml, b0, b1, s0, s1);
        split(gr[0], b0, s0);
        split(gr[4], b1, s1);
        mma3(dp[n], vbig, vsml, b0, b1, s0, s1);
      }
    }
    // P^T = exp(scale s + bias - lse) (the softmax's rows are its columns), dS^T = P^T
    // (dP^T - delta); a masked score, a key or query past the end: 0
#pragma unroll
    for (int n = 0; n < BQ / 8; n++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int key = k0 + r0 + g + 8 * (c >> 1), col = n * 8 + 2 * t + (c & 1);
        const int row = q0 + col;
        const float l = Ls[col];
        bool keep = key < Skv && row < Sq && l != -INF;
        if (CAUSAL) keep = keep && key <= row;
        float x = st[n][c] * sl;
#if HAS_BIAS
        if (keep) x = fmaf(bias[b * bsb + h * bsh + row * bsq + key * bsk], LOG2E, x);
#endif
        const float p = keep ? ex2(x - l) : 0.f;
        st[n][c] = p;
        dp[n][c] = p * (dp[n][c] - Es[col]);
      }
    float* Pw = Ps + r0 * PP;  // the warp's own 16 rows
#pragma unroll
    for (int n = 0; n < BQ / 8; n++) {
      *(float2*)&Pw[g * PP + n * 8 + 2 * t] = make_float2(st[n][0], st[n][1]);
      *(float2*)&Pw[(g + 8) * PP + n * 8 + 2 * t] = make_float2(st[n][2], st[n][3]);
    }
    __syncwarp();
    rows_times(dva, Pw, PP, Gs, DP, BQ);  // dv += P^T dO
    __syncwarp();                         // P^T is read before dS^T takes its place
#pragma unroll
    for (int n = 0; n < BQ / 8; n++) {
      *(float2*)&Pw[g * PP + n * 8 + 2 * t] = make_float2(dp[n][0], dp[n][1]);
      *(float2*)&Pw[(g + 8) * PP + n * 8 + 2 * t] = make_float2(dp[n][2], dp[n][3]);
    }
    __syncwarp();
    rows_times(dka, Pw, PP, Qs, DP, BQ);  // dk += dS^T q (scaled at the end)
    __syncthreads();                      // every warp's dS^T is in place
    // dq += scale dS k over the block's keys: a 16-row query tile a warp, added atomically
    for (int mq = w; mq < BQ / 16; mq += NW) {
      float acc[D / 8][4];
#pragma unroll
      for (int j = 0; j < D / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll 2
      for (int kk = 0; kk < BKV; kk += 8) {
        unsigned ab[4], al[4];
        const float* sr = Ps + (kk + t) * PP + 16 * mq + g;  // dS (row g, key kk + t)
        split(sr[0], ab[0], al[0]);
        split(sr[8], ab[1], al[1]);
        split(sr[4 * PP], ab[2], al[2]);
        split(sr[4 * PP + 8], ab[3], al[3]);
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
          const float* kr = Ks + (kk + t) * DP + j * 8 + g;
          unsigned b0, s0, b1, s1;
          split(kr[0], b0, s0);
          split(kr[4 * DP], b1, s1);
          mma3(acc[j], ab, al, b0, b1, s0, s1);
        }
      }
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int row = q0 + 16 * mq + 8 * e + g;
        if (row >= Sq) continue;
        float* dr = dqb + row * dqss + 2 * t;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
          atomicAdd(dr + j * 8, acc[j][2 * e] * scale);
          atomicAdd(dr + j * 8 + 1, acc[j][2 * e + 1] * scale);
        }
      }
    }
  }
  asm volatile("cp.async.wait_all;\n" ::);  // nothing left in flight at exit
#pragma unroll
  for (int e = 0; e < 2; e++) {
    const int key = k0 + r0 + 8 * e + g;
    if (key >= Skv) continue;
    float* kr = dk + b * dksb + h * dksh + key * dkss + 2 * t;
    float* vr = dv + b * dvsb + h * dvsh + key * dvss + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      kr[j * 8] = dka[j][2 * e] * scale;
      kr[j * 8 + 1] = dka[j][2 * e + 1] * scale;
      vr[j * 8] = dva[j][2 * e];
      vr[j * 8 + 1] = dva[j][2 * e + 1];
    }
  }
}
"""

PRE, GRAD = "flash_f32_pre", "flash_f32_grad"
PRE_WARPS = 4  # query rows a block of the first kernel


def source(d: int, causal: bool, bias: bool, tile: GradTile) -> str:
    """Both kernels' CUDA C for head dimension ``d``."""
    check(d, tile)
    defs = {"D": d, "NW": tile.warps, "BQ": tile.rows, "MINB": tile.blocks}
    defs |= {"CAUSAL": int(causal), "HAS_BIAS": int(bias)}
    text = _DEFINES + flash_mma.HELPERS + _KERNELS
    text = text.replace("PRE_PARAMS", PRE_PARAMS).replace("GRAD_PARAMS", GRAD_PARAMS)
    return "".join(f"#define {n} {x}\n" for n, x in defs.items()) + text


class FlashGradPlan:
    """dq, dk, dv of float32 attention for fixed layouts, on saturn's stream.

    ``run(ptrs, workspace)``: ``ptrs`` are q, k, v, out, dO, dq, dk, dv, then the bias where
    planned and the row log-sum-exp ([B, H, Sq] float32, packed) where ``lse`` was planned
    as given; the workspace (``workspace_size`` bytes) holds delta, and the recomputed
    log-sum-exp and output where it is not given."""

    runs = 0  # launches of the gradient kernel (tests prove which kernel ran)

    def __init__(
        self,
        q: Layout,
        k: Layout,
        v: Layout,
        out: Layout,
        dout: Layout,
        grads: tuple[Layout, Layout, Layout],
        scale: float,
        stream: int,
        bias: Layout | None = None,
        causal: bool = False,
        lse: bool = False,
        tile: GradTile | None = None,
    ):
        check_operands(q, k, v, out)
        check_operands(q, k, v, dout)
        check_grads(q, k, v, grads)
        if k.shape[1] != q.shape[1]:
            raise AttentionError("the gradient kernel takes key and value heads equal to q's")
        if bias is not None:
            check_bias(q, k, bias)
        b, h, sq, d = q.shape
        skv = k.shape[2]
        tile = tile or config(d)
        self.stream, self.has_bias, self.lse_given = stream, bias is not None, lse
        rows = b * h * sq
        self.forward = None
        self.workspace_size = 4 * rows  # delta
        if not lse:  # the forward once more, into the workspace: the log-sum-exp (and out)
            scratch = Layout("f32", q.shape, packed_strides(q.shape))
            self.forward = FlashPlan(
                q, k, v, scratch, scale, stream, bias=bias, causal=causal, stats=True
            )
            self.workspace_size += 4 * rows + 4 * rows * d
        try:
            self.shared = shared_bytes(d, tile)
            src = source(d, causal, bias is not None, tile)
            self.pre, self.grad = raw_kernel(src, PRE), raw_kernel(src, GRAD)
            self.grad.max_dynamic_shared_size_bytes = self.shared
        except Exception as e:  # a plan that cannot be built leaves the call to the math
            raise AttentionError(f"the float32 attention gradient could not be built: {e}") from e
        self.pre_grid, self.pre_block = (
            ((sq + PRE_WARPS - 1) // PRE_WARPS, b * h),
            (32 * PRE_WARPS,),
        )
        self.grid, self.block = ((skv + tile.keys - 1) // tile.keys, b * h), (32 * tile.warps,)
        dq, dk, dv = grads
        self.pre_tail = (
            np.int32(h),
            np.int32(sq),
            *(np.int64(x) for x in (*out.strides[:3], *dout.strides[:3], *dq.strides[:3])),
        )
        bstr = [0, 0, 0, 0]
        if bias is not None:  # a broadcast axis of size 1 is read at index 0 whatever its stride
            bstr = [0 if n == 1 else s for n, s in zip(bias.shape, bias.strides, strict=True)]
        strides = [x for t in (q, k, v, dout, dq, dk, dv) for x in t.strides[:3]]
        self.tail = (
            np.int32(h),
            np.int32(sq),
            np.int32(skv),
            np.float32(scale),
            *(np.int64(x) for x in strides + bstr),
        )
        self.rows = rows

    def run(self, ptrs: tuple[int, ...], workspace: int = 0) -> None:
        import cupy

        q, k, v, out, dout, dq, dk, dv, *rest = ptrs
        bias = rest.pop(0) if self.has_bias else 0
        delta = workspace
        if self.lse_given:
            lse = rest.pop(0)
        else:
            lse = workspace + 4 * self.rows
            scratch = lse + 4 * self.rows
            fwd = (q, k, v, scratch) + ((bias,) if self.has_bias else ()) + (lse,)
            self.forward.run(fwd)
        u = np.uint64
        with cupy.cuda.ExternalStream(self.stream):
            self.pre(
                self.pre_grid, self.pre_block, (u(out), u(dout), u(dq), u(delta), *self.pre_tail)
            )
            args = tuple(u(p) for p in (q, k, v, dout, dq, dk, dv, bias, lse, delta))
            self.grad(self.grid, self.block, args + self.tail, shared_mem=self.shared)
        self.runs += 1
