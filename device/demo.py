"""The saturn demo (``bash .ci/demo``).

Compiles a small transformer encoder block with ``torch.compile(backend="saturn")`` on
saturn:0 (the CPU reference device, so it runs on any machine), prints where every
operation went (``saturn.explain``), checks the result against eager PyTorch on the CPU,
and prints the time per call compiled and eager.
"""

from __future__ import annotations

import statistics
import time

import torch

import saturn

DEV = "saturn:0"


def per_call_ms(fn, x, repeats: int = 20) -> float:
    fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    n = torch.saturn.device_count()
    print(f"saturn devices: {n} (saturn:0 is the CPU reference device)")
    if n == 1:
        print(f"  no GPU: {torch.saturn.gpu_unavailable_reason()}")
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 16, 64)
    on_dev = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    on_dev.load_state_dict(block.state_dict())
    on_dev = on_dev.to(DEV)
    xd = x.to(DEV)
    options = {"device": DEV}
    with torch.no_grad():
        print("\n" + str(saturn.explain(on_dev, xd, options=options)) + "\n")
        compiled = torch.compile(on_dev, backend="saturn", options=options, dynamic=False)
        want = block(x)
        got = compiled(xd).cpu()
        err = ((got - want).abs().max() / want.abs().max()).item()
        print(f"compiled vs eager CPU: max relative error {err:.2e}")
        if err > 1e-5:
            raise SystemExit("saturn disagrees with eager PyTorch")
        t_eager_cpu = per_call_ms(block, x)
        t_eager_dev = per_call_ms(on_dev, xd, repeats=5)
        t_comp = per_call_ms(compiled, xd)
    print(f"time per call, {tuple(x.shape)} input (median):")
    print(f"  eager PyTorch, CPU tensors:           {t_eager_cpu:8.2f} ms")
    print(f"  eager on saturn:0 (CPU fallback):     {t_eager_dev:8.2f} ms")
    print(f"  torch.compile(backend='saturn'):      {t_comp:8.2f} ms")
    print("(saturn:0 runs generated Numba loops on the CPU; it is the reference for the GPU,")
    print(" not a fast CPU backend)")


if __name__ == "__main__":
    main()
