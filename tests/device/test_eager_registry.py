"""saturn's Python kernels are out of Dynamo's reach: called from eager code inside a
compiled function (a graph break, DDP's forward around its compiled pieces, a function
disabled non-recursively), Dynamo's frame hook is active, and without the wrapping of
``saturn.eager_registry.impl`` Dynamo compiled the kernels' own frames as user code (on a
GPU, tracing the launch of a copy kernel failed inside DDP's compiled forward)."""

from __future__ import annotations

import torch
import torch._dynamo.convert_frame as convert_frame


def test_eager_kernels_called_under_dynamos_hook_are_not_compiled():
    import saturn  # noqa: F401

    @torch._dynamo.disable(recursive=False)  # this frame runs eagerly, the hook stays on
    def eager_part(y):
        return torch.mm(y, y).clone() + 1

    def f(x):
        return eager_part(x * 2)

    torch._dynamo.reset()
    x = torch.randn(4, 4, device="saturn:0")
    out = torch.compile(f, backend="eager")(x)
    torch.testing.assert_close(out.cpu(), eager_part(x.cpu() * 2), rtol=1e-5, atol=1e-5)
    import saturn.eager_matmul as em

    root = em.__file__.rsplit("/", 1)[0]
    seen = {
        f"{c.co_filename}:{c.co_name}"
        for ref in convert_frame.input_codes.seen
        for c in [ref()]
        if c is not None and c.co_filename.startswith(root + "/")
    }
    assert seen == set(), sorted(seen)
