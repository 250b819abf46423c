"""One training step of a zoo model (``bench/zoo.py --training``): forward, a loss (the mean
square of the first output, in float32; its gradient divided by its value), backward and an
SGD step, all compiled by saturn (the forward with its loss, whose backward comes with it,
and the optimizer's step), against the same step in eager and compiled by Inductor.

The model stays in eval mode with gradients on (no dropout, batch norm's running
statistics): two processes draw no common random numbers, so a step with dropout could not
be compared. What is compared: the losses of two steps (the second sees the first's
update) and the norm of every parameter's gradient after the first, as one vector whose
largest difference is taken relative to its largest entry (the forward check's measure).

The reference runs in a process of its own that never imports saturn: on a GPU it is CUDA
autograd, which a process that imported saturn cannot run yet (issue 33). It builds the
same seeded model, prints one ``REF {json}`` line and takes the zoo's slots as a model of
its own (built and compiled beside the others, timed alone).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

LR = 1e-3


class Step:
    """One training step: zero the gradients (set to None, PyTorch's default), the loss and
    its backward, the update. The loss is the mean square of the model's first output
    (``first``: ``zoo._first``) in float32, returned as it is, and back-propagated over its
    own detached value: an update of the same size whatever the output's scale (a deep
    random network's is not small: ResNet-152's first loss was 2.2e9, and a step on it
    gave NaN in eager itself). ``compile`` (``torch.compile`` with a backend; None: eager)
    takes the forward with its loss (the backward with it) and the optimizer's step: the
    zoo's training mode compiles the whole step, for saturn and for Inductor alike."""

    def __init__(self, model, opt, first, compile=None):
        def loss_of(*inputs):
            loss = first(model(*inputs)).float().square().mean()
            return loss / loss.detach(), loss.detach()

        self.model, self.opt = model, opt
        self.loss_of = loss_of if compile is None else compile(loss_of)
        self.update = opt.step if compile is None else compile(opt.step)

    def __call__(self, inputs) -> torch.Tensor:
        """One step on ``inputs``; the loss before the update."""
        self.opt.zero_grad()
        scaled, loss = self.loss_of(*inputs)
        scaled.backward()
        self.update()
        return loss


def measures(step: Step, inputs, sync) -> tuple[list[float], float]:
    """Two steps' losses and the first step's gradient norms (one vector), with the first
    step's wall time (compile included for a compiled step)."""
    t = time.perf_counter()
    loss1 = step(inputs)
    sync()
    took = time.perf_counter() - t
    norms = [
        0.0 if p.grad is None else p.grad.detach().to("cpu", torch.float64).norm().item()
        for p in step.model.parameters()
    ]
    loss2 = step(inputs)
    sync()
    return [loss1.item(), loss2.item(), *norms], took


def error(got: list[float], want: list[float]) -> float:
    """The largest difference relative to the reference's largest entry (nan if any is)."""
    scale = max((abs(w) for w in want), default=0.0) or 1e-30
    diffs = [abs(g - w) for g, w in zip(got, want, strict=True)]
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0) / scale


def timed_steps(step: Step, inputs, sync, repeats: int) -> float:
    """Median wall time of a synchronized step."""
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        step(inputs)
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def start_reference(script: str, name: str, device: str, dtype: str, size: str, baselines: str):
    """The reference process for one model (``script --reference NAME ...``), started now;
    its result is read with ``reference_result``."""
    cmd = [sys.executable, script, "--reference", name, "--device", device]
    cmd += ["--dtype", dtype, "--size", size, "--baselines", baselines]
    # a plain PyTorch process: no out-of-tree device loaded behind its back either
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def reference_result(proc: subprocess.Popen, timeout: float | None = None) -> dict:
    out, err = proc.communicate(timeout=timeout)
    line = next((x for x in out.splitlines() if x.startswith("REF ")), None)
    if line is None:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        raise RuntimeError(f"the reference process failed: {tail}")
    return json.loads(line[4:])


@contextlib.contextmanager
def _phase(what: str):
    """Name the part of the reference an exception came from (its last line is reported)."""
    try:
        yield
    except Exception as e:
        raise RuntimeError(f"{what}: {type(e).__name__}: {e}".replace("\n", " ")) from e


def reference(zoo, name: str, device: str, dtype_name: str, size: str, baselines: str) -> dict:
    """What the reference process computes: eager's float32 measures (and the dtype's, with
    their error against float32), eager's step time and, on a GPU with ``baselines`` all,
    Inductor's first step and step time. ``zoo`` is bench/zoo.py (its models and slots)."""
    assert "saturn" not in sys.modules, "the reference must not import saturn"
    gpu = device != "saturn:0"
    dev = "cuda" if gpu else "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    dtype = getattr(torch, dtype_name)
    out: dict = {}
    shared = contextlib.ExitStack()
    shared.enter_context(zoo._slot(exclusive=False))
    model, inputs = zoo.build(name, size)
    if "saturn" in sys.modules:  # a library probing for a package found one of bench/'s modules
        raise RuntimeError(
            f"building {name} imported saturn: CUDA autograd would fail here (decision 0069)"
        )
    m32, x32 = zoo.moved(model, inputs, dev, torch.float32)
    with _phase("eager float32 steps"):
        step32 = Step(m32, torch.optim.SGD(m32.parameters(), lr=LR), zoo._first)
        out["want32"], _ = measures(step32, x32, sync)
    m_e, x_e = zoo.moved(model, inputs, dev, dtype)
    step_e = Step(m_e, torch.optim.SGD(m_e.parameters(), lr=LR), zoo._first)
    with _phase(f"eager {dtype_name} steps"):
        out["eager"], _ = measures(step_e, x_e, sync)
    out["eager_error"] = error(out["eager"], out["want32"])
    ind = None
    if gpu and baselines in ("all", "autotune"):  # training: the default mode only
        m_i, x_i = zoo.moved(model, inputs, dev, dtype)
        opt_i = torch.optim.SGD(m_i.parameters(), lr=LR)
        shared.close()
        try:  # its first step alone, as saturn's is
            with zoo._slot(exclusive=True):
                ind = Step(m_i, opt_i, zoo._first, torch.compile)
                _, out["inductor_first_s"] = measures(ind, x_i, sync)
        except Exception as e:
            ind = None
            out["inductor_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    shared.close()
    if baselines != "none":
        with zoo._slot(exclusive=True), _phase("timed eager steps"):
            out["eager_s"] = timed_steps(step_e, x_e, sync, zoo.REPEATS)
            if ind is not None:
                out["inductor_s"] = timed_steps(ind, x_i, sync, zoo.REPEATS)
    return out


def saturn_compile(fn):
    return torch.compile(fn, backend="saturn", dynamic=False)


def run(zoo, name: str, device: str, dtype_name: str, size: str, repeats: int, baselines: str):
    """One model's training row: saturn's step (first step, graphs, host ops, time) and how
    its measures compare with the reference process's."""
    import saturn  # noqa: F401
    from saturn import backend

    row: dict = {"model": name, "device": device, "dtype": dtype_name, "size": size}
    row["training"] = True
    proc = start_reference(zoo.__file__, name, device, dtype_name, size, baselines)
    gpu = device != "saturn:0"
    sync = (lambda: torch.saturn.synchronize(device)) if gpu else (lambda: None)
    shared = contextlib.ExitStack()
    shared.enter_context(zoo._slot(exclusive=False))
    model, inputs = zoo.build(name, size)
    m_s, x_s = zoo.moved(model, inputs, device, getattr(torch, dtype_name))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    before_fb, failed = len(backend.CACHE.fallbacks), len(backend.CACHE.failed_calls)
    before_graphs = set(backend.CACHE.items)
    opt = torch.optim.SGD(m_s.parameters(), lr=LR)
    compiled = Step(m_s, opt, zoo._first, saturn_compile)
    shared.close()
    try:  # alone: the first step times library candidates (zoo._slot)
        with zoo._slot(exclusive=True):
            got, row["first_call_s"] = measures(compiled, x_s, sync)
    except Exception as e:
        proc.kill()
        row.update(correct=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        return row
    new, stats = zoo.graph_stats(backend, before_graphs, before_fb)
    row.update(stats)
    with zoo._slot(exclusive=True):
        row["saturn_s"] = timed_steps(compiled, x_s, sync, repeats)
    row["failed_calls"] = backend.CACHE.failed_calls[failed:][:3]
    row["replays"] = sum(
        cg.recipe.runner.replays for cg in new if getattr(cg.recipe, "runner", None)
    )
    try:
        ref = reference_result(proc)
    except RuntimeError as e:
        row.update(correct=False, error=str(e))
        return row
    for k in ("eager_s", "inductor_s", "inductor_first_s", "inductor_error"):
        if k in ref:
            row[k] = ref[k]
    row["eager_error"] = ref["eager_error"]
    fp32 = dtype_name == "float32"
    row["error"] = error(got, ref["eager"] if fp32 else ref["want32"])
    # float32: 1e-4 against the CPU, 1e-3 against CUDA (its products' order differs);
    # halves: no more than twice eager's own distance from float32
    tol = (1e-3 if gpu else 1e-4) if fp32 else 2 * max(ref["eager_error"], 1e-3)
    row["correct"] = bool(row["error"] <= tol)  # False for nan
    return row


def main_reference(zoo, argv_name: str, device: str, dtype: str, size: str, baselines: str):
    """``zoo.py --reference NAME``: print the reference's ``REF`` line."""
    print("REF " + json.dumps(reference(zoo, argv_name, device, dtype, size, baselines)))
