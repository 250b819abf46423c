"""torch.distributed on saturn:0 (``saturn.distributed``): two processes, each collective
against gloo on CPU tensors (odd sizes, strided tensors, every float dtype, bit for bit);
DDP and FSDP2 of a model compiled with saturn trained for 20 steps, matching one process
trained on the combined batch; a saturn GPU tensor refused with its device named."""

from __future__ import annotations

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


def _init(rank: int, path: str) -> None:
    import saturn  # noqa: F401 (registers the backend)

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


def _collectives_worker(rank: int, path: str, result: str) -> None:
    _init(rank, path)
    gloo = dist.new_group(backend="gloo")
    mine = _collectives(rank, "saturn:0", None)
    theirs = _collectives(rank, "cpu", gloo)
    torch.save((mine, theirs), f"{result}.{rank}")
    dist.destroy_process_group()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


@pytest.mark.slow
def test_each_collective_on_saturn0_is_gloos_on_cpu_tensors(tmp_path):
    mp.spawn(
        _collectives_worker,
        args=(str(tmp_path / "store"), str(tmp_path / "r")),
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


def _train_worker(rank: int, path: str, result: str, wrap: str) -> None:
    _init(rank, path)
    from saturn import backend

    model = _model().to("saturn:0")
    if wrap == "ddp":
        trained = model
        step_fn = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("saturn", (WORLD,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        trained = step_fn = fully_shard(model, mesh=mesh)
    compiled = torch.compile(step_fn, backend="saturn")
    opt = torch.optim.SGD(trained.parameters(), lr=0.1)
    for x, y in zip(*_batches(), strict=True):
        x, y = x.chunk(WORLD)[rank].to("saturn:0"), y.chunk(WORLD)[rank].to("saturn:0")
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


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_compiled_training_in_two_processes_matches_one_on_the_whole_batch(tmp_path, wrap):
    mp.spawn(
        _train_worker,
        args=(str(tmp_path / "store"), str(tmp_path / "r"), wrap),
        nprocs=WORLD,
    )
    want = _one_process()
    first = _model()
    for rank in range(WORLD):
        got, stats = torch.load(tmp_path / f"r.{rank}")
        assert stats["graphs"] >= 2 and stats["uncompiled"] == [], stats  # forward, backward
        for g, w, w0 in zip(got, want, first.parameters(), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            assert not torch.equal(w, w0.detach())  # the model did train


def test_the_backend_is_registered_for_the_saturn_device():
    import saturn  # noqa: F401

    assert dist.Backend.default_device_backend_map["saturn"] == "saturn"
    assert "saturn" in dist.Backend.backend_list


@pytest.mark.gpu
def test_a_gpu_tensor_is_refused_with_its_device_named():
    import saturn  # noqa: F401
    from saturn.distributed import _Host

    if not torch.saturn.gpu_count():
        pytest.skip("no saturn GPU")
    t = torch.ones(3, device="saturn:1")
    with pytest.raises(NotImplementedError, match="saturn:1"):
        _Host().one(t, written=True)


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
