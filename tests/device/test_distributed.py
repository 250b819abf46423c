"""torch.distributed on saturn tensors (``saturn.distributed``).

saturn:0: two processes, each collective against gloo on CPU tensors (odd sizes, strided
tensors, every float dtype, bit for bit); DDP and FSDP2 of a model compiled with saturn
trained for 20 steps, matching one process trained on the combined batch, the DDP one also
launched by ``torchrun``.

GPUs (NCCL over CUDA views of saturn's memory): in one process, a group of one on saturn:1,
each collective reading what saturn wrote just before and written before saturn reads it
(stream order), strided tensors, every dtype, a mix of devices refused, DDP of a compiled
model; with two GPUs, each collective against NCCL on CUDA tensors bit for bit, DDP
training against one process, and peer copies."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is absent")

WORLD = 2
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
STEPS = 20


def _init(rank: int, path: str | None) -> None:
    """Join the group: through a file store, or (``path`` None) torchrun's environment."""
    import saturn  # noqa: F401 (registers the backend)

    if path is None:
        dist.init_process_group("saturn")
    else:
        dist.init_process_group("saturn", init_method=f"file://{path}", rank=rank, world_size=WORLD)


def _values(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 7 * n + salt)
    return (torch.randn(n, generator=g) * 3).to(dtype)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a buffer twice its size, every other element: a non-contiguous view (on
    saturn; the gloo reference, which refuses some strided tensors, gets ``t`` itself)."""
    if t.device.type == "cpu":
        return t
    buf = torch.zeros(2 * t.numel(), dtype=t.dtype, device=t.device)
    view = buf[::2]
    view.copy_(t)
    return view


def _collectives(rank: int, dev: str, group) -> dict[str, torch.Tensor]:
    """Every collective's result on ``dev`` tensors through ``group``, moved to the CPU."""
    out: dict[str, torch.Tensor] = {}
    for dtype in DTYPES:
        d = str(dtype).split(".")[-1]
        for n in (1, 7, 13):
            x = _values(rank, n, dtype).to(dev)
            dist.all_reduce(x, group=group)
            out[f"all_reduce/{d}/{n}"] = x.cpu()
            x = _strided(_values(rank, n, dtype).to(dev))
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
            out[f"all_reduce_max_strided/{d}/{n}"] = x.cpu()
            x = _values(rank, n, dtype, 1).to(dev)
            dist.broadcast(x, src=1, group=group)
            out[f"broadcast/{d}/{n}"] = x.cpu()
            parts = [torch.empty(n, dtype=dtype, device=dev) for _ in range(WORLD)]
            dist.all_gather(parts, _values(rank, n, dtype, 2).to(dev), group=group)
            out[f"all_gather/{d}/{n}"] = torch.cat([p.cpu() for p in parts])
            whole = torch.empty(WORLD * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(whole, _values(rank, n, dtype, 3).to(dev), group=group)
            out[f"all_gather_into_tensor/{d}/{n}"] = whole.cpu()
            mine = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(
                mine, _values(rank, WORLD * n, dtype, 4).to(dev), group=group
            )
            out[f"reduce_scatter_tensor/{d}/{n}"] = mine.cpu()
            got = _strided(torch.zeros(n, dtype=dtype, device=dev))  # rank 1 receives into it
            if rank == 0:
                dist.send(_values(rank, n, dtype, 5).to(dev), dst=1, group=group)
            else:
                dist.recv(got, src=0, group=group)
            out[f"send_recv/{d}/{n}"] = got.cpu()
    dist.barrier(group=group)
    return out


def _collectives_worker(rank: int, path: str, result: str, gpu: bool = False) -> None:
    """Every collective on saturn tensors (saturn's group) and on the reference's tensors
    through the reference's own group: gloo on CPU tensors, or on GPUs NCCL on CUDA ones."""
    _init(rank, path)
    if gpu:
        torch.cuda.set_device(rank)
        mine = _collectives(rank, f"saturn:{rank + 1}", None)
        theirs = _collectives(rank, f"cuda:{rank}", dist.new_group(backend="nccl"))
    else:
        mine = _collectives(rank, "saturn:0", None)
        theirs = _collectives(rank, "cpu", dist.new_group(backend="gloo"))
    torch.save((mine, theirs), f"{result}.{rank}")
    dist.destroy_process_group()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


def _two_gpus() -> None:
    import saturn  # noqa: F401

    if torch.saturn.gpu_count() < 2 or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")


@pytest.mark.slow
@pytest.mark.parametrize(
    "gpu", [False, pytest.param(True, marks=pytest.mark.gpu)], ids=["saturn0-gloo", "gpus-nccl"]
)
def test_each_collective_is_the_reference_groups(tmp_path, gpu):
    if gpu:
        _two_gpus()
    mp.spawn(
        _collectives_worker,
        args=(str(tmp_path / "store"), str(tmp_path / "r"), gpu),
        nprocs=WORLD,
    )
    for rank in range(WORLD):
        mine, theirs = torch.load(tmp_path / f"r.{rank}")
        assert mine.keys() == theirs.keys() and len(mine) == 4 * 3 * 7
        for key, want in theirs.items():
            assert torch.equal(_bits(mine[key]), _bits(want)), (rank, key)
        # the collectives did something: rank 1's broadcast reached rank 0
        assert torch.equal(mine["broadcast/float32/7"], _values(1, 7, torch.float32, 1))


# --- training ----------------------------------------------------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batches() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, 8, 8, generator=g), torch.randn(STEPS, 8, 4, generator=g)


def _train_worker(rank: int, path: str | None, result: str, wrap: str, gpu: bool = False) -> None:
    _init(rank, path)
    rank = dist.get_rank()
    from saturn import backend

    device = f"saturn:{rank + 1}" if gpu else "saturn:0"
    model = _model().to(device)
    if wrap == "ddp":
        # the module compiled, then wrapped: Dynamo hands a custom backend nothing from a
        # compiled DDP wrapper (pytorch/pytorch#140416; no graph in torch 2.11-2.14)
        trained = model
        compiled = torch.nn.parallel.DistributedDataParallel(torch.compile(model, backend="saturn"))
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("saturn", (WORLD,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        trained = compiled = fully_shard(model, mesh=mesh)
        # each layer compiled: Dynamo breaks its graph at FSDP2's hooks, so it hands saturn
        # the layers between them (the Tanh here); the sharded Linears run eagerly on saturn
        for layer in model:
            layer.compile(backend="saturn")
    opt = torch.optim.SGD(trained.parameters(), lr=0.1)
    for x, y in zip(*_batches(), strict=True):
        x, y = x.chunk(WORLD)[rank].to(device), y.chunk(WORLD)[rank].to(device)
        loss = ((compiled(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in trained.parameters()]
    stats = {"graphs": len(backend.CACHE.items), "uncompiled": list(backend.CACHE.fallbacks)}
    torch.save(([p.detach().cpu() for p in params], stats), f"{result}.{rank}")
    dist.destroy_process_group()


def _one_process() -> list[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in zip(*_batches(), strict=True):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _check_trained(tmp_path: Path) -> None:
    want = _one_process()
    first = _model()
    for rank in range(WORLD):
        got, stats = torch.load(tmp_path / f"r.{rank}")
        # a forward and a backward graph at least, none run uncompiled
        assert stats["graphs"] >= 2 and stats["uncompiled"] == [], stats
        for g, w, w0 in zip(got, want, first.parameters(), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            assert not torch.equal(w, w0.detach())  # the model did train


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_compiled_training_in_two_processes_matches_one_on_the_whole_batch(tmp_path, wrap):
    mp.spawn(
        _train_worker,
        args=(str(tmp_path / "store"), str(tmp_path / "r"), wrap),
        nprocs=WORLD,
    )
    _check_trained(tmp_path)


@pytest.mark.slow
def test_ddp_launched_by_torchrun(tmp_path):
    """``torchrun`` starts the two processes; the group comes from its environment."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={WORLD}",
            str(Path(__file__)),
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    _check_trained(tmp_path)


@pytest.mark.slow
@pytest.mark.gpu
def test_compiled_ddp_on_two_gpus_matches_one_process(tmp_path):
    _two_gpus()
    mp.spawn(
        _train_worker,
        args=(str(tmp_path / "store"), str(tmp_path / "r"), "ddp", True),
        nprocs=WORLD,
    )
    _check_trained(tmp_path)


def test_the_backend_is_registered_for_the_saturn_device():
    import saturn  # noqa: F401

    assert dist.Backend.default_device_backend_map["saturn"] == "saturn"
    assert "saturn" in dist.Backend.backend_list


def _threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_destroying_the_group_joins_its_inner_groups_threads(tmp_path):
    """``destroy_process_group`` reaches saturn's group, which releases its gloo group then,
    so gloo's worker threads are joined while the interpreter runs, even where something
    (a DDP wrapper) still holds the group. gloo's ``shutdown`` alone leaves them running,
    and one that drops a tensor in the interpreter's teardown aborts the process on exit."""
    import saturn  # noqa: F401

    before = _threads()
    dist.init_process_group("saturn", init_method=f"file://{tmp_path / 's'}", rank=0, world_size=1)
    ours = dist.group.WORLD  # held, as a DDP wrapper holds its group
    x = torch.ones(4, device="saturn:0")
    dist.all_reduce(x)  # the group works before
    assert _threads() > before  # gloo's workers and its transport's loop
    dist.destroy_process_group()
    assert _threads() == before
    assert torch.equal(x.cpu(), torch.ones(4))
    with pytest.raises(RuntimeError, match="was destroyed"):
        ours.allreduce([x])


def test_a_group_never_destroyed_is_released_before_the_teardown(tmp_path):
    """A program that exits without ``destroy_process_group``: saturn's exit hook releases
    the group's inner gloo group (its threads joined) before the interpreter's teardown."""
    code = f"""
import os, torch, torch.distributed as dist
import saturn
from saturn import distributed
dist.init_process_group("saturn", init_method="file://{tmp_path / "s"}", rank=0, world_size=1)
x = torch.ones(3, device="saturn:0")
dist.all_reduce(x)
before = len(os.listdir("/proc/self/task"))
distributed._release_live()
print(before - len(os.listdir("/proc/self/task")), len(distributed._LIVE))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    joined, live = map(int, run.stdout.split())
    assert joined >= 2 and live == 0


# --- one GPU: a group of one in this process ------------------------------------------


@pytest.fixture
def group_of_one():
    import saturn  # noqa: F401

    if not torch.saturn.gpu_count() or not torch.cuda.is_available():
        pytest.skip("no saturn GPU")
    path = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("saturn", init_method=f"file://{path}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_gpu_collectives_in_stream_order(group_of_one, dtype):
    """What saturn wrote just before a collective is what NCCL reads, and what NCCL wrote
    is what saturn reads just after (saturn's stream, with a long kernel ahead of each)."""
    dev = "saturn:1"
    n = 1 << 20
    base = (torch.arange(n) % 97).to(dtype)
    slow = torch.randn(2048, 2048, device=dev)
    for _ in range(4):  # device work queued ahead: a collective not ordered after it reads early
        slow = slow @ slow / 64
    x = base.to(dev) * 2  # written by saturn right before the collective
    dist.all_reduce(x)
    assert torch.equal((x + 1).cpu(), base * 2 + 1)
    out = torch.zeros(n, dtype=dtype, device=dev)
    dist.all_gather_into_tensor(out, base.to(dev) + 3)
    assert torch.equal(out.cpu(), base + 3)
    mine = torch.zeros(n, dtype=dtype, device=dev)
    dist.reduce_scatter_tensor(mine, base.to(dev) - 1)
    assert torch.equal(mine.cpu(), base - 1)
    parts = [torch.zeros(7, dtype=dtype, device=dev)]
    dist.all_gather(parts, base[:7].to(dev))
    assert torch.equal(parts[0].cpu(), base[:7])
    y = base[:9].to(dev)
    work = dist.broadcast(y, src=0, async_op=True)
    assert work.wait() and torch.equal(y.cpu(), base[:9])
    assert torch.isfinite(slow.float()).all()


@pytest.mark.gpu
def test_gpu_collective_on_a_strided_tensor_writes_it_back(group_of_one):
    buf = torch.zeros(14, device="saturn:1")
    view = buf[::2]  # not dense: packed for NCCL, the result copied back into the view
    view.copy_(torch.arange(7.0).to("saturn:1"))
    dist.all_reduce(view, op=dist.ReduceOp.MAX)
    want = torch.zeros(14)
    want[::2] = torch.arange(7.0)
    assert torch.equal(buf.cpu(), want)


@pytest.mark.gpu
def test_gpu_collective_aliases_saturns_memory(group_of_one):
    """NCCL is handed saturn's own memory: a CUDA view at the same address, no copy."""
    from saturn.distributed import cuda_alias

    t = torch.arange(6.0, device="saturn:1").view(2, 3)
    a = cuda_alias(t)
    assert a.device == torch.device("cuda", 0) and a.data_ptr() == t.data_ptr()
    assert a.shape == t.shape and a.dtype == t.dtype
    # The alias does not keep its source alive, and saturn's stream is not torch's: hold the
    # source, and let saturn's fill finish before CUDA reads it.
    ones = torch.ones(3, dtype=torch.bfloat16, device="saturn:1")
    b = cuda_alias(ones)  # bfloat16 has no type string
    torch.saturn.synchronize("saturn:1")
    assert b.dtype == torch.bfloat16 and torch.equal(b.cpu(), torch.ones(3, dtype=torch.bfloat16))
    assert b.data_ptr() == ones.data_ptr()


@pytest.mark.gpu
def test_a_collective_mixing_devices_is_refused_naming_them(group_of_one):
    parts = [torch.zeros(3)]
    with pytest.raises(ValueError, match="cpu, saturn:1"):
        dist.all_gather(parts, torch.ones(3, device="saturn:1"))


@pytest.mark.gpu
def test_compiled_ddp_on_one_gpu_trains_like_one_process(group_of_one):
    """DDP's reducer (buckets, the gradient all_reduce through NCCL) on a saturn-compiled
    model on saturn:1, in a group of one: the parameters of one process on the batch."""
    from saturn import backend

    model = _model().to("saturn:1")
    compiled = torch.nn.parallel.DistributedDataParallel(torch.compile(model, backend="saturn"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before, graphs = len(backend.CACHE.fallbacks), len(backend.CACHE.items)
    for x, y in zip(*_batches(), strict=True):
        loss = ((compiled(x.to("saturn:1")) - y.to("saturn:1")) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert backend.CACHE.fallbacks[before:] == []
    assert len(backend.CACHE.items) >= graphs + 2  # the forward and backward compiled
    for g, w in zip(model.parameters(), _one_process(), strict=True):
        torch.testing.assert_close(g.detach().cpu(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_peer_copies_between_two_gpus():
    _two_gpus()
    x = torch.randn(1000, 37)
    a = x.to("saturn:1")
    b = a.to("saturn:2")  # device to device, no host
    assert b.device == torch.device("saturn", 2) and torch.equal(b.cpu(), x)
    c = b[:, ::2].to("saturn:1")  # a strided source
    assert torch.equal(c.cpu(), x[:, ::2])
    d = torch.empty(1000, 37, device="saturn:2")
    d.copy_(a)
    assert torch.equal(d.cpu(), x)


@pytest.mark.gpu
def test_a_compiled_graph_reading_two_gpus_runs_uncompiled_with_the_devices_named():
    """A graph whose inputs live on saturn:1 and saturn:2 (the model moves one explicitly)
    is not compiled for one device: it runs as eager runs it, the reason naming both."""
    _two_gpus()
    from saturn import backend

    def f(a, b):
        return (a.to("saturn:1") * 2 + b).relu()

    a, b = torch.randn(64), torch.randn(64)
    before = len(backend.CACHE.fallbacks)
    got = torch.compile(f, backend="saturn")(a.to("saturn:2"), b.to("saturn:1"))
    assert torch.equal(got.cpu(), (a * 2 + b).relu())
    (reason,) = backend.CACHE.fallbacks[before:]
    assert "saturn:1" in reason and "saturn:2" in reason, reason


@pytest.mark.parametrize("spec", ["saturn", "cpu:gloo,saturn:saturn", None])
def test_each_way_of_naming_the_backend_gives_saturns_group(spec):
    """The backend named alone, mapped for the device beside gloo for the CPU, or not named
    (saturn's import mapped the device to it): the group is saturn's, serving CPU tensors
    (through its gloo group) and saturn:0 tensors alike."""
    import saturn  # noqa: F401
    from saturn.distributed import SaturnProcessGroup

    path = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group(spec, init_method=f"file://{path}", rank=0, world_size=1)
    try:
        assert isinstance(dist.group.WORLD, SaturnProcessGroup)
        x, c = torch.arange(3.0).to("saturn:0"), torch.arange(3.0)
        dist.all_reduce(x)
        dist.all_reduce(c)
        assert torch.equal(x.cpu(), c)
    finally:
        dist.destroy_process_group()


def test_a_process_group_of_one_on_saturn0():
    """In this process (no spawn): a group of one, every call returning completed work."""
    import saturn  # noqa: F401

    path = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("saturn", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        x = torch.arange(5.0).to("saturn:0")
        work = dist.all_reduce(x, async_op=True)
        assert work.is_completed() and work.wait()
        assert torch.equal(x.cpu(), torch.arange(5.0))
        assert dist.get_backend() == "saturn"
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # one of torchrun's processes (test_ddp_launched_by_torchrun)
    _train_worker(0, None, sys.argv[1], "ddp")
