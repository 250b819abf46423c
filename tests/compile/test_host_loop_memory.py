"""saturn:0's host loop releases each value after its last reader: a call holds what is
still to be read, not every intermediate it made. (A ConvMixer training backward, whose
written-out depthwise gradients concatenate 81 growing pieces per layer, held over 20 GB
on saturn:0 and was killed; eager held under 2 GB.)"""

from __future__ import annotations

import torch

from saturn.eqsat.program import Program, Step, StepKind
from saturn.recipe import dead_after


def test_dead_after_names_each_value_at_its_last_reader():
    steps = [
        Step(StepKind.INPUT, "x"),
        Step(StepKind.HOST, "a", op="Neg", args=("x",)),
        Step(StepKind.HOST, "b", op="Neg", args=("a",)),
        Step(StepKind.HOST, "c", op="Add", args=("a", "b")),
        Step(StepKind.HOST, "unused", op="Neg", args=("x",)),
        Step(StepKind.HOST, "d", op="Neg", args=("c",)),
    ]
    dead = dead_after(Program(steps, ["d", "b"], {"x": "x"}))
    # x is last read by `unused`; a by c; b is an output (kept); c by d; unused where made
    assert dead == ((), (), (), ("a",), ("x", "unused"), ("c",))


def test_a_call_holds_only_live_intermediates():
    """Sixteen concatenations in a chain (saturn:0 makes each a kernel of its own), 1 MiB
    each: a call's peak allocation is a few of them, not all sixteen."""

    def chain(x):
        y = x
        for i in range(16):
            y = torch.cat([y[:, 1:], x[:, :1] * i], 1)
        return y.sum(0)

    x = torch.randn(64, 64, 64)
    torch._dynamo.reset()
    compiled = torch.compile(chain, backend="saturn")
    xd = x.to("saturn:0")
    compiled(xd)  # the first call makes the recipe's constants
    torch.saturn.reset_peak_memory_stats("saturn:0")
    base = torch.saturn.memory_allocated("saturn:0")
    out = compiled(xd)
    peak = torch.saturn.max_memory_allocated("saturn:0") - base
    torch.testing.assert_close(out.cpu(), chain(x), rtol=1e-5, atol=1e-5)
    assert peak <= 6 * 2**20, peak / 2**20  # all sixteen held: 32 MiB
    torch._dynamo.reset()
