"""A GPU call's input writes (``saturn.runner_writes``): small packed values a few to a
launch, each to its input; large, strided or lone ones a copy each. No GPU: the launches
are recorded, not run (the copy group's kernel runs under the CUDA simulator,
``cudasim_runner.run_copy_groups``)."""

from __future__ import annotations

import torch

from saturn import runner_writes
from saturn.eqsat.horizontal import GROUP_MAX, GROUP_NUMEL_MAX


class Recorded:
    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.copies: list[tuple[int, int]] = []

    def launch(self, stream, out_ptr, in_ptrs, shapes, strides, stat_ptrs=()):
        self.launches.append(
            {"out": out_ptr, "ins": in_ptrs, "shapes": shapes, "stats": stat_ptrs, "s": stream}
        )


def written(monkeypatch, writes, env, prepared):
    rec = Recorded()
    monkeypatch.setattr(runner_writes, "strided_copy", lambda s, d: rec.copies.append((s, d)))
    wb = runner_writes.WriteBack(writes, (9, 0))
    for _, kernel, *_ in wb.groups:
        monkeypatch.setattr(kernel, "launch", rec.launch)
    wb.run(env, prepared, 7)
    return wb, rec


def test_small_writes_are_grouped_each_to_its_input(monkeypatch):
    shapes = [(3, 5), (7,), (2, 2, 2)]
    dtypes = ["f32", "i64", "bf16"]
    torch_dtypes = [torch.float32, torch.int64, torch.bfloat16]
    pairs = list(zip(shapes, torch_dtypes, strict=True))
    env = {f"v{j}": torch.zeros(s, dtype=t) for j, (s, t) in enumerate(pairs)}
    prepared = [torch.ones(s, dtype=t) for s, t in pairs]
    writes = [(j, f"v{j}", dtypes[j], shapes[j]) for j in range(3)]
    wb, rec = written(monkeypatch, writes, env, prepared)
    (call,) = rec.launches
    assert rec.copies == [] and call["s"] == 7
    assert call["out"] == prepared[0].data_ptr()
    assert call["stats"] == (prepared[1].data_ptr(), prepared[2].data_ptr())
    assert call["ins"] == [env[f"v{j}"].data_ptr() for j in range(3)]
    assert call["shapes"] == [(15,), (7,), (8,)]
    ((_, kernel, *_),) = wb.groups
    assert [o.dtype for o in kernel.k.inputs] == ["i32", "i64", "i16"]  # by element width


def test_large_lone_and_strided_writes_copy_each(monkeypatch):
    big = GROUP_NUMEL_MAX + 1
    env = {"a": torch.zeros(big), "b": torch.zeros(4), "c": torch.zeros(4, 3), "d": torch.zeros(5)}
    prepared = [torch.ones(big), torch.ones(4), torch.ones(3, 4).t(), torch.ones(5)]
    writes = [(0, "a", "f32", (big,)), (1, "b", "f32", (4,))]
    _, rec = written(monkeypatch, writes, env, prepared)
    assert rec.launches == [] and len(rec.copies) == 2  # one small write left alone
    writes = [(2, "c", "f32", (4, 3)), (3, "d", "f32", (5,))]
    _, rec = written(monkeypatch, writes, env, prepared)
    # the group's input 2 came strided: each copied as before
    assert rec.launches == [] and len(rec.copies) == 2
    assert rec.copies[0][1] is prepared[2] and rec.copies[1][1] is prepared[3]


def test_at_most_group_max_writes_share_a_launch(monkeypatch):
    n = GROUP_MAX + 2
    env = {f"v{j}": torch.zeros(j + 1) for j in range(n)}
    prepared = [torch.ones(j + 1) for j in range(n)]
    writes = [(j, f"v{j}", "f32", (j + 1,)) for j in range(n)]
    _, rec = written(monkeypatch, writes, env, prepared)
    assert [1 + len(c["stats"]) for c in rec.launches] == [GROUP_MAX, 2]
    assert rec.copies == []
