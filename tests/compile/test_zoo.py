"""Real models from their libraries (``bench/zoo.py``'s tiny sizes) compiled for saturn:0:
no graph runs uncompiled, the output equals eager CPU's (float32 within 1e-4; bfloat16
within twice what eager bfloat16 differs from float32), and every op but those named runs
as compiled code. Every model of the zoo, with and without a key/value cache, in both
dtypes; and one training step of a CNN, an encoder and a decoder with its cache."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from saturn import backend

pytest.importorskip("torchvision", reason="the zoo extra is not installed")
pytest.importorskip("transformers", reason="the zoo extra is not installed")

_spec = importlib.util.spec_from_file_location(
    "saturn_zoo", Path(__file__).resolve().parents[2] / "bench" / "zoo.py"
)
zoo = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = zoo  # as an import would: the zoo hands itself to its training rows
_spec.loader.exec_module(zoo)

# the CNNs whose tiny forms still take seconds each on two cores (marked slow: `-m "not
# slow"` skips them in a quick run; CI runs everything)
SLOW = {"densenet121", "resnet152", "mobilenet_v2", "swin_t", "regnet_y_400mf", "efficientnet_b0"}
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in zoo.MODELS]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_on_saturn0(name, dtype):
    before = len(backend.CACHE.fallbacks)
    row = zoo.run_one(name, "saturn:0", dtype, "tiny", repeats=1, baselines="eager")
    assert "first_call_s" in row, row.get("error")
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    assert row["uncompiled"] == 0 and row["graph_breaks"] == 0, row
    assert row["failed_calls"] == [], row["failed_calls"]  # none reran uncompiled
    assert row["correct"], (row["error"], row.get("eager_error"))
    if dtype == "float32" and name == "MistralModel":
        # the key/value cache's cat (its first piece PyTorch's legacy 1-D empty tensor)
        assert row["host_ops"] == {}, row["host_ops"]
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["resnet18", "DistilBertModel", "MistralModel"])
def test_zoo_training_step_on_saturn0(name, monkeypatch):
    """One step (forward, backward, SGD) compiled on saturn:0 against the same step in eager
    on the CPU: the updated parameters agree within 1e-4. Eval mode (no dropout, batch
    norm's running statistics), gradients on. A second step copies no input: the saved
    tensors the backward takes (transposed weights, permuted activations) are read in
    place (decision 0130)."""
    import copy

    torch.manual_seed(0)
    model, inputs = zoo.MODELS[name]("tiny")
    model = model.eval()

    def step(m, xs):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = zoo._first(m(*xs))
        loss = out.float().square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    ref = copy.deepcopy(model)
    want = step(ref, inputs)
    mine = copy.deepcopy(model).to("saturn:0")
    before = len(backend.CACHE.fallbacks)
    torch._dynamo.reset()
    compiled = torch.compile(mine, backend="saturn", dynamic=False)
    got = step(compiled, [x.to("saturn:0") for x in inputs])
    assert backend.CACHE.fallbacks[before:] == [], backend.CACHE.fallbacks[before:]
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(mine.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=n)
    if name == "resnet18":  # its pools and convolutions' backward are kernels (0087, 0088)
        forward, backward = (g.compiled.program for g in list(backend.CACHE.items.values())[-2:])
        assert forward.count("host") == 0 and backward.count("host") == 0, backward.to_text()
    from saturn.input_windows import Window
    from saturn.recipe import Recipe

    copies, copy_in, packed = [], Recipe._copy, Window.packed
    monkeypatch.setattr(
        Recipe, "_copy", staticmethod(lambda t, w, s: copies.append(t.shape) or copy_in(t, w, s))
    )
    monkeypatch.setattr(Window, "packed", lambda w, t, d: copies.append(t.shape) or packed(w, t, d))
    step(compiled, [x.to("saturn:0") for x in inputs])
    assert copies == [], copies
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["resnet18", "DistilBertModel"])
def test_zoo_training_rows_compare_with_a_reference_process(name):
    """``bench/zoo.py --training``: saturn's step against eager's, computed in a process that
    never imports saturn (on a GPU, CUDA autograd), not even through a library that probes
    for optional packages with bench/ on its path (transformers imports ``kernels`` if it
    finds one). The three graphs (forward with the loss, backward, the optimizer's step)
    compiled, the losses and gradient norms equal to eager CPU's."""
    row = zoo.run_one(name, "saturn:0", "float32", "tiny", repeats=1, training=True)
    assert row.get("correct"), row
    assert row["graphs"] == 3 and row["uncompiled"] == 0 and row["failed_calls"] == [], row
    assert 0 <= row["error"] <= 1e-4 and "eager_s" in row, row
    torch._dynamo.reset()


def test_zoo_training_error_sees_a_difference():
    training = zoo._training()
    want = [2.0, 1.5, 0.25, 4.0]
    assert training.error(want, want) == 0.0
    assert training.error([2.0, 1.5, 0.25, 4.004], want) == pytest.approx(1e-3)
    assert training.error([2.0, float("nan"), 0.25, 4.0], want) != training.error(want, want)


def test_zoo_training_step_stays_finite_on_a_deep_network():
    """The training row's step divides the loss's gradient by the loss: ResNet-152 (random
    weights, eval-mode batch norms that do not normalise) has a first loss of about 2e9, and
    a plain SGD step on it made eager's own second loss NaN, so no row could be compared."""
    training = zoo._training()
    model, inputs = zoo.build("resnet152", "tiny")
    step = training.Step(model, torch.optim.SGD(model.parameters(), lr=training.LR), zoo._first)
    got, _ = training.measures(step, inputs, lambda: None)
    assert got[0] > 1e8  # the loss itself is what the model computes, unscaled
    assert all(math.isfinite(x) for x in got), got
    assert got[1] != got[0]  # the step moved the parameters


def test_zoo_child_rows_state_written_out_convolution_gradients():
    """``--conv-grads written``, ``--input-writes aot`` and ``--attention-grad fused`` reach
    the model's own process, which states them in its row (A/Bs of decisions 0125, 0127
    and 0128; the first and last only change GPU targets' graphs)."""
    import argparse

    def args(conv_grads, input_writes="saturn", attention_grad="auto"):
        return argparse.Namespace(
            device="saturn:0",
            dtype="float32",
            size="tiny",
            training=False,
            no_baselines=True,
            baselines="none",
            rewrites=[],
            conv_grads=conv_grads,
            input_writes=input_writes,
            attention_grad=attention_grad,
            timeout=300,
        )

    written = zoo._child("resnet18", args("written", "aot", "fused"))
    assert written.get("correct") and written["conv_grads"] == "written", written
    assert written["input_writes"] == "aot" and written["attention_grad"] == "fused", written
    plain = zoo._child("resnet18", args("cudnn"))
    assert not {"conv_grads", "input_writes", "attention_grad"} & set(plain)


def test_mixture_of_experts_on_saturn0():
    """transformers' Mixtral (tiny): its experts count their tokens with ``histc`` of int32
    ids on any device but the CPU (``eager_host``), route with top-k and sort, and run
    through transformers' grouped-product op. Compiled on saturn:0 it equals eager CPU's
    output, with no graph or call run uncompiled."""
    build = zoo._hf(
        "MixtralConfig", "MixtralModel", {"num_key_value_heads": 2, "num_local_experts": 4}
    )
    torch.manual_seed(0)
    model, inputs = build("tiny")
    model = model.eval()
    with torch.no_grad():
        want = zoo._first(model(*inputs))
    before, failed = len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)
    torch._dynamo.reset()
    compiled = torch.compile(model.to("saturn:0"), backend="saturn", dynamic=False)
    with torch.no_grad():
        got = zoo._first(compiled(*[x.to("saturn:0") for x in inputs]))
    assert backend.CACHE.fallbacks[before:] == [] and backend.CACHE.failed_calls[failed:] == []
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
