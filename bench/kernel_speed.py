"""Benchmarks of saturn's CUDA kernels against eager PyTorch and Inductor, in one process.

What is timed (device time by CUDA events, median of repeats, after warm-up):
  copy        torch device-to-device copy of 1 GiB: the bandwidth ceiling (read + write)
  chain       sigmoid(relu(a*b+c)) on 64M float32: eager, Inductor (default), saturn's loop
  sums        sum over rows / columns of an 8192 x 8192 float32 matrix, of 64M float32 to
              one value, over the 16384 rows of a 16384 x 1024 matrix: torch.sum vs saturn
              (the last two split their reduced axis)
  transpose   packing a transposed 8192 x 8192 float32 matrix: Tensor.contiguous vs saturn
  launch      host time of one saturn launch (cuda.core, no dispatcher), median of 2000
Bandwidth counts each input read once and each output written once.

    python bench/kernel_speed.py            (on a GPU machine)
"""

from __future__ import annotations

import statistics
import time

import torch

import saturn  # noqa: F401
from saturn.codegen import cuda as cg
from saturn.codegen import cuda_reads
from saturn.eqsat.graph import parse_graph
from saturn.eqsat.pipeline import compile_graph

GPU = "saturn:1"
REPEATS = 30


def events_ms(fn, stream: torch.cuda.Stream | None = None, repeats: int = REPEATS) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        s = stream or torch.cuda.current_stream()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(s)
        fn()
        b.record(s)
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_of(text: str):
    prog = compile_graph(parse_graph(text), machine="gpu", io_on_device=True).program
    (k,) = prog.kernels
    with torch.saturn.device(GPU):
        return cg.CudaKernel(k, torch.saturn.get_device_capability(GPU)), k


def main() -> None:
    torch.manual_seed(0)
    stream = torch.cuda.ExternalStream(torch.saturn.stream_handle(GPU), device="cuda:0")
    sh = torch.saturn.stream_handle(GPU)
    rows = []

    # the ceiling
    big = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(big)
    t = events_ms(lambda: dst.copy_(big))
    ceiling = 2 * big.numel() * 4 / t / 1e9
    rows.append(("copy 1 GiB d2d (torch)", t, ceiling))
    big = dst = None  # free before the next case

    # the fused chain
    n = 64 << 20
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))

    def chain(a, b, c):
        return torch.sigmoid(torch.relu(a * b + c))

    ind = torch.compile(chain)
    t_eager = events_ms(lambda: chain(a, b, c))
    t_ind = events_ms(lambda: ind(a, b, c))
    kern, k = kernel_of(
        f"(input a f32 [{n}])\n(input b f32 [{n}])\n(input c f32 [{n}])\n"
        "(let r (Sigmoid (Relu (Add (Mul a b) c))))\n(output r)\n"
    )
    sa, sb, sc = (x.cpu().to(GPU) for x in (a, b, c))
    out = torch.empty(n, device=GPU)
    shapes, strides = [(n,)] * 3, [(1,)] * 3
    ptrs = [sa.data_ptr(), sb.data_ptr(), sc.data_ptr()]
    sweep = {}
    default = (cuda_reads.VECTOR, cuda_reads.BLOCKS_PER_SM)
    for vector, bpm in ((False, 32), (True, 4), (True, 8), (True, 16), (True, 32), (True, 1 << 20)):
        cuda_reads.VECTOR, cuda_reads.BLOCKS_PER_SM = vector, bpm
        with torch.saturn.device(GPU):
            variant = cg.CudaKernel(k, torch.saturn.get_device_capability(GPU))
        sweep[(vector, bpm)] = events_ms(
            lambda v=variant: v.launch(sh, out.data_ptr(), ptrs, shapes, strides), stream
        )
    best = min(sweep, key=sweep.get)
    cuda_reads.VECTOR, cuda_reads.BLOCKS_PER_SM = default
    t_sat = events_ms(lambda: kern.launch(sh, out.data_ptr(), ptrs, shapes, strides), stream)
    err = (out.cpu() - chain(a, b, c).cpu()).abs().max().item()
    bytes_chain = 4 * n * 4
    for name, tt in (("chain eager", t_eager), ("chain inductor", t_ind), ("chain saturn", t_sat)):
        rows.append((name, tt, bytes_chain / tt / 1e9))
    a = b = c = sa = sb = sc = out = None

    # reductions: wide ones, and narrow ones (a loss, a bias gradient) that split
    cases = (
        ("row sum", (8192, 8192), 1),
        ("column sum", (8192, 8192), 0),
        ("full sum 64M", (64 << 20,), 0),
        ("column sum 16384x1024", (16384, 1024), 0),
    )
    for label, shape, dim in cases:
        m = torch.randn(*shape, device="cuda")
        sm = m.cpu().to(GPU)
        t_torch = events_ms(lambda dim=dim, m=m: m.sum(dim))
        kern, _ = kernel_of(
            f"(input x f32 [{' '.join(map(str, shape))}])\n(let r (Sum x [{dim}] 0))\n(output r)\n"
        )
        o = torch.empty(m.sum(dim).shape, device=GPU)
        ws = torch.empty(max(kern.workspace_bytes(), 1), dtype=torch.uint8, device=GPU)
        t_s = events_ms(
            lambda kern=kern, o=o, sm=sm, ws=ws: kern.launch(
                sh,
                o.data_ptr(),
                [sm.data_ptr()],
                [tuple(sm.shape)],
                [sm.stride()],
                workspace=lambda n: ws.data_ptr(),
            ),
            stream,
        )
        ok = torch.allclose(o.cpu(), m.sum(dim).cpu(), rtol=1e-4, atol=1e-2)
        how = f"split {kern.split[0]}" if kern.split else kern.g.style
        rows.append((f"{label} torch.sum", t_torch, m.numel() * 4 / t_torch / 1e9))
        rows.append((f"{label} saturn ({how}, match={ok})", t_s, m.numel() * 4 / t_s / 1e9))
    m = torch.randn(8192, 8192, device="cuda")
    sm = m.cpu().to(GPU)

    # packing a transposed matrix
    mt = m.t()
    t_torch = events_ms(lambda: mt.contiguous())
    smt = sm.t()
    t_s = events_ms(lambda: smt.contiguous(), stream)
    ok = torch.equal(smt.contiguous().cpu(), mt.contiguous().cpu())
    rows.append(("transpose Tensor.contiguous (torch)", t_torch, 2 * m.numel() * 4 / t_torch / 1e9))
    rows.append((f"transpose saturn copy kernel (match={ok})", t_s, 2 * m.numel() * 4 / t_s / 1e9))

    # host cost of one launch
    kern, _ = kernel_of("(input x f32 [1024])\n(let r (Exp x))\n(output r)\n")
    x = torch.randn(1024).to(GPU)
    o = torch.empty(1024, device=GPU)
    host = []
    for _ in range(2000):
        t0 = time.perf_counter()
        kern.launch(sh, o.data_ptr(), [x.data_ptr()], [(1024,)], [(1,)])
        host.append(time.perf_counter() - t0)
    torch.saturn.synchronize(GPU)

    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'what':52s} {'ms':>9s} {'TB/s':>9s}")
    for name, tt, bw in rows:
        print(f"{name:52s} {tt:9.3f} {bw:9.2f}")
    print(
        f"chain: saturn / inductor time = {t_sat / t_ind:.3f}; saturn bandwidth "
        f"{bytes_chain / t_sat / 1e9 / ceiling * 100:.0f}% of the copy ceiling; "
        f"max |saturn - torch| = {err:.2e}"
    )
    print(f"launch host cost: median {statistics.median(host) * 1e6:.1f} us over 2000 launches")
    print(
        "chain variants ((vector accesses, blocks per SM): ms): "
        + ", ".join(f"{k}: {v:.3f}" for k, v in sweep.items())
        + f"; best {best}"
    )


if __name__ == "__main__":
    main()
