"""``module.to("saturn:N")`` keeps a module's Parameters, as ``.to("cuda")`` does: tied
weights stay one tensor and an optimizer built before the move updates what the module
uses. PyTorch decides this with ``_has_compatible_shallow_copy_type``, which saturn
answers for its tensors (device/csrc/ops.cpp)."""

from __future__ import annotations

import pytest
import torch

import saturn  # noqa: F401 - registers the device


class Tied(torch.nn.Module):
    """An embedding whose output projection is the same Parameter (GPT-2's lm_head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(ids)))


def _train(model: torch.nn.Module, opt, ids: torch.Tensor, steps: int = 3) -> list[float]:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_the_shallow_copy_question_is_answered_for_saturn_tensors(dev):
    cpu = torch.ones(3)
    on = cpu.to(dev)
    assert torch._has_compatible_shallow_copy_type(cpu, on)
    assert torch._has_compatible_shallow_copy_type(on, cpu)
    assert torch._has_compatible_shallow_copy_type(on, on.double())
    sparse = torch.eye(3).to_sparse()  # a different TensorImpl: no shallow copy
    assert not torch._has_compatible_shallow_copy_type(on, sparse)
    assert not torch._has_compatible_shallow_copy_type(sparse, on)


def test_data_assignment_moves_a_tensor_in_place(dev):
    p = torch.nn.Parameter(torch.arange(4.0))
    p.data = p.data.to(dev)
    assert isinstance(p, torch.nn.Parameter) and p.device == torch.device(dev)
    assert torch.equal(p.detach().cpu(), torch.arange(4.0))


def test_moving_a_model_keeps_its_parameters_tied_and_its_optimizer_working(dev):
    torch.manual_seed(0)
    ref = Tied()
    model = Tied()
    model.load_state_dict(ref.state_dict())
    params = list(model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before the move, as users do
    model.to(dev)
    assert model.head.weight is model.emb.weight
    assert list(model.parameters()) == params  # the same objects, now on the device
    assert all(p.device == torch.device(dev) for p in params)

    ids = torch.randint(0, 11, (2, 5))
    want = _train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), ids)
    got = _train(model, opt, ids.to(dev))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(model.emb.weight.detach().cpu(), ref.emb.weight.detach())
    model.to("cpu")  # and back
    assert model.head.weight is model.emb.weight and params[0].device.type == "cpu"


def test_a_gradient_moves_with_its_parameter(dev):
    lin = torch.nn.Linear(3, 2)
    lin(torch.ones(1, 3)).sum().backward()
    grad = lin.weight.grad.clone()
    lin.to(dev)
    assert lin.weight.grad.device == torch.device(dev)
    torch.testing.assert_close(lin.weight.grad.cpu(), grad)


def test_a_transformers_gpt2_keeps_its_embeddings_tied(dev):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.load_state_dict(ref.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to(dev)
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 50, (2, 8))

    def step(m, o, x):
        o.zero_grad()
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        o.step()
        return loss.item()

    for _ in range(2):
        want = step(ref, torch.optim.SGD(ref.parameters(), lr=0.1), ids)
        got = step(model, opt, ids.to(dev))
        assert got == pytest.approx(want, rel=1e-4)
    torch.testing.assert_close(
        model.lm_head.weight.detach().cpu(), ref.lm_head.weight.detach(), rtol=1e-4, atol=1e-5
    )
