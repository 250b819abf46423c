"""saturn:0's step loop and the GPU runner each cover the kernel kinds their machine forms
(``eqsat/kinds.py``): a kind added to the registry without its runners fails here."""

from __future__ import annotations

from saturn import gpu_runner, recipe
from saturn.eqsat.kinds import Kind


def test_saturn0_runs_every_kind_its_machine_forms():
    # the cpu-reference machine forms no rows kernels (its fusion stops at loops and sums)
    assert recipe.HOST_KERNELS.covers() == set(Kind) - {Kind.ROWS}


def test_the_gpu_runner_builds_and_launches_every_kind():
    assert gpu_runner.BUILD.covers() == set(Kind)
    assert gpu_runner.LAUNCH.covers() == set(Kind)
