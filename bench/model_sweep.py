"""A correctness sweep over many real models: torchvision, timm and transformers models at
small sizes, compiled by saturn, against eager on the CPU (float32).

The zoo (``bench/zoo.py``) times 23 models at their published sizes; this sweep checks
about a hundred more for what a user meets first: does the model compile whole, does the
call run compiled, is the answer right. Each model runs in a process of its own (a
crash or an exhausted memory is that row's failure, not the sweep's).

- inference: the first output of one call against eager CPU's, largest difference
  relative to the largest entry: at most 1e-4 on saturn:0, 1e-3 on a GPU (TF32 off);
  ``--dtype bfloat16``: against eager CPU's float32 output, at most twice what eager CPU's
  own bfloat16 output differs by (at least 1e-3), the zoo's bar.
- ``--training``: two steps (forward, a loss normalised by its own value, backward, SGD
  at 1e-3), the step and the optimizer's update compiled, against eager CPU's: the losses,
  every gradient of the first step as one vector, and every parameter after the second,
  each as the largest difference relative to the largest entry, at most 1e-4 (1e-3 on a
  GPU). The model stays in eval mode (no dropout; batch norm's running statistics).

Every row also counts graphs run uncompiled, graph breaks and calls that failed compiled
and reran uncompiled. Models take random weights; a weight matrix its library initialises
to zero (a classifier head) is drawn from N(0, 0.02) so the comparison is not vacuous.

    python bench/model_sweep.py [--training | --dtype bfloat16] [--device saturn:0] [--jobs 2]
        [--json F] [NAME...]

A NAME selects the models whose name starts with it (``timm.``, ``hf.Llama``); none: all.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

Built = tuple[torch.nn.Module, tuple[torch.Tensor, ...]]


def _images(px: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, px, px),)


def tv(name: str, px: int = 64) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=10), _images(px)

    return build


def tm(name: str, px: int = 64) -> Callable[[], Built]:
    def build() -> Built:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10), _images(px)

    return build


SMALL_TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 64,
}
SMALL_VISION = {**SMALL_TEXT, "image_size": 32, "patch_size": 8}
del SMALL_VISION["vocab_size"], SMALL_VISION["max_position_embeddings"]


class _First(torch.nn.Module):
    """A transformers model called with its inputs by keyword, returning its first output."""

    def __init__(self, model: torch.nn.Module, keys: tuple[str, ...]):
        super().__init__()
        self.m, self.keys = model, keys

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.m(**dict(zip(self.keys, xs, strict=True)))[0]


def hf(
    config: str, model: str, extra: dict | None = None, small: dict | None = None, kind="ids"
) -> Callable[[], Built]:
    """``small``: the base configuration (the small text one unless given); ``kind``: ids,
    encdec (ids as the decoder's too), pixels, audio (raw samples), whisper (features)."""

    def build() -> Built:
        import transformers

        cfg = getattr(transformers, config)(
            **{**(SMALL_TEXT if small is None else small), **(extra or {})}
        )
        cls = getattr(transformers, model)
        # PyTorch's fused attention where the model has it, its written-out form where not
        cfg._attn_implementation = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
        m = cls(cfg)
        ids = torch.randint(0, 1000, (2, 16))
        if kind == "ids":
            return _First(m, ("input_ids",)), (ids,)
        if kind == "encdec":
            return _First(m, ("input_ids", "decoder_input_ids")), (ids, ids)
        if kind == "pixels":
            return _First(m, ("pixel_values",)), (
                torch.randn(2, 3, cfg.image_size, cfg.image_size),
            )
        if kind == "audio":
            return _First(m, ("input_values",)), (torch.randn(2, 4000),)
        feats = torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions)
        return _First(m, ("input_features", "decoder_input_ids")), (feats, ids[:, :8])

    return build


_TV = "alexnet vgg11_bn resnet50 resnext50_32x4d wide_resnet50_2 googlenet mnasnet0_5 \
mobilenet_v3_small mobilenet_v3_large efficientnet_v2_s regnet_x_400mf shufflenet_v2_x0_5 \
squeezenet1_0 densenet121 convnext_tiny swin_v2_t"
_TIMM_64 = "resnet18d seresnext26d_32x4d efficientnet_lite0 mobilenetv3_small_100 ghostnet_100 \
poolformer_s12 mobilevit_xxs edgenext_xx_small regnetx_002 dla34 rexnet_100 mixnet_s \
tf_efficientnetv2_b0 lcnet_050 skresnet18 ese_vovnet19b_dw convmixer_768_32 repvit_m1 fastvit_t8 \
mobileone_s0 cspresnet50 hrnet_w18_small res2net50_14w_8s nf_resnet26 gernet_s hardcorenas_a \
resnetv2_50x1_bit inception_next_tiny xcit_nano_12_p16_224 tiny_vit_5m_224 crossvit_tiny_240 \
twins_pcpvt_small pvt_v2_b0 sequencer2d_s davit_tiny focalnet_tiny_srf efficientvit_b0 \
mambaout_femto"
# models whose position tables or windows fix their input size
_TIMM_224 = "efficientformer_l1 levit_128s coat_lite_tiny pit_ti_224 convit_tiny resmlp_12_224 \
gmlp_ti16_224 eva02_tiny_patch14_224 vit_small_patch16_224 beit_base_patch16_224 cait_xxs24_224 \
coatnet_nano_rw_224 nest_tiny hiera_tiny_224"
_KV2 = {"num_key_value_heads": 2}
_GPT = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 1000}

MODELS: dict[str, Callable[[], Built]] = {
    **{f"tv.{n}": tv(n) for n in _TV.split()},
    "tv.inception_v3": tv("inception_v3", 96),
    "tv.maxvit_t": tv("maxvit_t", 224),
    "tv.vit": lambda: (
        __import__("torchvision").models.vision_transformer.VisionTransformer(
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=128,
            num_classes=10,
        ),
        _images(32),
    ),
    **{f"timm.{n}": tm(n) for n in _TIMM_64.split()},
    **{f"timm.{n}": tm(n, 224) for n in _TIMM_224.split()},
    "timm.maxvit_nano_rw_256": tm("maxvit_nano_rw_256", 256),
    "hf.Bert": hf("BertConfig", "BertModel"),
    "hf.GPT2": hf("GPT2Config", "GPT2Model", _GPT, {}),
    "hf.T5": hf(
        "T5Config",
        "T5Model",
        {
            "d_model": 64,
            "d_ff": 128,
            "num_layers": 2,
            "num_heads": 4,
            "d_kv": 16,
            "vocab_size": 1000,
        },
        {},
        "encdec",
    ),
    "hf.Llama": hf("LlamaConfig", "LlamaModel", _KV2),
    "hf.Gemma": hf("GemmaConfig", "GemmaModel", {**_KV2, "head_dim": 16}),
    "hf.Gemma2": hf("Gemma2Config", "Gemma2Model", {**_KV2, "head_dim": 16}),
    "hf.Phi": hf("PhiConfig", "PhiModel"),
    "hf.Phi3": hf("Phi3Config", "Phi3Model", {**_KV2, "pad_token_id": 0}),
    "hf.Falcon": hf("FalconConfig", "FalconModel", {"num_kv_heads": 2}),
    "hf.Bloom": hf("BloomConfig", "BloomModel", {"n_head": 4}),
    "hf.Albert": hf("AlbertConfig", "AlbertModel", {"embedding_size": 32}),
    "hf.Electra": hf("ElectraConfig", "ElectraModel", {"embedding_size": 32}),
    "hf.DebertaV2": hf("DebertaV2Config", "DebertaV2Model"),
    "hf.MobileBert": hf(
        "MobileBertConfig",
        "MobileBertModel",
        {
            "embedding_size": 32,
            "intra_bottleneck_size": 32,
            "true_hidden_size": 32,
            "num_feedforward_networks": 2,
        },
    ),
    "hf.GPTJ": hf("GPTJConfig", "GPTJModel", {**_GPT, "rotary_dim": 8}, {}),
    "hf.CodeGen": hf("CodeGenConfig", "CodeGenModel", {**_GPT, "rotary_dim": 8, "n_ctx": 64}, {}),
    "hf.StableLm": hf("StableLmConfig", "StableLmModel", _KV2),
    "hf.Qwen3": hf("Qwen3Config", "Qwen3Model", {**_KV2, "head_dim": 16}),
    "hf.Olmo": hf("OlmoConfig", "OlmoModel", _KV2),
    "hf.Mixtral": hf("MixtralConfig", "MixtralModel", {**_KV2, "num_local_experts": 4}),
    "hf.XLMRoberta": hf("XLMRobertaConfig", "XLMRobertaModel", {"max_position_embeddings": 66}),
    "hf.MPNet": hf("MPNetConfig", "MPNetModel"),
    "hf.Whisper": hf(
        "WhisperConfig",
        "WhisperModel",
        {
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "num_mel_bins": 8,
            "max_source_positions": 8,
            "vocab_size": 1000,
            "pad_token_id": 0,
            "decoder_start_token_id": 1,
        },
        {},
        "whisper",
    ),
    "hf.CLIPVision": hf("CLIPVisionConfig", "CLIPVisionModel", small=SMALL_VISION, kind="pixels"),
    "hf.Swin": hf(
        "SwinConfig",
        "SwinModel",
        {
            "image_size": 32,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 2],
            "window_size": 4,
        },
        {},
        "pixels",
    ),
    "hf.ConvNext": hf(
        "ConvNextConfig",
        "ConvNextModel",
        {"image_size": 32, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]},
        {},
        "pixels",
    ),
    "hf.Beit": hf("BeitConfig", "BeitModel", small=SMALL_VISION, kind="pixels"),
    "hf.Wav2Vec2": hf(
        "Wav2Vec2Config",
        "Wav2Vec2Model",
        {
            "conv_dim": (32, 32),
            "conv_stride": (5, 2),
            "conv_kernel": (10, 3),
            "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 4,
        },
        {k: v for k, v in SMALL_TEXT.items() if k not in ("vocab_size", "max_position_embeddings")},
        "audio",
    ),
    "hf.Mamba": hf(
        "MambaConfig",
        "MambaModel",
        {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000, "state_size": 8},
        {},
    ),
}


# --- one model, in its own process ------------------------------------------------------


def _first(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple | list) else out


def _relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Largest difference over all the tensors relative to their largest entry (NaN where
    NaN is in one and not the other)."""
    if any(bool(g.isnan().any()) != bool(w.isnan().any()) for g, w in zip(got, want, strict=True)):
        return math.nan
    top = max(float(w.abs().max()) for w in want)
    return max(
        float((g.float() - w.float()).abs().max()) for g, w in zip(got, want, strict=True)
    ) / max(top, 1e-30)


def build(name: str) -> Built:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                torch.nn.init.normal_(p, std=0.02)
    return model, inputs


def _counts(backend) -> dict:
    fb = backend.CACHE.fallbacks
    return {
        "graphs": len(backend.CACHE.items),
        "uncompiled": len(fb),
        "reasons": sorted(set(fb))[:3],
        "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
        "failed_calls": len(backend.CACHE.failed_calls),
    }


def _in(dtype: torch.dtype, xs, device: str = "cpu") -> list[torch.Tensor]:
    return [x.to(device, dtype) if x.is_floating_point() else x.to(device) for x in xs]


def infer(name: str, device: str, dtype: torch.dtype) -> dict:
    """bfloat16: eager CPU's float32 output is the answer, and eager CPU's bfloat16 error
    against it the measure of what the dtype costs."""
    from saturn import backend

    model, inputs = build(name)
    with torch.no_grad():
        want = _first(model(*inputs))
        theirs = _first(copy.deepcopy(model).to(dtype)(*_in(dtype, inputs)))
    mine = copy.deepcopy(model).to(device, dtype)
    compiled = torch.compile(mine, backend="saturn")
    t = time.perf_counter()
    with torch.no_grad():
        got = _first(compiled(*_in(dtype, inputs, device))).cpu()
    row = {"first_s": round(time.perf_counter() - t, 1), **_counts(backend)}
    row["error"] = _relative([got], [want])
    if dtype != torch.float32:
        row["eager_error"] = _relative([theirs], [want])
    return row


def _steps(model, inputs, compile_fn) -> tuple[list[torch.Tensor], list[torch.Tensor], list]:
    """Two SGD steps; the losses, the first step's gradients, the parameters after."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def loss_of(*xs):
        loss = _first(model(*xs)).float().square().mean()
        return loss / loss.detach(), loss.detach()  # a step of one size whatever the scale

    step = loss_of if compile_fn is None else compile_fn(loss_of)
    update = opt.step if compile_fn is None else compile_fn(opt.step)
    losses, grads = [], None
    for _ in range(2):
        opt.zero_grad()
        scaled, loss = step(*inputs)
        scaled.backward()
        if grads is None:
            grads = [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]
        update()
        losses.append(loss.cpu().reshape(1))
    return losses, grads, [p.detach().cpu() for p in model.parameters()]


def train(name: str, device: str) -> dict:
    from saturn import backend

    model, inputs = build(name)
    want = _steps(copy.deepcopy(model), inputs, None)
    mine = copy.deepcopy(model).to(device)
    t = time.perf_counter()
    got = _steps(
        mine, tuple(x.to(device) for x in inputs), lambda f: torch.compile(f, backend="saturn")
    )
    row = {"two_steps_s": round(time.perf_counter() - t, 1), **_counts(backend)}
    if len(got[1]) != len(want[1]):
        row["gradients"] = f"{len(got[1])} parameters have a gradient, eager's {len(want[1])}"
    for key, g, w in zip(("loss", "grad", "param"), got, want, strict=True):
        row[f"{key}_error"] = _relative(g, w) if len(g) == len(w) else math.nan
    row["error"] = max(row["loss_error"], row["grad_error"], row["param_error"])
    return row


def child(name: str, device: str, training: bool, dtype: torch.dtype) -> dict:
    import saturn  # noqa: F401  (registers the device and the backend)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    row = {"model": name, **(train(name, device) if training else infer(name, device, dtype))}
    tol = 1e-4 if device == "saturn:0" else 1e-3
    if dtype != torch.float32:  # twice what eager's own bfloat16 differs by (the zoo's bar)
        tol = 2 * max(row["eager_error"], 1e-3)
    row["correct"] = bool(row["error"] <= tol) and "gradients" not in row  # NaN: False
    row["ok"] = row["correct"] and row["uncompiled"] == 0 and row["failed_calls"] == 0
    return row


def run(name: str, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--device", a.device, "--dtype", a.dtype]
    cmd += ["--training"] if a.training else []
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "ok": False, "failure": f"timed out after {a.timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("ROW "):
            return {**json.loads(line[4:]), "wall_s": round(time.time() - t)}
    if p.returncode < 0:
        return {"model": name, "ok": False, "failure": f"killed by signal {-p.returncode}"}
    tail = [ln for ln in p.stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    return {"model": name, "ok": False, "failure": tail[0][-400:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--training", action="store_true")
    ap.add_argument("--device", default="saturn:0")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default=None, help="also append the rows to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.training and a.dtype != "float32":
        ap.error("--training checks float32 steps")
    if a.child:
        row = child(a.child, a.device, a.training, getattr(torch, a.dtype))
        print("ROW " + json.dumps(row), flush=True)
        return
    names = [n for n in MODELS if not a.names or any(n.startswith(p) for p in a.names)]
    rows = []
    out = open(a.json, "a") if a.json else None  # appended row by row
    with ThreadPoolExecutor(a.jobs) as pool:
        for r in pool.map(lambda n: run(n, a), names):
            rows.append(r)
            print(json.dumps(r), flush=True)
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
    bad = [r for r in rows if not r["ok"]]
    mode = "training" if a.training else f"inference, {a.dtype}"
    print(f"{len(rows) - len(bad)}/{len(rows)} ok ({mode} on {a.device})")
    for r in bad:
        print(
            "  not ok:",
            r["model"],
            r.get("failure")
            or {
                k: r.get(k) for k in ("error", "uncompiled", "reasons", "failed_calls", "gradients")
            },
        )


if __name__ == "__main__":
    main()
