"""torch.roll (Swin's shifted windows) as one ``roll`` kernel for every rolled axis,
reading its operand at any strides, where PyTorch's decomposition is a permute copy and a
row take per axis. Values against eager PyTorch on the CPU bit for bit (a roll moves
bits), the program's kernels as proof of where the work ran, on saturn:0 and (marker gpu)
on saturn:1 under replay."""

from __future__ import annotations

import pytest
import torch

import saturn
from saturn import backend

from .helpers import compile_and_compare, last_compiled

GPU = "saturn:1"


def special() -> torch.Tensor:
    x = torch.randn(2, 7, 5, 3, generator=torch.Generator().manual_seed(3))
    x[0, 0, 0] = torch.tensor([float("nan"), float("-inf"), -0.0])
    return x


def kinds_and_host_ops(prog) -> tuple[list[str], list[str]]:
    hosts = [s.op.split("#")[0] for s in prog.steps if s.kind == "host"]
    return [k.kind for k in prog.kernels], hosts


ROLLS = {
    "two axes, negative shift": lambda x: torch.roll(x, (3, -2), (1, 2)) * 2,
    "flattened (no dims)": lambda x: torch.roll(x, 4),
    "one axis twice, of a permuted view": lambda x: torch.roll(
        x.permute(0, 2, 1, 3), (1, 1, 2), (1, 1, -1)
    ),
    "Swin's window shift and back": lambda x: torch.roll(
        torch.roll(x, (-3, -3), (1, 2)) * 2, (3, 3), (1, 2)
    ),
}


@pytest.mark.parametrize("case", sorted(ROLLS))
def test_a_roll_is_one_kernel_for_all_its_axes(case):
    compile_and_compare(ROLLS[case], special(), rtol=0, atol=0)
    kinds, hosts = kinds_and_host_ops(last_compiled().compiled.program)
    rolls = 2 if case.startswith("Swin") else 1
    assert hosts == [] and kinds.count("roll") == rolls and "gather" not in kinds, kinds


def test_a_roll_by_whole_turns_is_a_copy_not_an_alias():
    x = special().to("saturn:0")
    got = torch.compile(lambda x: torch.roll(x, (7, 10), (1, 2)), backend="saturn")(x)
    assert torch.equal(got.cpu().nan_to_num(), x.cpu().nan_to_num())
    assert "roll" not in kinds_and_host_ops(last_compiled().compiled.program)[0]
    got[0, 0, 0, 0] = 5.0  # roll's result never shares its operand's memory
    assert x[0, 0, 0, 0].isnan()


def test_a_half_roll_stays_on_the_host_of_the_cpu_reference_device():
    """place-roll declines a dtype the device has no kernel for (halves on saturn:0)."""
    x = special().to(torch.bfloat16)
    compile_and_compare(lambda x: torch.roll(x, (1, 2), (1, 3)), x, rtol=0, atol=0)
    kinds, hosts = kinds_and_host_ops(last_compiled().compiled.program)
    assert "roll" not in kinds and hosts == ["Roll"], (kinds, hosts)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_rolls_run_on_the_gpu_and_replay(dtype):
    x = special().nan_to_num() * 10
    x = x.to(dtype)

    def f(x):  # Swin's order: rolled, cut into windows, read by a product's operand copy
        w = torch.roll(x.permute(0, 2, 1, 3), (-3, -2), (1, 2))
        return w.reshape(2, 5, 7, 3).permute(0, 2, 1, 3).reshape(14, 15)

    xd = x.to(GPU)
    torch._dynamo.reset()
    compiles = backend.CACHE.compiles
    cf = torch.compile(f, backend="saturn", dynamic=False)
    cf(xd)
    assert backend.CACHE.compiles == compiles + 1
    recipe = last_compiled().recipe
    kinds, hosts = kinds_and_host_ops(recipe.program)
    assert hosts == [] and kinds.count("roll") == 1 and "gather" not in kinds, kinds
    fb = saturn.fallback_counts()
    for _ in range(3):
        torch.testing.assert_close(cf(xd).cpu(), f(x), rtol=0, atol=0)
    assert recipe.last.crossings == 0 and saturn.fallback_counts() == fb
    assert recipe.runner.replays >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 14, 14, 16), (2, 14, 14, 12)])
def test_swins_rolls_move_vectors_where_rows_are_whole_vectors(dtype, shape):
    """Rolled over H and W of [B, H, W, C]: 16-byte vectors along C when C splits into
    them (16 channels), element by element when it does not (12 in bfloat16); both in
    32-bit index arithmetic. Bit for bit against the CPU."""
    from saturn.codegen.movement import ROW_LANES

    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    f = lambda x: torch.roll(x, (-3, -3), (1, 2)) * 2  # noqa: E731
    torch._dynamo.reset()
    got = torch.compile(f, backend="saturn", dynamic=False)(x.to(GPU)).cpu()
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    recipe = last_compiled().recipe
    (step,) = [s for s in recipe.program.steps if s.kernel is not None and s.kernel.kind == "roll"]
    # the variants the launcher loaded: only what it launched (FlatKernel loads at launch)
    variants = recipe.runner.launchers[step.output].kernel._variants
    ran = [key for key, v in variants.items() if v._kernel is not None]
    vectors = shape[-1] % ROW_LANES[x.element_size()] == 0
    assert ran == [(True, vectors)], ran  # (32-bit arithmetic, vectors)
