"""Per-call time of model blocks: eager PyTorch, Inductor (default and reduce-overhead) and
saturn, in one process, inference only (no_grad), float32.

What is timed, for each workload and each implementation, after warm-up calls:
  call   wall time of one call including a device synchronize after it (end to end),
         median of REPEATS calls
  host   wall time until the call returns, without waiting for the device: the host cost
         (median of REPEATS calls, each preceded by a synchronize)
Workloads (tests/compile/blocks.py): MLP (Linear, tanh-GELU, Linear), TransformerEncoderLayer
(8 heads, 4x feed-forward, no dropout), ResNet basic block (eval), a language model's input
block (token and position embeddings of a 32000-token vocabulary, layer norm), each at a
small and a large size. TF32 off everywhere (torch's matmul default; cuDNN's TF32 turned
off for eager and Inductor so that all compute float32); "saturn tf32x3" is saturn with that option
(float32 GEMMs as three TF32 products of split operands where that is faster, float32-level
accuracy: see its max error column).

With --bf16, the MLP, encoder and embedding workloads in bfloat16 (models and float inputs
converted; eager and Inductor in bfloat16 on CUDA, their products on tensor cores), against
the CPU's bfloat16 eager output for the error column; no tf32x3 column. The ResNet block is
left out: saturn's convolutions are float32/float64 plans, so a bfloat16 one runs on the
host.

    python bench/blocks.py [--bf16] [workload ...]      (on a GPU machine)
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

import torch

import saturn  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.compile.blocks import WORKLOADS, make

GPU = "saturn:1"
REPEATS = 50


def timed(fn, x, sync) -> tuple[float, float]:
    for _ in range(5):
        fn(x)
    sync()
    calls, hosts = [], []
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter()
        fn(x)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        hosts.append(t1 - t0)
        calls.append(t2 - t0)
    return statistics.median(calls) * 1e6, statistics.median(hosts) * 1e6


def saturn_sync() -> None:
    torch.saturn.synchronize(GPU)


def start() -> None:
    """TF32 off for eager and Inductor (every product computes float32), and the header."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")


def main(names: list[str], dtype: torch.dtype = torch.float32) -> None:
    start()
    cuda_sync = torch.cuda.synchronize
    print(f"{'workload':22s} {'impl':24s} {'call us':>9s} {'host us':>9s} {'max err':>9s}")
    summary = []
    for name in names:
        model, x = make(name)
        model = model.to(dtype)
        x = x.to(dtype) if x.is_floating_point() else x  # token ids stay integers
        with torch.no_grad():
            want = model(x)
            m_cuda = copy.deepcopy(model).cuda()
            xc = x.cuda()
            rows = {}
            rows["eager"] = (*timed(m_cuda, xc, cuda_sync), m_cuda(xc))
            torch._dynamo.reset()
            ind = torch.compile(m_cuda, dynamic=False)
            rows["inductor"] = (*timed(ind, xc, cuda_sync), ind(xc))
            torch._dynamo.reset()
            ind_ro = torch.compile(m_cuda, mode="reduce-overhead", dynamic=False)
            rows["inductor reduce-overhead"] = (*timed(ind_ro, xc, cuda_sync), ind_ro(xc).clone())
            torch._dynamo.reset()
            sat = torch.compile(copy.deepcopy(model).to(GPU), backend="saturn", dynamic=False)
            xs = x.to(GPU)
            rows["saturn"] = (*timed(sat, xs, saturn_sync), sat(xs))
            torch._dynamo.reset()
            sat3 = None
            if dtype == torch.float32:
                sat3 = torch.compile(
                    copy.deepcopy(model).to(GPU),
                    backend="saturn",
                    options={"tf32x3": True},
                    dynamic=False,
                )
                rows["saturn tf32x3"] = (*timed(sat3, xs, saturn_sync), sat3(xs))
        for impl, (call, host, out) in rows.items():
            err = (out.cpu().float() - want.float()).abs().max().item()
            print(f"{name:22s} {impl:24s} {call:9.1f} {host:9.1f} {err:9.2e}")
        best_ind = min(rows["inductor"][0], rows["inductor reduce-overhead"][0])
        for impl in ("saturn", "saturn tf32x3"):
            if impl in rows:
                s = rows[impl][0]
                summary.append((f"{name} {impl[7:]}", rows["eager"][0] / s, best_ind / s))
        del m_cuda, xc, ind, ind_ro, sat, sat3, xs
        torch.cuda.empty_cache()
    print("\nspeed-up of saturn (time of the other / time of saturn):")
    for name, vs_eager, vs_ind in summary:
        print(f"  {name:29s} vs eager {vs_eager:5.2f}x   vs Inductor's best mode {vs_ind:5.2f}x")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--bf16" in args:
        args.remove("--bf16")
        main(args or [w for w in WORKLOADS if not w.startswith("resnet")], torch.bfloat16)
    else:
        main(args or list(WORKLOADS))
