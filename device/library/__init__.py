"""Custom ops that ship with saturn, each an example of one kind of implementation:

* ``saturn::rmsnorm(x, weight, eps)``: a Numba CUDA kernel (float32), with a pattern
  (``rmsnorm.egg``, ruleset ``rmsnorm``) that finds RMSNorm written out in PyTorch;
* ``saturn::gelu_fast(x)``: tanh-GELU as an elementwise expression (fuses with neighbours);
* ``saturn::softmax(self, dim, half_to_float)``: a softmax over the last axis as a Numba
  CUDA kernel (float32) that replaces ``aten::_softmax``: eager softmax on saturn GPU tensors
  and compiled graphs for a GPU use it where it applies, the reference elsewhere.

``import saturn.library`` defines them (once).
"""

from __future__ import annotations

import math
from pathlib import Path

import numba
import torch
from numba import cuda

from saturn.custom_ops import REGISTRY, custom_op

THREADS = 256


@cuda.jit(device=True, inline="always")
def _block_sum(part, tid, acc):
    """Sum ``acc`` over the block into ``part[0]`` (a shared tree reduction)."""
    part[tid] = acc
    cuda.syncthreads()
    s = THREADS // 2
    while s > 0:
        if tid < s:
            part[tid] += part[tid + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit
def _rmsnorm_kernel(out, x, w, n, eps):
    # one block per row of n elements; tensors arrive packed and flattened
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    part = cuda.shared.array(THREADS, numba.float32)
    base = row * n
    acc = numba.float32(0.0)
    i = tid
    while i < n:
        v = x[base + i]
        acc += v * v
        i += THREADS
    _block_sum(part, tid, acc)
    scale = numba.float32(1.0) / math.sqrt(part[0] / numba.float32(n) + eps)
    i = tid
    while i < n:
        out[base + i] = x[base + i] * scale * w[i]
        i += THREADS


def _rows(x: torch.Tensor) -> tuple[int, int]:
    n = x.shape[-1] if x.dim() else 1
    return (x.numel() // n if n else 0), n


def _rmsnorm_launch(x, weight, eps):
    rows, n = _rows(x)
    return max(rows, 1), THREADS, 0, (n, numba.float32(eps))


def _rmsnorm_reference(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@cuda.jit
def _softmax_kernel(out, x, n):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    part = cuda.shared.array(THREADS, numba.float32)
    base = row * n
    m = numba.float32(-math.inf)
    i = tid
    while i < n:
        v = x[base + i]
        if v > m or v != v:  # NaN propagates
            m = v
        i += THREADS
    part[tid] = m
    cuda.syncthreads()
    s = THREADS // 2
    while s > 0:
        if tid < s:
            a, b = part[tid], part[tid + s]
            part[tid] = b if (b > a or b != b) else a
        cuda.syncthreads()
        s //= 2
    m = part[0]
    cuda.syncthreads()
    acc = numba.float32(0.0)
    i = tid
    while i < n:
        acc += math.exp(x[base + i] - m)
        i += THREADS
    _block_sum(part, tid, acc)
    total = part[0]
    i = tid
    while i < n:
        out[base + i] = math.exp(x[base + i] - m) / total
        i += THREADS


def _softmax_launch(self, dim, half_to_float):
    rows, n = _rows(self)
    return max(rows, 1), THREADS, 0, (n,)


def _softmax_reference(self, dim, half_to_float):
    return torch.ops.aten._softmax.default(self, dim, half_to_float)


def _softmax_when(self, dim, half_to_float) -> bool:
    """The kernel reduces the last axis, in the input's dtype."""
    return self.dim() > 0 and dim % self.dim() == self.dim() - 1 and not half_to_float


def _gelu_reference(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


# 0.5 * (1 + tanh(z)) = sigmoid(2z): tanh-GELU with one transcendental
GELU_FAST = (
    "(Mul x (Sigmoid (Mul (Scalar 1.5957691216057308 T)"
    " (Add x (Mul (Scalar 0.044715 T) (Mul x (Mul x x)))))))"
)


def _define() -> None:
    if "saturn::rmsnorm" in REGISTRY:
        return
    custom_op(
        "saturn::rmsnorm",
        "(Tensor x, Tensor weight, float eps) -> Tensor",
        reference=_rmsnorm_reference,
        dtypes=(torch.float32,),
        kernel=_rmsnorm_kernel,
        launch=_rmsnorm_launch,
        pattern=Path(__file__).with_name("rmsnorm.egg"),
    )
    custom_op(
        "saturn::gelu_fast",
        "(Tensor x) -> Tensor",
        reference=_gelu_reference,
        dtypes=(torch.float32, torch.float64),
        expression=GELU_FAST,
    )
    custom_op(
        "saturn::softmax",
        "(Tensor self, int dim, bool half_to_float) -> Tensor",
        reference=_softmax_reference,
        dtypes=(torch.float32,),
        kernel=_softmax_kernel,
        launch=_softmax_launch,
        replaces="aten::_softmax",
        when=_softmax_when,
    )


_define()
rmsnorm = REGISTRY["saturn::rmsnorm"]
gelu_fast = REGISTRY["saturn::gelu_fast"]
softmax = REGISTRY["saturn::softmax"]
