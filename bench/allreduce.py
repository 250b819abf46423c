"""all_reduce bandwidth: saturn's process group on saturn GPU tensors (NCCL over views of
saturn's memory, decision 0097) against torch.distributed's NCCL group on CUDA tensors, the
same NCCL, in the same processes.

One process per GPU (``--world``, default every GPU), each rank on saturn:rank+1 and
cuda:rank. For each size, after warm-up, ``ITERS`` all_reduce calls (sum, float32) are
timed together with a synchronize of the device at each end; the median over ``REPEATS``
such runs gives the time per call. Bus bandwidth as nccl-tests defines it:
bytes * 2 (world - 1) / world / time (a world of one moves nothing between GPUs: its
figure is algorithm bandwidth, bytes / time, and says only what one call costs).

    python bench/allreduce.py [--world N] [--sizes-mb 1 16 256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ITERS = 20
REPEATS = 5


def _time(x: torch.Tensor, group, sync) -> float:
    for _ in range(3):
        dist.all_reduce(x, group=group)
    sync()
    runs = []
    for _ in range(REPEATS):
        sync()
        t = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(x, group=group)
        sync()
        runs.append((time.perf_counter() - t) / ITERS)
    return statistics.median(runs)


def _worker(rank: int, world: int, path: str, sizes_mb: list[float], out: str) -> None:
    import saturn  # noqa: F401 (the saturn backend)

    dist.init_process_group("saturn", init_method=f"file://{path}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    nccl = dist.new_group(backend="nccl")
    sat_dev, cuda_dev = f"saturn:{rank + 1}", f"cuda:{rank}"
    rows = []
    for mb in sizes_mb:
        n = int(mb * 2**20) // 4
        xs = torch.ones(n, device=sat_dev)
        xc = torch.ones(n, device=cuda_dev)
        t_sat = _time(xs, None, lambda: torch.saturn.synchronize(sat_dev))
        t_cuda = _time(xc, nccl, torch.cuda.synchronize)
        rows.append((mb, t_sat, t_cuda))
        del xs, xc
    if rank == 0:
        factor = 2 * (world - 1) / world if world > 1 else 1.0
        kind = "bus" if world > 1 else "algorithm"
        lines = [
            f"{torch.cuda.get_device_name(0)} x{world}, torch {torch.__version__}, "
            f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; {kind} bandwidth GB/s"
        ]
        lines.append(
            f"{'MB':>8s} {'saturn us':>10s} {'cuda us':>10s} {'saturn':>8s} {'cuda':>8s} ratio"
        )
        for mb, ts, tc in rows:
            b = mb * 2**20 * factor
            lines.append(
                f"{mb:8.1f} {ts * 1e6:10.1f} {tc * 1e6:10.1f} {b / ts / 1e9:8.1f} "
                f"{b / tc / 1e9:8.1f} {tc / ts:5.3f}"
            )
        Path(out).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--sizes-mb", type=float, nargs="*", default=[1, 16, 64, 256])
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    mp.spawn(
        _worker,
        args=(a.world, str(tmp / "store"), a.sizes_mb, str(tmp / "out")),
        nprocs=a.world,
    )
    print((tmp / "out").read_text(), end="")


if __name__ == "__main__":
    main()
