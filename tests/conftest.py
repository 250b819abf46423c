"""Shared fixtures: the saturn devices to test on.

saturn:0 (the CPU reference device) always runs; saturn:1 carries the `gpu` marker and
is skipped, with the reason saturn gives, where there is no GPU.
"""

from __future__ import annotations

import os

import pytest

# Tests compile with monkeypatched internals the disk cache's key cannot see (a cost, a
# rule set): each compiles afresh. tests/compile/test_compile_cache.py turns it on.
os.environ["SATURN_COMPILE_CACHE"] = "0"

# pytest-xdist's workers share the machine's cores: each gets its share of intra-op threads
# (two workers on two cores ran four threads, and the zoo's CNN tests took 15% longer;
# decision 0113). Set before torch is imported, and inherited by the processes tests start.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
    # and of kernel-build workers, which stay for the process (decision 0141): eight test
    # processes on the GPU machine's 16 cores would otherwise keep 128
    os.environ.setdefault("SATURN_BUILD_JOBS", str(max(2, (os.cpu_count() or 1) // _WORKERS)))


def _gpu_skip_reason() -> str | None:
    import torch

    import saturn  # noqa: F401

    if torch.saturn.gpu_count() > 0:
        return None
    return f"no GPU: {torch.saturn.gpu_unavailable_reason()}"


def device_params() -> list:
    reason = _gpu_skip_reason()
    return [
        pytest.param("saturn:0", id="saturn0"),
        pytest.param(
            "saturn:1",
            id="saturn1",
            marks=[pytest.mark.gpu, pytest.mark.skipif(reason is not None, reason=str(reason))],
        ),
    ]


@pytest.fixture(params=device_params())
def dev(request) -> str:
    return request.param


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords and not any(m.name == "skipif" for m in item.iter_markers()):
            reason = reason if reason is not None else (_gpu_skip_reason() or "")
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _seeded(request):
    """Every test draws the same random inputs whatever ran before it: PyTorch's and
    numpy's global generators are seeded from the test's id (tests that seed themselves
    are unaffected). Unseeded draws once depended on how much randomness earlier tests
    consumed, and a tolerance met by most draws failed on one."""
    import zlib

    import numpy as np
    import torch

    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    np.random.seed(seed)
