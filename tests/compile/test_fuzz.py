"""The random-program fuzzer (``fuzz.py``) against eager PyTorch on the CPU: values,
NaN positions and signs of zero, output ownership, and writes to the inputs between two
calls. Seeded and bounded: a fixed set of programs in CI on saturn:0 (half with saturn
inputs, half with CPU inputs compiled for saturn:0), a longer run on the GPU."""

from __future__ import annotations

import os

import pytest

from . import fuzz

CI_SEEDS = range(160)
# a longer run: SATURN_GPU_SEEDS=2000 python -m pytest -m gpu tests/compile/test_fuzz.py
GPU_SEEDS = range(int(os.environ.get("SATURN_GPU_SEEDS", 150)))
# in chunks, which pytest-xdist spreads over its workers
GPU_CHUNKS = [GPU_SEEDS[i : i + 50] for i in range(0, len(GPU_SEEDS), 50)]


pytestmark = pytest.mark.usefixtures("quiet_saturn")


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_random_program_on_saturn0(seed):
    program = fuzz.generate(seed)
    problems = fuzz.check(program, "saturn:0", seed, io="device" if seed % 2 else "cpu")
    assert not problems, program.source + "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("seeds", GPU_CHUNKS, ids=lambda r: f"{r.start}-{r.stop}")
def test_random_programs_on_the_gpu(seeds):
    import torch

    import saturn  # noqa: F401

    if torch.saturn.gpu_count() == 0:
        pytest.skip("no GPU")
    failed = []
    for seed in seeds:
        program = fuzz.generate(seed)
        problems = fuzz.check(program, "saturn:1", seed, io="device" if seed % 3 else "cpu")
        if problems:
            failed.append(program.source + "\n".join(problems))
    assert not failed, f"{len(failed)} of {len(seeds)} programs:\n" + "\n\n".join(failed[:5])
