"""Written-out attention in real models: Hugging Face BERT-base and GPT-2 (small) with their
eager attention (``matmul * scaling + mask``, softmax, ``matmul``), float32 (TF32 off),
compiled by saturn without and with the attention pattern (``rewrites=["attention"]``,
decision 0119) against eager and Inductor (default mode) on CUDA, in one process.

What is timed: wall time of one forward call (no_grad, eval) plus a device synchronize,
median of REPEATS calls after warm-up, ms. Correct = relative error <= 1e-3 against eager
CUDA's last hidden state (the zoo's float32 bar). "kernels" = the attention kernels in
saturn's program (one per layer when the pattern fires).

    python bench/written_attention.py [--size tiny|full] [--only bert gpt2]
"""

from __future__ import annotations

import argparse
import time

import torch
from timing import median_us  # bench/timing.py (this script's folder)

import saturn  # noqa: F401
from saturn import backend

GPU = "saturn:1"
REPEATS = 20


def build(name: str, size: str):
    import transformers as tf

    full = size == "full"
    torch.manual_seed(0)
    if name == "bert":
        small = dict(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
        )
        cfg = tf.BertConfig(**({} if full else small), attn_implementation="eager")
        model = tf.BertModel(cfg)
    else:
        small = dict(n_embd=64, n_layer=2, n_head=4)
        cfg = tf.GPT2Config(**({} if full else small), use_cache=False)
        cfg._attn_implementation = "eager"
        model = tf.GPT2Model(cfg)
    b, s = (8, 512) if full else (2, 16)
    ids = torch.randint(0, 1000, (b, s), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(b, s, dtype=torch.long)
    pad[1, s // 2 :] = 0  # one padded sequence: the mask is not all zeros
    return model.eval(), (ids, pad)  # called as model(ids, attention_mask=pad)


def attention_kernels() -> int:
    prog = list(backend.CACHE.items.values())[-1].compiled.program
    return sum(
        k.kind == "custom" and k.attrs["name"].startswith("saturn::attention") for k in prog.kernels
    )


def timed(fn, args, sync) -> tuple[float, float, torch.Tensor]:
    """First call's seconds, median call ms, the output."""
    with torch.no_grad():
        t0 = time.perf_counter()
        out = fn(args[0], attention_mask=args[1]).last_hidden_state
        sync()
        first = time.perf_counter() - t0
        ms = median_us(lambda: fn(args[0], attention_mask=args[1]), sync, REPEATS) / 1e3
    return first, ms, out


def row(name: str, size: str) -> list[str]:
    model, args = build(name, size)
    cuda_args = [a.cuda() for a in args]
    cuda_model = model.cuda()
    cuda_sync = torch.cuda.synchronize
    _, eager_ms, want = timed(cuda_model, cuda_args, cuda_sync)
    torch._dynamo.reset()
    ind = torch.compile(cuda_model, dynamic=False)
    ind_first, ind_ms, got = timed(ind, cuda_args, cuda_sync)
    ind_err = ((got - want).norm() / want.norm()).item()
    sat_model = model.to(GPU)
    sat_args = [a.to(GPU) for a in args]

    def sat_sync():
        torch.saturn.synchronize(GPU)

    cells = []
    for rewrites in ([], ["attention"]):
        torch._dynamo.reset()
        fn = torch.compile(
            sat_model, backend="saturn", options={"rewrites": rewrites}, dynamic=False
        )
        first, ms, got = timed(fn, sat_args, sat_sync)
        err = ((got.cpu() - want.cpu()).norm() / want.cpu().norm()).item()
        cells.append((first, ms, err, attention_kernels()))
    (f0, m0, e0, _), (f1, m1, e1, k1) = cells
    return [
        name,
        f"{eager_ms:.2f}",
        f"{ind_ms:.2f}",
        f"{m0:.2f}",
        f"{m1:.2f}",
        f"{ind_ms / m1:.2f}",
        f"{m0 / m1:.2f}",
        str(k1),
        f"{e0:.1e} / {e1:.1e} / {ind_err:.1e}",
        f"{f0:.1f} / {f1:.1f} / {ind_first:.1f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="full", choices=["tiny", "full"])
    ap.add_argument("--only", nargs="*", default=["bert", "gpt2"])
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    head = [
        "model",
        "eager ms",
        "Inductor ms",
        "saturn ms",
        "saturn+attention ms",
        "x Inductor",
        "x saturn",
        "kernels",
        "rel. error (saturn / +attention / Inductor)",
        "first call s (saturn / +attention / Inductor)",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in a.only:
        print("| " + " | ".join(row(name, a.size)) + " |", flush=True)


if __name__ == "__main__":
    main()
