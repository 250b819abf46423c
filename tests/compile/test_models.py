"""Compiled on saturn:0 against eager on the CPU at 1e-5: MLP, transformer encoder layer,
ResNet basic block, softmax/log-softmax."""

from __future__ import annotations

import torch

from .helpers import compile_and_compare, last_compiled


class MLP(torch.nn.Module):
    def __init__(self, d=32, h=64):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


class BasicBlock(torch.nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
        for bn in (self.bn1, self.bn2):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def test_mlp():
    torch.manual_seed(0)
    compile_and_compare(MLP(), torch.randn(8, 32))
    prog = last_compiled().compiled.program
    assert [k.kind for k in prog.kernels].count("gemm") == 2
    assert prog.count("host") == 0 and prog.count("crossing") == 0


def test_transformer_encoder_layer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    compile_and_compare(layer, torch.randn(2, 8, 32))
    prog = last_compiled().compiled.program
    # the fused fast-path op was written out: no opaque host call is left, and every
    # matrix product is a GEMM kernel (qkv, two attention bmm, projection, two FFN layers)
    assert not [s.op for s in prog.steps if s.kind == "host" and "#" in s.op]
    assert sum(k.kind == "gemm" for k in prog.kernels) == 6
    assert not [
        s for s in prog.steps if s.kind == "host" and s.op in ("MatMul", "Addmm", "BatchMatMul")
    ]


def test_resnet_basic_block():
    torch.manual_seed(0)
    compile_and_compare(BasicBlock(), torch.randn(2, 8, 10, 10))
    kinds = [k.kind for k in last_compiled().compiled.program.kernels]
    assert kinds.count("conv") == 2 and "loop" in kinds


def test_softmax_and_log_softmax():
    torch.manual_seed(0)
    x = torch.randn(6, 33) * 4
    compile_and_compare(lambda t: torch.softmax(t, -1), x)
    assert [k.kind for k in last_compiled().compiled.program.kernels] == [
        "reduce",
        "reduce",
        "loop",
    ]
    compile_and_compare(lambda t: torch.log_softmax(t, 0), x)
