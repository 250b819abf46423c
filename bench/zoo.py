"""A model zoo: torchvision, timm and Hugging Face transformers models compiled by saturn,
against eager and Inductor, modelled on PyTorch's dynamo benchmark suites.

Each model is built from its library with random weights (seeded, nothing downloaded) in
one of two sizes: ``tiny`` (a few layers, small widths, 32-64 px images: for saturn:0 and
CI) and ``full`` (the library's standard configuration at a realistic batch: 32 images of
224 px, 8 sequences of 512 tokens). Every model runs in its own process with a time limit,
so one failure never hides the rest.

What is measured, per model, in that process (inference, no_grad, eval mode):
  correct     saturn's output against eager's (saturn:0: eager CPU, fp32 within 1e-4;
              saturn:N: eager CUDA with TF32 off, relative error <= 1e-3; bf16: no more
              than twice eager bf16's own error against eager fp32, on the same device)
  graphs      graphs compiled, graphs run uncompiled (with the reasons), graph breaks
  host ops    host ops and crossings per call (summed over the compiled graphs, named)
  first call  wall time of the first compiled call (compile included)
  call        median wall time of REPEATS calls (synchronized) for saturn, eager and,
              on a GPU, Inductor (default mode, and max-autotune-no-cudagraphs with
              --baselines autotune; their first calls too), all in the same process;
              with --jobs N models build side by side; every first call (saturn's
              compiles and its timed library choices, Inductor's compiles) and every
              timed call runs alone, every other model and reference process paused
              (_slot)
  memory      peak device memory of saturn's and eager's calls, and what saturn's runners
              hold: the memory plan's arenas and the library plans' workspaces (GPU only)

    python bench/zoo.py [--device saturn:1] [--dtype float32|bfloat16] [--size tiny|full]
                        [--only NAME ...] [--timeout S] [--jobs N] [--json PATH]
                        [--baselines all|autotune|eager|none] [--no-baselines] [--training]
                        [--conv-grads cudnn|written] [--input-writes saturn|aot]
                        [--attention-grad auto|math|fused]

--training checks and times one training step instead (bench/zoo_training.py).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPEATS = 10
# Inductor's modes timed beside saturn (row key, torch.compile mode): the default, and with
# --baselines autotune the GEMM and convolution autotuning mode without CUDA graphs
INDUCTOR_MODES = (("inductor", None), ("inductor_ma", "max-autotune-no-cudagraphs"))
ROOT = Path(__file__).resolve().parents[1]


# --- the models ------------------------------------------------------------------------


def _images(size: str, batch_tiny: int = 2, px_tiny: int = 32):
    return (
        torch.randn(32, 3, 224, 224)
        if size == "full"
        else torch.randn(batch_tiny, 3, px_tiny, px_tiny)
    )


def _tokens(size: str, vocab: int):
    shape = (8, 512) if size == "full" else (2, 16)
    return torch.randint(0, min(vocab, 1000), shape)


def _torchvision(name: str, px: int = 32) -> Callable:
    def build(size: str):
        import torchvision

        model = getattr(torchvision.models, name)(
            weights=None, num_classes=1000 if size == "full" else 10
        )
        return model, (_images(size, px_tiny=px),)

    return build


def _timm(name: str, tiny: dict, px: int = 32, cls: str | None = None) -> Callable:
    """``cls``: build the tiny size from this timm class (a model function that fixes the
    arguments a tiny size changes, as mixer_b16_224 fixes its depth and width)."""

    def build(size: str):
        import timm

        if size == "tiny" and cls is not None:
            model = getattr(timm.models, cls)(num_classes=10, **tiny)
        else:
            kwargs = {} if size == "full" else {"num_classes": 10, **tiny}
            model = timm.create_model(name, pretrained=False, **kwargs)
        return model, (_images(size, px_tiny=px),)

    return build


TINY_TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 64,
}


def _hf(
    config_name: str,
    model_name: str,
    tiny: dict | None = None,
    cache: bool | None = None,
    vision: bool = False,
    full: dict | None = None,
) -> Callable:
    """``full``: the published configuration the full size takes where the library's
    default is a 7B-20B model (three copies of which, eager fp32, eager in the dtype and
    saturn's, do not fit one GPU beside Inductor's)."""

    def build(size: str):
        import transformers

        cfg_cls = getattr(transformers, config_name)
        kwargs = dict(full or {}) if size == "full" else {**TINY_TEXT, **(tiny or {})}
        if vision:
            kwargs = {} if size == "full" else {**kwargs, "image_size": 32, "patch_size": 8}
            kwargs.pop("vocab_size", None)
            kwargs.pop("max_position_embeddings", None)
        cfg = cfg_cls(**kwargs)
        cfg._attn_implementation = "sdpa"
        model = getattr(transformers, model_name)(cfg)
        if vision:
            return model, (_images(size),)
        ids = _tokens(size, cfg.vocab_size)
        if cache is not None:
            model.config.use_cache = cache
        return _HFOutputs(model), (ids,)

    return build


class _HFOutputs(torch.nn.Module):
    """A transformers model called on token ids, returning its first output (the last
    hidden state) as a tensor, for comparison."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.m = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids)[0]


# Mistral-7B's layer (hidden 4096, 32 query and 8 key/value heads, MLP 14336) four times.
MISTRAL_FULL = {"num_hidden_layers": 4}
# Qwen2-0.5B.
QWEN2_FULL = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
# Pythia-160M.
NEOX_FULL = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "vocab_size": 50304,
    "rotary_pct": 0.25,
}

MODELS: dict[str, Callable] = {
    # torchvision
    "resnet18": _torchvision("resnet18"),
    "resnet152": _torchvision("resnet152"),
    "mobilenet_v2": _torchvision("mobilenet_v2"),
    "densenet121": _torchvision("densenet121"),
    "regnet_y_400mf": _torchvision("regnet_y_400mf"),
    "shufflenet_v2_x1_0": _torchvision("shufflenet_v2_x1_0"),
    "squeezenet1_1": _torchvision("squeezenet1_1", px=64),
    "swin_t": _torchvision("swin_t", px=64),
    # timm
    "deit_tiny_patch16_224": _timm(
        "deit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2}
    ),
    "mixer_b16_224": _timm(
        "mixer_b16_224",
        {"img_size": 32, "patch_size": 8, "num_blocks": 2, "embed_dim": 64},
        cls="MlpMixer",
    ),
    "convnext_atto": _timm("convnext_atto", {"depths": (1, 1, 1, 1)}),
    "efficientnet_b0": _timm("efficientnet_b0", {}),
    # transformers
    "DistilBertModel": _hf(
        "DistilBertConfig",
        "DistilBertModel",
        {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128},
    ),
    # roberta-base's published sizes: positions start after the padding index (1), so 512
    # tokens need 514 position embeddings (the config's default, 512, indexes out of range)
    "RobertaModel": _hf(
        "RobertaConfig",
        "RobertaModel",
        full={"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1},
    ),
    "OPTModel": _hf("OPTConfig", "OPTModel", {"ffn_dim": 128, "word_embed_proj_dim": 64}),
    "OPTModel-nocache": _hf(
        "OPTConfig", "OPTModel", {"ffn_dim": 128, "word_embed_proj_dim": 64}, cache=False
    ),
    "MistralModel": _hf(
        "MistralConfig", "MistralModel", {"num_key_value_heads": 2}, full=MISTRAL_FULL
    ),
    "MistralModel-nocache": _hf(
        "MistralConfig",
        "MistralModel",
        {"num_key_value_heads": 2},
        cache=False,
        full=MISTRAL_FULL,
    ),
    "Qwen2Model": _hf("Qwen2Config", "Qwen2Model", {"num_key_value_heads": 2}, full=QWEN2_FULL),
    "GPTNeoXModel": _hf("GPTNeoXConfig", "GPTNeoXModel", full=NEOX_FULL),
    "GPTNeoXModel-nocache": _hf("GPTNeoXConfig", "GPTNeoXModel", cache=False, full=NEOX_FULL),
    "ViTModel": _hf("ViTConfig", "ViTModel", vision=True),
    "BartModel": _hf(
        "BartConfig",
        "BartModel",
        {
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
        },
    ),
}


# --- one model, in its own process ------------------------------------------------------


def _first(out):
    while isinstance(out, tuple | list):
        out = out[0]
    return out if isinstance(out, torch.Tensor) else out[0]


def _timed(fn, args, sync, repeats: int = REPEATS) -> float:
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            fn(*args)
            sync()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


@contextlib.contextmanager
def _slot(exclusive: bool):
    """The driver names a lock file (``ZOO_TIMING_LOCK``): a model (and a training row's
    reference process) builds and checks itself holding it shared, beside the others, and
    makes its first calls and its timed calls holding it alone (``exclusive``). Saturn's
    first call times library candidates (cuBLASLt algorithms, cuDNN engines) and keeps the
    fastest, on disk too: timed beside another process's GPU work, a slow candidate can
    win and stay. A gate file beside it lets a waiting holder in first: shared holders
    queue behind it instead of starving it. A process never asks for it alone while it
    holds it shared (that would wait for itself)."""
    path = os.environ.get("ZOO_TIMING_LOCK")
    if not path:
        yield
        return
    with open(path + ".gate", "a") as gate, open(path, "a") as f:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(name: str, size: str):
    """The model (eval mode, seeded weights) and its inputs; TF32 off. The same in every
    process that builds it (a training run's reference process builds it again)."""
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, inputs = MODELS[name](size)
    model = model.eval()
    with torch.no_grad():  # a zero-initialised head (timm's) would make the comparison vacuous
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                torch.nn.init.normal_(p, std=0.02)
    return model, inputs


def moved(model, inputs, device, dtype):
    """A copy of the model and its inputs on ``device``, floating point in ``dtype``."""
    import copy

    m = copy.deepcopy(model).to(device)
    if dtype != torch.float32:
        m = m.to(dtype)
    xs = tuple(x.to(device).to(dtype) if x.is_floating_point() else x.to(device) for x in inputs)
    return m, xs


def _training():
    """bench/zoo_training.py, beside this file."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import zoo_training

    return zoo_training


def _self():
    """This module, however it was loaded (a script, ``import zoo``, a test's spec)."""
    return sys.modules[__name__]


def graph_stats(backend, before_graphs: set, before_fb: int) -> tuple[list, dict]:
    """The graphs compiled since ``before_graphs`` and what they say: graphs, graphs run
    uncompiled (with reasons), graph breaks, host ops by name, crossings, compile stages."""
    new = [cg for k, cg in backend.CACHE.items.items() if k not in before_graphs]
    fallbacks = backend.CACHE.fallbacks[before_fb:]
    host: dict[str, int] = {}
    crossings = 0
    stages: dict[str, float] = {}
    for cg in new:
        prog = cg.compiled.program
        crossings += prog.count("crossing")
        for s in prog.steps:
            if s.kind == "host":
                op = s.op.split("#")[0]  # an opaque op's target, not its node name
                host[op] = host.get(op, 0) + 1
        # where the first call's compile time went (the rest of it is Dynamo, AOTAutograd
        # and the run itself)
        for k, v in cg.compiled.stages.seconds.items():
            stages[k] = stages.get(k, 0.0) + v
    return new, {
        "graphs": len(new),
        "uncompiled": len(fallbacks),
        "reasons": sorted(set(fallbacks))[:5],
        "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
        "host_ops": host,
        "crossings": crossings,
        "stages": {k: round(v, 2) for k, v in stages.items()},
    }


def run_one(
    name: str,
    device: str,
    dtype_name: str,
    size: str,
    repeats: int = REPEATS,
    baselines: str = "all",
    training: bool = False,
    rewrites: tuple[str, ...] = (),
) -> dict:
    """One model's row. ``baselines``: "all" (eager and Inductor), "autotune" (those and
    Inductor's max-autotune-no-cudagraphs), "eager" or "none";
    ``training``: one training step's row (bench/zoo_training.py) instead of inference;
    ``rewrites``: saturn's opt-in rulesets (options={"rewrites": ...}), stated in the row."""
    if training:
        return _training().run(_self(), name, device, dtype_name, size, repeats, baselines)
    import saturn  # noqa: F401
    from saturn import backend

    shared = contextlib.ExitStack()  # building and eager's reference: beside other models
    shared.enter_context(_slot(exclusive=False))
    dtype = getattr(torch, dtype_name)
    gpu = device != "saturn:0"
    model, inputs = build(name, size)
    ref_dev = "cuda" if gpu else "cpu"
    row: dict = {"model": name, "device": device, "dtype": dtype_name, "size": size}
    if rewrites:
        row["rewrites"] = list(rewrites)

    def on(dev, dt):
        return moved(model, inputs, dev, dt)

    with torch.no_grad():
        m32, x32 = on(ref_dev, torch.float32)
        want32 = _first(m32(*x32)).float()
        m_e, x_e = (m32, x32) if dtype == torch.float32 else on(ref_dev, dtype)
        eager_out = want32 if dtype == torch.float32 else _first(m_e(*x_e)).float()
    eager_err = (eager_out - want32).abs().max().item() / max(want32.abs().max().item(), 1e-30)

    sync_ref = torch.cuda.synchronize if gpu else (lambda: None)
    sync_sat = (lambda: torch.saturn.synchronize(device)) if gpu else (lambda: None)
    m_s, x_s = on(device, dtype)
    shared.close()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    before_fb, failed = len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)
    before_graphs = set(backend.CACHE.items)
    options = {"rewrites": list(rewrites)} if rewrites else None
    compiled = torch.compile(m_s, backend="saturn", options=options, dynamic=False)
    if gpu:
        torch.saturn.reset_peak_memory_stats(device)
    try:
        with _slot(exclusive=True):
            t = time.perf_counter()
            with torch.no_grad():
                got = _first(compiled(*x_s)).float().cpu()
            sync_sat()
            row["first_call_s"] = time.perf_counter() - t
    except Exception as e:
        row.update(correct=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        return row
    new, stats = graph_stats(backend, before_graphs, before_fb)
    row.update(stats)
    err = (
        (got - eager_out.cpu() if dtype == torch.float32 else got - want32.cpu()).abs().max().item()
    )
    scale = max(want32.abs().max().item(), 1e-30)
    if dtype == torch.float32:
        tol = 1e-3 if gpu else 1e-4
        row["error"] = err / scale
        row["correct"] = bool(err / scale <= tol and not math.isnan(err))
    else:
        row["error"] = err / scale
        row["correct"] = bool(err / scale <= 2 * max(eager_err, 1e-3) and not math.isnan(err))
    row["eager_error"] = eager_err
    inductors = {}  # row key -> compiled (alone, as saturn was), timed alone below
    alone = contextlib.ExitStack()  # Inductor's first calls, saturn's recompile: alone
    if gpu and baselines in ("all", "autotune"):
        alone.enter_context(_slot(exclusive=True))
        modes = INDUCTOR_MODES if baselines == "autotune" else INDUCTOR_MODES[:1]
        for key, mode in modes:
            try:
                torch._dynamo.reset()  # each mode compiles afresh, not from the last one
                ind = torch.compile(m_e, mode=mode)
                t = time.perf_counter()
                with torch.no_grad():
                    ind(*x_e)
                sync_ref()
                row[f"{key}_first_s"] = time.perf_counter() - t
                inductors[key] = ind
            except Exception as e:
                row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        # the resets dropped saturn's Dynamo cache: compile it again here (its library
        # choices are kept), not in the first of its timed calls
        with torch.no_grad():
            compiled(*x_s)
        sync_sat()
    alone.close()
    with _slot(exclusive=True):
        row["saturn_s"] = _timed(compiled, x_s, sync_sat, repeats)
        if baselines != "none":
            row["eager_s"] = _timed(m_e, x_e, sync_ref, repeats)
            if gpu:
                torch.cuda.reset_peak_memory_stats()
                _timed(m_e, x_e, sync_ref, 1)
                row["eager_peak"] = torch.cuda.max_memory_allocated()
        for key, ind in inductors.items():
            try:
                row[f"{key}_s"] = _timed(ind, x_e, sync_ref)
            except Exception as e:
                row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    # calls that failed and reran uncompiled (decision 0050), CUDA-graph replays
    row["failed_calls"] = backend.CACHE.failed_calls[failed:][:3]
    new = [cg for k, cg in backend.CACHE.items.items() if k not in before_graphs]
    runners = [cg.recipe.runner for cg in new if getattr(cg.recipe, "runner", None)]
    row["replays"] = sum(r.replays for r in runners)
    if gpu:
        row["saturn_peak"] = torch.saturn.max_memory_allocated(device)
        # what the runners hold: the memory plan's arenas and the library plans' workspaces
        row["saturn_arena"] = sum(r.arena.numel() for r in runners if r.arena is not None)
        spaces = {id(t): t.numel() for r in runners for t in r.workspaces.values()}
        row["saturn_workspaces"] = sum(spaces.values())
    return row


# --- the driver -------------------------------------------------------------------------


def _best_inductor(r: dict) -> float:
    """The faster of Inductor's timed modes for one row."""
    return min(r[f"{key}_s"] for key, _ in INDUCTOR_MODES if f"{key}_s" in r)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(rows: list[dict]) -> str:
    ok = [
        r
        for r in rows
        if r.get("correct") and not r.get("uncompiled") and not r.get("failed_calls")
    ]
    lines = [f"pass rate {len(ok)}/{len(rows)} (correct, no graph or call uncompiled)"]
    over_eager = [r["eager_s"] / r["saturn_s"] for r in ok if "eager_s" in r]
    over_ind = [r["inductor_s"] / r["saturn_s"] for r in ok if "inductor_s" in r]
    lines.append(
        f"geomean speed-up over eager {_geomean(over_eager):.2f}x, "
        f"over Inductor {_geomean(over_ind):.2f}x"
    )
    over_best = [_best_inductor(r) / r["saturn_s"] for r in ok if "inductor_ma_s" in r]
    if over_best:
        faster = sum(r["inductor_ma_s"] < r["inductor_s"] for r in ok if "inductor_ma_s" in r)
        lines.append(
            f"over Inductor's best mode {_geomean(over_best):.2f}x (max-autotune-no-cudagraphs "
            f"the faster mode for {faster} of {len(over_best)} models)"
        )
    first = [r["first_call_s"] for r in rows if "first_call_s" in r]
    if first:
        lines.append(
            f"first call mean {statistics.mean(first):.1f} s, median "
            f"{statistics.median(first):.1f} s, max {max(first):.1f} s"
        )
    ind_first = [r["inductor_first_s"] for r in rows if "inductor_first_s" in r]
    if ind_first:
        lines.append(
            f"Inductor first call mean {statistics.mean(ind_first):.1f} s, median "
            f"{statistics.median(ind_first):.1f} s"
        )
    mem = [r["saturn_peak"] / r["eager_peak"] for r in ok if r.get("eager_peak")]
    if mem:
        lines.append(f"peak memory saturn/eager geomean {_geomean(mem):.2f}")
    return "\n".join(lines)


def _stages(stages: dict[str, float]) -> str:
    """The slowest stages first, the ones under a tenth of a second left out."""
    top = sorted(stages.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.1f} s" for k, v in top if v >= 0.1) or "-"


def _format(r: dict) -> str:
    if "first_call_s" not in r or isinstance(r.get("error"), str):
        return f"{r['model']:24s} FAILED  {r.get('error', '')}"
    host = ", ".join(f"{k} x{v}" for k, v in sorted(r.get("host_ops", {}).items())) or "-"
    times = f"saturn {r['saturn_s'] * 1e3:.2f} ms"
    if "eager_s" in r:
        times += f", eager {r['eager_s'] * 1e3:.2f} ms"
    if "inductor_s" in r:
        times += f", inductor {r['inductor_s'] * 1e3:.2f} ms (first {r['inductor_first_s']:.1f} s)"
    if "inductor_ma_s" in r:
        times += (
            f", max-autotune {r['inductor_ma_s'] * 1e3:.2f} ms "
            f"(first {r['inductor_ma_first_s']:.1f} s)"
        )
    if "saturn_peak" in r:
        mb = 2**20
        times += (
            f"; peak {r['saturn_peak'] / mb:.0f} MB (arena {r['saturn_arena'] / mb:.0f}, "
            f"workspaces {r['saturn_workspaces'] / mb:.0f})"
            + (f", eager {r['eager_peak'] / mb:.0f} MB" if "eager_peak" in r else "")
        )
    return (
        f"{r['model']:24s} {'ok     ' if r['correct'] else 'WRONG  '} err {r['error']:.1e} "
        f"graphs {r['graphs']} uncompiled {r['uncompiled']} breaks {r['graph_breaks']} "
        f"crossings {r['crossings']} replays {r.get('replays', 0)} host [{host}] "
        f"first {r['first_call_s']:.1f} s; {times}"
        + (f"\n{'':24s} stages: {_stages(r['stages'])}" if r.get("stages") else "")
        + (f"\n{'':24s} rewrites: {r['rewrites']}" if r.get("rewrites") else "")
        + (f"\n{'':24s} convolution gradients: {r['conv_grads']}" if r.get("conv_grads") else "")
        + (f"\n{'':24s} input writes: {r['input_writes']}" if r.get("input_writes") else "")
        + (f"\n{'':24s} attention grad: {r['attention_grad']}" if r.get("attention_grad") else "")
        + (f"\n{'':24s} uncompiled: {r['reasons']}" if r["uncompiled"] else "")
        + (f"\n{'':24s} failed calls: {r['failed_calls']}" if r.get("failed_calls") else "")
    )


def _child(name: str, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--device", a.device]
    cmd += ["--dtype", a.dtype, "--size", a.size] + (["--training"] if a.training else [])
    cmd += ["--baselines", "none" if a.no_baselines else a.baselines]
    cmd += ["--rewrites", *a.rewrites] if a.rewrites else []
    cmd += ["--conv-grads", a.conv_grads, "--input-writes", a.input_writes]
    cmd += ["--attention-grad", a.attention_grad]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"model": name, "correct": False, "error": f"timed out after {a.timeout:.0f} s"}
    line = next((x for x in p.stdout.splitlines() if x.startswith("ZOO ")), None)
    if line:
        return json.loads(line[4:])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"model": name, "correct": False, "error": tail}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="saturn:0")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--size", default="tiny", choices=["tiny", "full"])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="models run at once: they compile side by side (first calls are those of a "
        "loaded machine) and are timed one at a time",
    )
    ap.add_argument(
        "--baselines",
        default="all",
        choices=["all", "autotune", "eager", "none"],
        help="what saturn is timed against: eager and Inductor (default mode); those and "
        "Inductor's max-autotune-no-cudagraphs; eager only; nothing",
    )
    ap.add_argument("--no-baselines", action="store_true", help="the same as --baselines none")
    ap.add_argument(
        "--training",
        action="store_true",
        help="time and check one training step (forward, loss, backward, SGD; all compiled) "
        "instead of inference (bench/zoo_training.py)",
    )
    ap.add_argument(
        "--rewrites",
        nargs="*",
        default=[],
        help="saturn's opt-in rulesets for inference, e.g. attention (written-out attention "
        "as one kernel); each row states them",
    )
    ap.add_argument(
        "--conv-grads",
        default="cudnn",
        choices=["cudnn", "written"],
        help="a GPU target's convolution gradients: cuDNN's (the default, decision 0125) or "
        "written out as saturn:0's are (an A/B); rows other than the default state it",
    )
    ap.add_argument(
        "--input-writes",
        default="saturn",
        choices=["saturn", "aot"],
        help="a graph's writes to its inputs (the optimizer's updates): made by "
        "saturn's recipe (the default, decision 0127) or copied back by AOTAutograd after "
        "the call (an A/B); rows other than the default state it",
    )
    ap.add_argument(
        "--attention-grad",
        default="auto",
        choices=["auto", "math", "fused"],
        help="attention with a gradient on a GPU: saturn's default (the fused kernels for "
        "float32 rows whose length is not a multiple of 4, aten's math elsewhere: "
        "decision 0132), aten's math, or the fused kernels wherever they apply (decision "
        "0128); rows other than the default state it",
    )
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reference", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    baselines = "none" if a.no_baselines else a.baselines
    if a.training and a.rewrites:
        ap.error("--rewrites applies to inference rows; a training row compiles with the defaults")
    if a.reference:  # a training row's reference: its own process, saturn never imported
        _training().main_reference(_self(), a.reference, a.device, a.dtype, a.size, baselines)
        return
    if a.child:
        if a.conv_grads == "written":
            from saturn import import_conv_backward

            import_conv_backward.LIBRARY_GRADIENTS = False
        if a.input_writes == "aot":
            from saturn import backend

            backend.KEEP_INPUT_WRITES = False
        if a.attention_grad != "auto":
            from saturn import sdpa_grad

            sdpa_grad.set_kernels(a.attention_grad)
        row = run_one(
            a.child,
            a.device,
            a.dtype,
            a.size,
            baselines=baselines,
            training=a.training,
            rewrites=tuple(a.rewrites),
        )
        if a.conv_grads != "cudnn":
            row["conv_grads"] = a.conv_grads
        if a.input_writes != "saturn":
            row["input_writes"] = a.input_writes
        if a.attention_grad != "auto":
            row["attention_grad"] = a.attention_grad
        print("ZOO " + json.dumps(row))
        return
    names = a.only or list(MODELS)
    # first calls and timed calls one at a time, alone (_slot): also with one job, where a
    # training row's reference process runs beside its saturn process
    lock = tempfile.NamedTemporaryFile(prefix="zoo-timing-", suffix=".lock", delete=False)
    os.environ["ZOO_TIMING_LOCK"] = lock.name
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        rows = []
        for r in pool.map(lambda n: _child(n, a), names):
            rows.append(r)
            print(_format(r), flush=True)
            if a.json:  # after every row: a run cut short keeps what it measured
                Path(a.json).write_text(json.dumps(rows, indent=1))
    print(summary(rows))


if __name__ == "__main__":
    main()
