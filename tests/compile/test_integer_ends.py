"""Integer programs at both ends of every integer dtype (``int_fuzz.py``), compiled by
saturn and bit-equal to eager PyTorch on the CPU: wraparound, truncating and flooring
division, promotion and casts as PyTorch does them. Seeded: a fixed set on saturn:0 in CI,
a longer run on the GPU."""

from __future__ import annotations

import os

import pytest

from . import int_fuzz
from .helpers import last_compiled

CI_SEEDS = range(100)
# a longer run: SATURN_GPU_SEEDS=2000 python -m pytest -m gpu tests/compile/test_integer_ends.py
GPU_SEEDS = range(int(os.environ.get("SATURN_GPU_SEEDS", 300)))
# in chunks, which pytest-xdist spreads over its workers
GPU_CHUNKS = [GPU_SEEDS[i : i + 50] for i in range(0, len(GPU_SEEDS), 50)]


pytestmark = pytest.mark.usefixtures("quiet_saturn")


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_integer_program_on_saturn0(seed):
    program = int_fuzz.generate(seed)
    problems = int_fuzz.check(program, "saturn:0")
    assert not problems, program.source + "\n".join(problems)


def test_int32_and_int64_programs_run_fused_kernels():
    """The programs above test the kernels, not only PyTorch's host ops: int32 and int64
    arithmetic is placed on the device (int8, int16 and uint8 run PyTorch's kernels)."""
    kernels = 0
    for seed in range(3, 60, 5):  # seed % 5 == 3: int32 first inputs
        int_fuzz.check(int_fuzz.generate(seed), "saturn:0")
        kernels += len(last_compiled().compiled.program.kernels)
    assert kernels >= 12, kernels


@pytest.mark.gpu
@pytest.mark.parametrize("seeds", GPU_CHUNKS, ids=lambda r: f"{r.start}-{r.stop}")
def test_integer_programs_on_the_gpu(seeds):
    import torch

    import saturn  # noqa: F401

    if torch.saturn.gpu_count() == 0:
        pytest.skip("no GPU")
    failed = []
    for seed in seeds:
        program = int_fuzz.generate(seed)
        try:
            problems = int_fuzz.check(program, "saturn:1")
        except Exception as e:
            problems = [f"raised {type(e).__name__}: {e}"]
        if problems:
            failed.append(program.source + "\n".join(problems))
    assert not failed, f"{len(failed)} of {len(seeds)} programs:\n" + "\n\n".join(failed[:5])
