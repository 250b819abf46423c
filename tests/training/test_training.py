"""Training through saturn on saturn:0 and (marker gpu) saturn:1: forward and backward
graphs compiled (on a GPU: nvmath GEMMs, saturn's kernels, CUDA-graph replay), AdamW run
eagerly on saturn tensors; parameters match eager CPU training after 200 steps. The
recipe's output spec catches a swapped or dropped gradient position."""

from __future__ import annotations

import copy

import pytest
import torch

import saturn
from saturn import backend

from ..compile.helpers import traced_step

DEV = "saturn:0"


def train(model: torch.nn.Module, data, steps: int, device: str | None, compiled: bool):
    torch.manual_seed(0)
    m = copy.deepcopy(model)
    if device:
        m = m.to(device)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, foreach=False)
    fn = torch.compile(m, backend="saturn", dynamic=False) if compiled else m
    for i in range(steps):
        x, y = data[i % len(data)]
        if device:
            x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(fn(x), y)
        loss.backward()
        opt.step()
    return m


def assert_parameters_match(ref: torch.nn.Module, got: torch.nn.Module, skip=None):
    skip = skip or {}
    for (name, p), q in zip(ref.named_parameters(), got.parameters(), strict=True):
        p, q = p.detach().flatten(), q.detach().cpu().flatten()
        keep = torch.ones_like(p, dtype=torch.bool)
        if name in skip:
            keep[skip[name]] = False
        err = ((p - q)[keep].abs().max() / p.abs().max().clamp_min(1e-12)).item()
        assert err < 1e-4, f"{name}: relative difference {err:.2e}"


def test_mlp_trains_like_eager_with_a_frozen_bias(dev):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model[0].bias.requires_grad_(False)  # a frozen bias: its gradient position is None
    data = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(4)]
    ref = train(model, data, 200, None, compiled=False)
    got = train(model, data, 200, dev, compiled=True)
    assert_parameters_match(ref, got)
    assert torch.equal(got[0].bias.cpu(), model[0].bias), "the frozen bias never moved"
    graphs = [g for g in backend.CACHE.items.values() if g.recipe.device == torch.device(dev)]
    assert any(None in g.recipe.output_spec for g in graphs), "a None gradient position"
    assert all(g.compiled.program.kernels for g in graphs[-2:]), "forward and backward compiled"


def test_transformer_encoder_layer_trains_like_eager(dev):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    data = [(torch.randn(2, 5, 16), torch.randn(2, 5, 16)) for _ in range(4)]
    ref = train(model, data, 200, None, compiled=False)
    got = train(model, data, 200, dev, compiled=True)
    # The key bias (in_proj_bias[16:32]) gets an exactly-zero gradient in exact arithmetic
    # (softmax ignores a constant added to every score of a row), so its gradient is rounding
    # noise, which Adam divides by its own size: it drifts by lr per step in any two
    # implementations. Every other parameter, the query and value biases too, must match.
    x, _ = data[0]
    model.zero_grad()
    model(x).sum().backward()
    gb = model.self_attn.in_proj_bias.grad
    assert gb[16:32].abs().max() < 1e-5 * gb[:16].abs().max()
    assert_parameters_match(ref, got, skip={"self_attn.in_proj_bias": slice(16, 32)})
    graphs = [g for g in backend.CACHE.items.values() if g.recipe.device == torch.device(dev)]
    for g in graphs[-2:]:  # forward and backward: every step on the device
        prog = g.compiled.program
        assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
        if g.recipe.runner is not None:  # on a GPU, replayed as a CUDA graph
            assert g.recipe.runner.replays > 0


def test_conv_net_trains_like_eager(dev):
    """The input needs no gradient, so the first layer's convolution_backward asks for no
    input gradient (its output mask starts with False): the backward makes one input
    gradient, the second layer's (a convolution on saturn:0, decision 0088; cuDNN's
    backward-data on a GPU, decision 0125), and runs no host step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 4, 3, stride=2),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 3 * 3, 5),
    )
    data = [(torch.randn(4, 3, 14, 14), torch.randn(4, 5)) for _ in range(2)]
    fallbacks = len(backend.CACHE.fallbacks)
    ref = train(model, data, 30, None, compiled=False)
    got = train(model, data, 30, dev, compiled=True)
    assert_parameters_match(ref, got)
    assert backend.CACHE.fallbacks[fallbacks:] == []
    graphs = [g for g in backend.CACHE.items.values() if g.recipe.device == torch.device(dev)]
    prog = graphs[-1].compiled.program
    assert prog.count("host") == 0, prog.to_text()
    grads = sorted(k.attrs["of"] for k in prog.kernels if k.kind == "conv_grad")
    if dev == "saturn:0":
        assert len([k for k in prog.kernels if k.kind == "conv"]) == 1, prog.to_text()
        assert grads == [], prog.to_text()
    else:
        assert grads == ["input", "weight", "weight"], prog.to_text()


def test_swapped_or_dropped_gradient_position_is_caught():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).to(DEV)
    x = torch.randn(5, 6).to(DEV)
    fn = torch.compile(model, backend="saturn", dynamic=False)
    fn(x).sum().backward()  # compiles forward and backward
    bw = next(reversed(backend.CACHE.items.values())).recipe
    assert len([t for t in bw.output_types if t is not None]) >= 2
    spec = list(bw.output_spec)
    tensor_positions = [i for i, s in enumerate(spec) if s is not None]
    a, b = tensor_positions[:2]
    try:
        bw.output_spec[a], bw.output_spec[b] = spec[b], spec[a]  # swap weight and bias grads
        with pytest.raises(RuntimeError, match=f"output {a}: expected"):
            fn(x).sum().backward()
        bw.output_spec[:] = [s for i, s in enumerate(spec) if i != b]  # drop one
        with pytest.raises(RuntimeError, match="outputs; the graph returns"):
            fn(x).sum().backward()
    finally:
        bw.output_spec[:] = spec
    fn(x).sum().backward()  # restored: runs again


class TinyGPT(torch.nn.Module):
    """Token and position embeddings, pre-norm blocks with causal attention, an untied head,
    cross-entropy: the ops a language model's training step brings."""

    def __init__(self, vocab=50, d=32, heads=4, blocks=2, ctx=16):
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.ln = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * blocks + 1))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(blocks))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(blocks))
        self.fc1 = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(blocks))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        f = torch.nn.functional
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for i in range(len(self.qkv)):
            c = x.shape[-1]
            q, k, v = self.qkv[i](self.ln[2 * i](x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = f.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj[i](y.transpose(1, 2).reshape(b, t, c))
            h = f.gelu(self.fc1[i](self.ln[2 * i + 1](x)), approximate="tanh")
            x = x + self.fc2[i](h)
        logits = self.head(self.ln[-1](x))
        return f.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _assert_two_graphs_without_host_steps(before: int) -> None:
    """The forward and the backward compiled since ``before``, neither with a host step."""
    assert backend.CACHE.compiles - before == 2
    for g in list(backend.CACHE.items.values())[-2:]:
        prog = g.compiled.program
        assert prog.count("host") == 0, [s.op for s in prog.steps if s.kind == "host"]


def test_gpt_style_model_gradients_match_eager(dev):
    """Loss and every gradient as eager's on the CPU. The split of q/k/v, the causal mask's
    boolean full and logical_and, the position arange, the embeddings (takes) and their
    gradients (rows added at the token ids: index_put with accumulate), and cross-entropy's
    gather of the targets and its backward scatter (a take and a row add at flat
    positions, device/decompositions.py) run as kernels: nothing runs on the host."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = TinyGPT()
    model = TinyGPT().to(dev)
    model.load_state_dict(ref.state_dict())
    idx, tgt = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    before = backend.CACHE.compiles
    loss = torch.compile(model, backend="saturn", dynamic=False)(idx.to(dev), tgt.to(dev))
    loss.backward()
    want = ref(idx, tgt)
    want.backward()
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6, msg=name)
    _assert_two_graphs_without_host_steps(before)
    forward, backward = (c.compiled.program for c in list(backend.CACHE.items.values())[-2:])
    # the forward takes the targets' log-probabilities: elements of the 32 x 50 table
    picks = [k for k in forward.kernels if k.kind == "gather" and k.inputs[0].shape[1] == 1]
    assert [k.inputs[0].shape for k in picks] == [(32 * 50, 1)], forward.to_text()
    # the backward adds the token embedding's gradient rows on the device (the positions'
    # rows, a constant index, too), and marks the targets' positions (int32 counts)
    adds = [k for k in backward.kernels if k.kind == "scatter"]
    assert len(adds) == 3 and [k.dtype for k in adds].count("i32") == 1, backward.to_text()


class PatchMerge(torch.nn.Module):
    """torchvision Swin's patch merging: H and W padded to even, the four 2 x 2 phases
    (strided slices) joined on channels, a layer norm and a linear."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4 * c)
        self.lin = torch.nn.Linear(4 * c, 2 * c, bias=False)

    def forward(self, x):
        h, w = x.shape[-3:-1]
        x = torch.nn.functional.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        phases = [x[..., i::2, j::2, :] for j in (0, 1) for i in (0, 1)]
        return self.lin(self.norm(torch.cat(phases, -1))).square().mean()


def test_patch_merging_gradients_match_eager(dev):
    """The backward of a pad (a crop: constant_pad_nd with negative amounts) and of
    strided slices (slice_scatter with a step of 2) run as device work, not PyTorch's ops:
    the input's and the parameters' gradients as eager's on the CPU, no host step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = PatchMerge(8)
    model = PatchMerge(8).to(dev)
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, 7, 8)
    mine = x.to(dev).requires_grad_()
    theirs = x.clone().requires_grad_()
    before = backend.CACHE.compiles
    loss = torch.compile(model, backend="saturn", dynamic=False)(mine)
    loss.backward()
    want = ref(theirs)
    want.backward()
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine.grad.cpu(), theirs.grad, rtol=1e-4, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6, msg=name)
    _assert_two_graphs_without_host_steps(before)


@pytest.mark.parametrize("kind", ["sgd", "adamw", "sgd-foreach", "adamw-foreach"])
@pytest.mark.parametrize("device", [DEV, pytest.param("saturn:1", marks=pytest.mark.gpu)])
def test_compiled_optimizer_step_matches_eager(kind, device):
    """opt.step compiled by saturn: SGD with momentum (p.add_(buf, alpha=-lr)) and AdamW
    (CPU step counters beside saturn tensors, beta ** step, addcmul's fma), in their
    one-tensor and (PyTorch's default) multi-tensor forms. No op of the compiled step runs
    through the CPU fallback, and the parameters match eager CPU training after 20 steps.
    On saturn:0 none stays on the host; on a GPU the small parameters' updates run a few
    to a launch (``horizontal.group_loops``), and so do their writes into the parameters
    (``runner_writes.py``)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref, dev = copy.deepcopy(model), copy.deepcopy(model).to(device)

    def make(params):
        foreach = kind.endswith("-foreach")
        if kind.startswith("sgd"):
            return torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=foreach)
        return torch.optim.AdamW(params, lr=1e-2, foreach=foreach)

    opt_ref, opt_dev = make(ref.parameters()), make(dev.parameters())
    step = torch.compile(opt_dev.step, backend="saturn")
    data = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(4)]
    fallbacks_before = len(backend.CACHE.fallbacks)
    for i in range(20):
        x, y = data[i % 4]
        opt_ref.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt_ref.step()
        opt_dev.zero_grad()
        torch.nn.functional.mse_loss(dev(x.to(device)), y.to(device)).backward()
        if i >= 2:  # compiled (dynamo recompiles once the optimizer's state exists)
            counted = dict(saturn.fallback_counts())
        step()
        if i >= 2:
            assert saturn.fallback_counts() == counted, "the compiled step used the fallback"
    assert backend.CACHE.fallbacks[fallbacks_before:] == []
    assert_parameters_match(ref, dev)
    last = next(reversed(backend.CACHE.items.values()))
    prog = last.compiled.program
    if device == DEV:
        assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
    else:
        groups = [k for k in prog.kernels if k.kind == "loop" and "segments" in k.attrs]
        assert groups and any(k.kind == "row_stat" for k in prog.kernels), prog.to_text()
        # and the new parameters went back into the model's tensors by grouped copies
        assert last.recipe.runner.write_back.groups, last.recipe.runner.in_place


def test_training_and_optimizer_graphs_emit_gpu_kernels():
    """Without a GPU: a GPT-style model's forward and backward graphs and a default AdamW
    step, compiled for the GPU machine, lower to kernels the CUDA emitter takes (no host
    step in the optimizer's, every loop, reduction and rows kernel generates)."""
    from torch._dynamo.backends.common import aot_autograd

    from saturn import decompositions
    from saturn.codegen import cuda as cg
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    programs = []

    def capture(gm, _example):
        graph = import_graph(gm, replacements=True).graph
        programs.append(compile_graph(graph, machine="gpu", io_on_device=True).program)
        return gm.forward

    backend_ = aot_autograd(
        fw_compiler=capture, bw_compiler=capture, decompositions=decompositions.table()
    )
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT().to(DEV)
    idx, tgt = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    torch.compile(model, backend=backend_, dynamic=False)(idx.to(DEV), tgt.to(DEV)).backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()  # the state exists: the compiled step is the steady one
    torch.compile(opt.step, backend=backend_)()
    assert len(programs) == 3
    assert programs[2].count("host") == 0 and programs[2].count("crossing") == 0
    kinds = set()
    for prog in programs:
        for k in prog.kernels:
            if k.kind in ("loop", "reduce", "rows"):
                cg.generate(k)  # raises for a kernel the emitter does not take
                kinds.add(k.kind)
    assert kinds == {"loop", "reduce", "rows"}


@pytest.mark.gpu
def test_an_embedding_block_trains_replayed_on_the_gpu():
    """Token and position embeddings and a layer norm: the forward (which returns the
    positions' arange for the backward: a device constant) and the backward (the rows added
    at the token ids) both replay as CUDA graphs, with every gradient as eager's on the CPU;
    only the forward reads its index check back."""
    from tests.compile.blocks import Embed

    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = Embed(16, vocab=50, context=32)
    model = copy.deepcopy(ref).to("saturn:1")
    ids = torch.randint(0, 50, (2, 8))
    ids[0, :3] = 7  # a repeated token: its gradient rows add up
    g = torch.randn(2, 8, 16)
    (ref(ids) * g).sum().backward()
    before = backend.CACHE.compiles
    fn = torch.compile(model, backend="saturn", dynamic=False)
    idd, gd = ids.to("saturn:1"), g.to("saturn:1")
    for _ in range(4):  # compiled, captured, replayed
        for p in model.parameters():
            p.grad = None
        (fn(idd) * gd).sum().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert backend.CACHE.compiles - before == 2
    for c in list(backend.CACHE.items.values())[-2:]:
        prog = c.compiled.program
        assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
        assert c.recipe.runner.replays >= 2
    # the forward takes rows at the caller's ids: checked after every call; the backward
    # adds rows at the ids clamped into the table: nothing to check, no wait for the device
    forward, backward = list(backend.CACHE.items.values())[-2:]
    assert forward.recipe.runner._unbounded_indices
    assert not backward.recipe.runner._unbounded_indices
    # the layer norm's mean and rstd, which the backward reads, written by its rows kernel
    assert [k.kind for k in forward.compiled.program.kernels].count("row_stat") == 2


def _trained_on_the_gpu(f, tensors, g):
    """``f`` compiled on saturn:1, its output and the gradients of ``(f(*tensors) * g).sum()``
    checked against eager on the CPU; the forward and backward programs."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    want = f(*leaves)
    (want * g).sum().backward()
    dev = [t.detach().to("saturn:1").requires_grad_() for t in tensors]
    before = backend.CACHE.compiles
    got = torch.compile(f, backend="saturn", dynamic=False)(*dev)
    (got * g.to("saturn:1")).sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    for t, ref in zip(dev, leaves, strict=True):
        torch.testing.assert_close(t.grad.cpu(), ref.grad, rtol=1e-4, atol=1e-4)
    assert backend.CACHE.compiles - before == 2
    forward, backward = list(backend.CACHE.items.values())[-2:]
    return forward.compiled.program, backward.compiled.program


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "width"), [(4096, 48), (64, 768), (3, 1100)])
def test_a_layer_norm_trains_on_the_gpu_with_statistics_from_its_rows_kernel(rows, width):
    """A training layer norm over rows shared by parts of a warp, by warps and by blocks:
    one rows kernel writes the norm and the mean and rstd the backward reads (no reduction
    of their own), and the output and every gradient are eager's on the CPU."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w, b, g = (
        torch.randn(rows, width),
        torch.randn(width),
        torch.randn(width),
        torch.randn(rows, width),
    )
    x[0] = 0.0  # a constant row: variance 0, rstd 1/sqrt(eps)

    def f(x, w, b):
        return torch.nn.functional.layer_norm(x * 2.0, (width,), w, b, 1e-5)

    forward, _ = _trained_on_the_gpu(f, (x, w, b), g)
    kinds = [k.kind for k in forward.kernels]
    assert kinds.count("row_stat") == 2 and "reduce" not in kinds, forward.to_text()


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "channels", "side"), [(8, 16, 12), (2, 3, 40), (64, 8, 32)])
def test_a_batch_norm_backward_sums_its_gradients_in_shared_kernels_on_the_gpu(
    batch, channels, side
):
    """A training batch norm's backward sums the output gradient and its product with the
    normalized input per channel: one reduce kernel each pair, the second sum written beside
    the first (``horizontal.py``; blocks per channel, and split into chunks where the
    channels are too few), and every gradient is eager's on the CPU."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(channels)
    x, g = torch.randn(batch, channels, side, side), torch.randn(batch, channels, side, side)

    def f(x, w, b):
        return torch.nn.functional.batch_norm(x, None, None, w, b, True, 0.1, 1e-5).relu()

    _, backward = _trained_on_the_gpu(f, (x, bn.weight, bn.bias), g)
    written = {k.inputs[0].value for k in backward.kernels if k.kind == "row_stat"}
    beside = [k for k in backward.kernels if k.kind == "reduce" and k.output in written]
    assert beside and all(len(k.attrs["stats"]) >= 1 for k in beside), backward.to_text()


def test_a_training_graph_text_reads_back_as_the_same_graph():
    """A backward graph's host ops returning several results (a transposed convolution's
    backward) are read through ``Item`` nodes: the graph's text, as the compile cache keys
    it and ``python -m saturn.eqsat`` replays it, reads back to the same text and compiles
    to the same program."""
    from saturn.eqsat.graph import parse_graph
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.ConvTranspose2d(3, 4, 3, 2), torch.nn.Flatten(), torch.nn.Linear(4 * 9 * 9, 2)
    )
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    graphs = [import_graph(gm, replacements=True).graph for gm in traced_step(model, x)]
    assert len(graphs) == 2
    texts = [g.to_text() for g in graphs]
    assert any("(Item " in t for t in texts), texts
    for graph, text in zip(graphs, texts, strict=True):
        back = parse_graph(text)
        assert back.to_text() == text
        want = compile_graph(graph, machine="gpu", io_on_device=True)
        got = compile_graph(back, machine="gpu", io_on_device=True)
        assert got.program.to_text() == want.program.to_text()


def test_half_layer_norm_statistics_stay_float32_as_cuda_keeps_them():
    """CUDA's layer norm keeps a half input's mean and rstd in float32 (Welford in float32):
    the training forward's statistics are then the float32 ones of x widened, and the graph
    compiles for the GPU with no host step. Traced here on the CPU (whose statistics are
    half) with the statistics' types made CUDA's; values checked with the numpy evaluator."""
    import numpy as np
    from torch.fx.experimental.proxy_tensor import make_fx

    from saturn.eqsat.evaluate import eval_graph
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    def f(x, w, b):
        return torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)

    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8).half(), torch.randn(8).half(), torch.randn(8).half()
    gm = make_fx(f, tracing_mode="fake")(x, w, b)
    for node in gm.graph.nodes:  # the statistics as CUDA types them
        val = node.meta.get("val")
        if node.target is torch.ops.aten.native_layer_norm.default:
            with val[1].fake_mode:
                node.meta["val"] = (val[0], *(torch.empty(v.shape) for v in val[1:]))
        elif node.op == "call_function" and node.args[1] in (1, 2):
            with val.fake_mode:
                node.meta["val"] = torch.empty(val.shape)
    graph = import_graph(gm, replacements=True).graph
    assert [graph.nodes[o].dtype for o in graph.outputs] == ["f16", "f32", "f32"]
    prog = compile_graph(graph, machine="gpu", io_on_device=True).program
    assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
    names = [n.name for n in graph.nodes.values() if n.op in ("Input", "Param")]
    feed = dict(zip(names, (x.numpy(), w.numpy(), b.numpy()), strict=True))
    y, mean, rstd = eval_graph(graph, feed)
    xf = x.float()
    var = xf.var(-1, unbiased=False, keepdim=True)
    np.testing.assert_allclose(mean, xf.mean(-1, keepdim=True).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rstd, torch.rsqrt(var + 1e-5).numpy(), rtol=1e-5)
    # y as before (the evaluator computes a half op in the half type: a few roundings)
    want = torch.nn.functional.layer_norm(xf, (8,), w.float(), b.float(), 1e-5)
    np.testing.assert_allclose(y.astype(np.float32), want.numpy(), rtol=5e-3, atol=5e-3)


def test_half_table_gradient_adds_on_the_gpu_in_float32():
    """Without a GPU: the backward of a bfloat16 table read at repeated indices (Swin's
    relative position bias: index_put with accumulate) compiled for the GPU machine is a
    float32 row add between two casts, no host step; for saturn:0 the op keeps its type."""
    from saturn.eqsat.pipeline import compile_graph
    from saturn.importer import import_graph

    table = torch.randn(10, 4, dtype=torch.bfloat16, requires_grad=True)
    idx = torch.tensor([1, 3, 1, 7, 3, 3])

    def read(t, i):
        return t[i] * 2

    backward = traced_step(read, table, idx)[-1]
    gpu = import_graph(backward, replacements=True).graph
    cpu = import_graph(backward, replacements=False).graph
    adds = [n for n in gpu.nodes.values() if n.op == "IndexAdd"]
    assert [n.dtype for n in adds] == ["f32"], gpu.to_text()
    assert [n.dtype for n in cpu.nodes.values() if n.op == "IndexAdd"] == ["bf16"]
    prog = compile_graph(gpu, machine="gpu", io_on_device=True).program
    assert prog.count("host") == 0 and prog.count("crossing") == 0, prog.to_text()
