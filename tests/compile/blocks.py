"""The model blocks the GPU tests and bench/blocks.py share: an MLP, a
TransformerEncoderLayer, a ResNet basic block and a language model's input block (token and
position embeddings, layer norm), at a small and a large size."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 32000


class BasicBlock(nn.Module):
    """ResNet's basic block (eval mode: batch norm is an affine map)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class Embed(nn.Module):
    """A language model's input: token and position embeddings summed, then layer norm."""

    def __init__(self, d: int, vocab: int = VOCAB, context: int = 1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.ln(self.tok(ids) + self.pos(pos))


def mlp(d: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))


def encoder(d: int) -> nn.Module:
    return nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)


def basic_block(c: int) -> nn.Module:
    m = BasicBlock(c)
    with torch.no_grad():  # non-trivial batch-norm statistics
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m


# name -> (model factory argument, input shape)
WORKLOADS = {
    "mlp-8x128x512": ("mlp", 512, (8, 128, 512)),
    "mlp-32x512x1024": ("mlp", 1024, (32, 512, 1024)),
    "encoder-8x128x512": ("encoder", 512, (8, 128, 512)),
    "encoder-32x512x1024": ("encoder", 1024, (32, 512, 1024)),
    "resnet-8x64x56x56": ("resnet", 64, (8, 64, 56, 56)),
    "resnet-32x64x56x56": ("resnet", 64, (32, 64, 56, 56)),
    "embed-8x128x768": ("embed", 768, (8, 128)),
    "embed-32x512x1024": ("embed", 1024, (32, 512)),
}
FACTORIES = {"mlp": mlp, "encoder": encoder, "resnet": basic_block, "embed": Embed}


def make(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    kind, width, shape = WORKLOADS[name]
    torch.manual_seed(seed)
    model = FACTORIES[kind](width).eval()
    if kind == "embed":  # token ids
        return model, torch.randint(0, VOCAB, shape)
    return model, torch.randn(shape)
