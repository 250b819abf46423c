"""The shipped custom ops' Numba kernels under the CUDA simulator (no GPU; a separate
process), against numpy: RMSNorm and softmax rows, with a row longer than a block."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKS = Path(__file__).resolve().parents[1] / "codegen"  # cudasim_blocks.py

SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, {blocks!r})
import cudasim_blocks  # the block scheduler the simulator tests share
cudasim_blocks.install()
import saturn.library as L
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 300)).astype(np.float32)
w = (rng.random(300) + 0.5).astype(np.float32)
out = np.full_like(x, np.nan)
L._rmsnorm_kernel[3, L.THREADS](out.reshape(-1), x.reshape(-1), w, 300, np.float32(1e-6))
want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
assert np.allclose(out, want, rtol=1e-5, atol=1e-6), np.abs(out - want).max()
x[1, 7] = np.nan
out = np.full_like(x, -1.0)
L._softmax_kernel[3, L.THREADS](out.reshape(-1), x.reshape(-1), 300)
e = np.exp(x - x.max(-1, keepdims=True))
want = e / e.sum(-1, keepdims=True)
assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any()
assert np.allclose(out[[0, 2]], want[[0, 2]], rtol=1e-5, atol=1e-7)
print("ok")
"""


@pytest.mark.slow
def test_library_kernels_under_the_cuda_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(blocks=str(BLOCKS))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]
