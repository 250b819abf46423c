"""The saturn demo: eager tensors on every saturn device, checked against the CPU.

Run with ``bash .ci/demo``. On a machine with no GPU it uses saturn:0, the CPU
reference device.
"""

from __future__ import annotations

import time

import torch

import saturn


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128), torch.nn.Linear(128, 8)
    )


def run_on(dev: str) -> None:
    torch.manual_seed(0)
    ref = _mlp()
    model = _mlp().to(dev)
    model.load_state_dict(ref.state_dict())
    x = torch.randn(32, 64)
    saturn.device_module.reset_fallback_counts()
    before = torch.saturn.memory_stats(dev)
    t0 = time.perf_counter()
    y = model(x.to(dev)).cpu()
    elapsed = time.perf_counter() - t0
    after = torch.saturn.memory_stats(dev)
    err = (y - ref(x)).abs().max().item()
    print(f"{dev}: {torch.saturn.get_device_name(dev)}")
    print(
        f"  MLP forward {tuple(x.shape)} -> {tuple(y.shape)} in {elapsed * 1e3:.1f} ms, "
        f"max |saturn - cpu| = {err:.2e}"
    )
    print(
        f"  allocator: {after['allocated']} B allocated, {after['reserved']} B reserved, "
        f"{after['hits'] - before['hits']} cache hits, {after['misses'] - before['misses']} misses"
    )
    ops = saturn.fallback_counts()
    print(
        f"  CPU fallback ran {sum(ops.values())} ops ({len(ops)} kinds): "
        + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())[:6])
        + (" ..." if len(ops) > 6 else "")
    )
    assert err < 1e-5, "saturn disagrees with the CPU"


def main() -> None:
    n = torch.saturn.device_count()
    print(f"saturn devices: {n} (saturn:0 is the CPU reference device)")
    if n == 1:
        print(f"  no GPU: {torch.saturn.gpu_unavailable_reason()}")
    for i in range(n):
        run_on(f"saturn:{i}")


if __name__ == "__main__":
    main()
