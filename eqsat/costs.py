"""The cost model's machine constants, in one place, per target.

Costs are microseconds of one call. A crossing pays a fixed latency plus its bytes over
the host-device link; a kernel pays its launch plus the bytes it writes (its reads are
paid by the ``Ld`` leaves of its body) and its arithmetic; a host op pays the framework's
per-op overhead plus its bytes over host memory bandwidth. GPU figures are the measured
ones in the design notes (H200, torch 2.11); the CPU reference figures make a fused loop on
saturn:0 cheaper than several host ops, as it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    name: str
    crossing_latency_us: float  # fixed cost of one host<->device copy
    link_bytes_per_us: float  # host<->device bandwidth
    launch_us: float  # host cost of launching one kernel
    library_call_us: float  # host cost of one planned library call (GEMM, conv)
    device_bytes_per_us: float  # device memory bandwidth (read + write)
    device_flops_per_us: float  # scalar arithmetic rate in generated loops
    gemm_flops_per_us: float  # library matrix-multiply rate
    host_op_us: float  # per-op overhead of running an op on the host (torch eager, CPU)
    host_bytes_per_us: float  # host memory bandwidth for host ops
    host_flops_per_us: float
    view_us: float = 0.5  # a view (metadata only), host or device
    halves: bool = False  # kernels for float16/bfloat16 (schema.half_facts)


GPU = Machine(
    name="gpu",
    crossing_latency_us=21.0,  # small copy, measured
    link_bytes_per_us=53e3,  # pinned H2D, 53 GB/s
    launch_us=8.0,  # cuda.core launch of a compiled kernel
    library_call_us=10.0,
    device_bytes_per_us=4.0e6,  # 4 TB/s copy bandwidth
    device_flops_per_us=30e6,
    gemm_flops_per_us=50e6,  # fp32 without TF32: ~51 TFLOP/s
    host_op_us=10.0,
    host_bytes_per_us=10e3,
    host_flops_per_us=20e3,
    halves=True,
)

CPU_REFERENCE = Machine(
    name="cpu-reference",
    crossing_latency_us=1.0,  # a memcpy between host and saturn:0 memory
    link_bytes_per_us=8e3,
    launch_us=2.0,  # calling a compiled Numba loop
    library_call_us=6.0,
    device_bytes_per_us=8e3,
    device_flops_per_us=4e3,
    gemm_flops_per_us=50e3,
    host_op_us=8.0,  # one torch CPU op through the framework
    host_bytes_per_us=8e3,
    host_flops_per_us=4e3,
)

MACHINES = {m.name: m for m in (GPU, CPU_REFERENCE)}
